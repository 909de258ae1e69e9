"""The execution guard against a real server: evidence by what actually happened, and
an ambiguous outcome that is never tried again."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tollgate import (
    Client,
    Decision,
    NotExecuted,
    OutcomeUnknown,
    Run,
    ToolDenied,
)
from tollgate.operator import Operator

from .conftest import Server
from .test_gate import Background, pending_card
from .transports import RecordingTransport


class KilledTarget:
    """A tool endpoint that takes each request and dies before answering."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.received.append(conn.recv(65536))
                conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def operator(server: Server) -> Iterator[Operator]:
    with Operator(server.url, server.operator_token) as op:
        yield op


def approved(run: Run, op: Operator, tool: str, **kw: Any) -> Decision:
    gate = Background(lambda: run.gate(tool, **kw))
    card = pending_card(op, run.run_id)
    op.approve(run.run_id, card["request_id"])
    decision: Decision = gate.join()
    assert decision.approved
    return decision


def test_a_response_is_confirmed_and_the_hook_runs(server: Server, operator: Operator) -> None:
    with Client(server.url, token=server.agent_token) as client:
        run = client.create_run(owner="alice", budget={"tools": {"web_fetch": 2}})
        started: list[str] = []
        run.on_tool_execution_started(started.append)
        decision = approved(run, operator, "web_fetch", arguments={"url": "https://x.test"})
        with run.execute(decision) as ex:
            assert started == ["web_fetch"]
            ex.dispatch()
            ex.record({"http_status": 200})
        assert (ex.evidence, ex.state) == ("confirmed", "completed")
        record = run.mutation(decision.tool_call_id, decision.approval_id)
        assert record.state == "completed"
        assert record.result == {"http_status": 200}
        assert (record.schema, record.tool_name) == ("mutation_outcome/v1", "web_fetch")
        types = [e["type"] for e in run.events(0, 1000).events]
        assert types.count("tool_execution_started") == 1
        assert types.count("tool_execution") == 1


def test_failing_before_dispatch_is_not_sent(server: Server, operator: Operator) -> None:
    with Client(server.url, token=server.agent_token) as client:
        run = client.create_run(owner="alice", budget={"tools": {"web_fetch": 1}})
        decision = approved(run, operator, "web_fetch")
        with pytest.raises(ValueError), run.execute(decision) as ex:
            raise ValueError("could not build the request")
        assert (ex.evidence, ex.state) == ("not_sent", "not_executed")
        assert run.mutation(decision.tool_call_id, decision.approval_id).state == "not_executed"


def test_denied_decisions_and_spent_budgets_start_nothing(
    server: Server, operator: Operator
) -> None:
    with Client(server.url, token=server.agent_token) as client:
        run = client.create_run(owner="alice", budget={"tools": {"web_fetch": 1}})
        gate = Background(lambda: run.gate("web_fetch"))
        card = pending_card(operator, run.run_id)
        operator.deny(run.run_id, card["request_id"])
        denied: Decision = gate.join()
        with pytest.raises(ToolDenied), run.execute(denied):
            raise AssertionError("a denied call must not run")
        first = approved(run, operator, "web_fetch")
        with run.execute(first) as ex:
            ex.dispatch()
        assert ex.state == "completed"
        started: list[str] = []
        run.on_tool_execution_started(started.append)
        second = approved(run, operator, "web_fetch")
        with pytest.raises(NotExecuted) as refused, run.execute(second):
            raise AssertionError("over budget")
        assert refused.value.reason == "budget_exhausted"
        assert refused.value.status == 409 and refused.value.code is not None
        assert started == ["web_fetch"]  # the start was announced before admission


def test_an_ambiguous_outcome_is_never_retried(server: Server, operator: Operator) -> None:
    """The tool's transport dies after dispatch: the attempt settles ambiguous
    (outcome_unknown), and trying it again — the same attempt, or a fresh approval of
    the same tool call — is refused by the server with OutcomeUnknown, once, with no
    request sent again to the tool."""
    target = KilledTarget()
    recorder = RecordingTransport()
    try:
        with Client(server.url, token=server.agent_token, transport=recorder) as client:
            run = client.create_run(owner="alice", budget={"tools": {"charge_card": 3}})
            args = {"amount": 42}
            decision = approved(
                run,
                operator,
                "charge_card",
                arguments=args,
                tool_call_id="call-7",
                approval_id="approval-1",
            )
            with pytest.raises(httpx.RemoteProtocolError), run.execute(decision) as ex:
                ex.dispatch()
                httpx.post(f"http://127.0.0.1:{target.port}/charge", json=args, timeout=5)
            assert (ex.evidence, ex.state) == ("ambiguous", "outcome_unknown")
            assert len(target.received) == 1
            record = run.mutation("call-7", "approval-1")
            assert record.state == "outcome_unknown"
            assert record.error["code"] == "transport"

            # The same attempt again: refused, never sent.
            before = len(recorder.paths("POST", "/tool-calls/call-7/start"))
            with pytest.raises(OutcomeUnknown) as again, run.execute(decision):
                raise AssertionError("an ambiguous call must not run again")
            assert again.value.state == "outcome_unknown"
            assert len(recorder.paths("POST", "/tool-calls/call-7/start")) == before + 1

            # A fresh approval of the same tool call: the server refuses it (409).
            fresh = approved(
                run,
                operator,
                "charge_card",
                arguments=args,
                tool_call_id="call-7",
                approval_id="approval-2",
            )
            before = len(recorder.sent)
            with pytest.raises(OutcomeUnknown) as blocked, run.execute(fresh):
                raise AssertionError("an ambiguous call must not run again")
            assert blocked.value.status == 409
            assert blocked.value.code == "conflict"
            assert blocked.value.request_id
            assert blocked.value.approval_id == "approval-1"
            assert [p for _, p, _ in recorder.sent[before:]] == [
                f"/api/runs/{run.run_id}/tool-calls/call-7/start"
            ]
            assert len(target.received) == 1
            events = run.events(0, 1000).events
            executed = [e for e in events if e["type"] == "tool_execution"]
            assert [e["execution_status"] for e in executed] == ["executed"]
            assert executed[0]["mutation_outcome"] == "outcome_unknown"
    finally:
        target.close()


def test_async_guard_and_dispatch_once(server: Server, operator: Operator) -> None:
    """The async guard: a second dispatch of one attempt is refused locally."""
    import anyio

    from tollgate import AsyncClient, ConfigError

    with Client(server.url, token=server.agent_token) as client:
        run = client.create_run(owner="alice", budget={"tools": {"web_fetch": 1}})
        decision = approved(run, operator, "web_fetch")

    async def main() -> str | None:
        async with AsyncClient(server.url, token=server.agent_token) as ac:
            arun = ac.run(run.run_id, run.token)
            async with arun.execute(decision) as ex:
                await ex.dispatch()
                with pytest.raises(ConfigError):
                    await ex.dispatch()
                ex.record({"http_status": 204})
            return ex.state

    assert anyio.run(main) == "completed"


def test_a_refused_start_settles_nothing(server: Server, operator: Operator) -> None:
    """One process starts and dispatches the call, then dies before settling. Another
    holder of the same decision starts it again: refused (AlreadyDispatched), and
    leaving its guard with an exception settles nothing — the record stays
    ``dispatched`` (the deadline settles it ``outcome_unknown``), never ``not_sent``."""
    import anyio

    from tollgate import AlreadyDispatched, AsyncClient, ConfigError

    with Client(server.url, token=server.agent_token) as client:
        run = client.create_run(owner="alice", budget={"tools": {"web_fetch": 1}})
        decision = approved(run, operator, "web_fetch")

    async def first_process() -> None:
        async with AsyncClient(server.url, token=server.agent_token) as ac:
            ex = ac.run(run.run_id, run.token).execute(decision)
            await ex.start()
            await ex.dispatch()
            # …and the process dies here, before it could settle.

    async def second_process(recorder: RecordingTransport) -> tuple[str | None, str]:
        async with AsyncClient(server.url, token=server.agent_token, transport=recorder) as ac:
            arun = ac.run(run.run_id, run.token)
            ex = arun.execute(decision)
            with pytest.raises(AlreadyDispatched):
                await ex.start()
            await ex.finish(RuntimeError("the tool was never called here"))
            with pytest.raises(ConfigError):
                await ex.dispatch()
            record = await arun.mutation(decision.tool_call_id, decision.approval_id)
            return ex.evidence, record.state

    anyio.run(first_process)
    recorder = RecordingTransport()
    evidence, state = anyio.run(second_process, recorder)
    assert (evidence, state) == (None, "dispatched")
    assert recorder.paths("POST", "/settle") == []
    # The blocking guard: a refused start leaves the block unentered and unsettled.
    with Client(server.url, token=server.agent_token) as client:
        again = client.run(run.run_id, run.token)
        with pytest.raises(AlreadyDispatched), again.execute(decision):
            raise AssertionError("a refused start must not run the block")
        assert again.mutation(decision.tool_call_id, decision.approval_id).state == "dispatched"


SECRET = "sk-live-0123456789abcdef"


def test_exception_text_never_reaches_the_record(server: Server, operator: Operator) -> None:
    """An exception's message (a URL with a key in it) is not recorded: the facts are a
    fixed code and the exception's type; a message only when the caller wrote one."""
    from tollgate import SendFailed

    url = f"https://api.example.test/v1/charge?api_key={SECRET}"
    with Client(server.url, token=server.agent_token) as client:
        run = client.create_run(owner="alice", budget={"tools": {"charge": 3}})

        after = approved(run, operator, "charge", tool_call_id="after")
        with pytest.raises(ConnectionResetError), run.execute(after) as ex:
            ex.dispatch()
            raise ConnectionResetError(f"connection reset by peer while POST {url}")
        assert (ex.evidence, ex.state) == ("ambiguous", "outcome_unknown")

        before = approved(run, operator, "charge", tool_call_id="before")
        with pytest.raises(ValueError), run.execute(before) as ex:
            raise ValueError(f"cannot build {url}")
        assert (ex.evidence, ex.state) == ("not_sent", "not_executed")

        worded = approved(run, operator, "charge", tool_call_id="worded")
        with pytest.raises(SendFailed), run.execute(worded) as ex:
            ex.dispatch()
            try:
                raise OSError(f"reset: {url}")
            except OSError as e:
                raise SendFailed("the charge API reset the connection") from e
        assert ex.state == "outcome_unknown"

        records = {
            call: run.mutation(call, d.approval_id)
            for call, d in (("after", after), ("before", before), ("worded", worded))
        }
        assert records["after"].error == {"code": "transport", "type": "ConnectionResetError"}
        assert records["before"].error == {"code": "not_sent", "type": "ValueError"}
        assert records["worded"].error == {
            "code": "transport",
            "type": "OSError",
            "message": "the charge API reset the connection",
        }
        events = run.events(0, 1000).events
        assert any(e["type"] == "tool_execution" for e in events)
        shown = json.dumps(events) + json.dumps([vars(r) for r in records.values()])
        assert SECRET not in shown and "api.example.test" not in shown


def test_facts_that_are_not_json_do_not_lose_the_outcome(
    server: Server, operator: Operator
) -> None:
    """A response came back and its facts are not JSON (a datetime, a cycle): the call
    still settles ``confirmed`` → ``completed``, the facts replaced by a stub."""
    import datetime

    with Client(server.url, token=server.agent_token) as client:
        run = client.create_run(owner="alice", budget={"tools": {"web_fetch": 2}})
        first = approved(run, operator, "web_fetch", tool_call_id="dated")
        with run.execute(first) as ex:
            ex.dispatch()
            ex.record({"http_status": 200, "at": datetime.datetime.now(datetime.timezone.utc)})
        assert (ex.evidence, ex.state) == ("confirmed", "completed")
        record = run.mutation("dated", first.approval_id)
        assert record.result == {"code": "facts_unserializable"}

        second = approved(run, operator, "web_fetch", tool_call_id="cyclic")
        cycle: dict[str, Any] = {"http_status": 422}
        cycle["self"] = cycle
        with run.execute(second) as ex:
            ex.dispatch()
            ex.record(error=cycle)
        assert (ex.evidence, ex.state) == ("confirmed", "completed")
        record = run.mutation("cyclic", second.approval_id)
        assert record.error == {"code": "facts_unserializable"}


class _RenamingTransport(httpx.AsyncHTTPTransport):
    """Answers as the real server does, but every card read names its decider
    ``policy:night-shift`` (a name the server itself refuses to mint into a decision)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        answer = await super().handle_async_request(request)
        if request.method == "GET" and "/approval-requests/" in request.url.path:
            await answer.aread()
            body = json.loads(answer.content)
            if body.get("decided_by"):
                body["decided_by"] = "policy:night-shift"
            return httpx.Response(
                answer.status_code,
                headers={"content-type": "application/json"},
                content=json.dumps(body).encode(),
            )
        return answer


def test_only_the_cards_flag_makes_a_decision_automatic(server: Server, operator: Operator) -> None:
    """A card whose decider reads ``policy:…`` but which the server does not flag
    ``auto_approved`` is a human's decision: not ``auto``, and its guard is on the ledger."""
    with Client(server.url, token=server.agent_token) as client:
        run = client.create_run(owner="alice", budget={"tools": {"web_fetch": 1}})
        first = approved(run, operator, "web_fetch", request_id="card-p")
        assert first.auto is False
    with Client(server.url, token=server.agent_token, transport=_RenamingTransport()) as renamed:
        # The same gate again reads the decided card (through the renaming transport).
        again = renamed.run(run.run_id, run.token).gate("web_fetch", request_id="card-p")
        assert again.approved and again.decided_by == "policy:night-shift"
        assert again.auto is False
        assert renamed.run(run.run_id, run.token).execute(again).inner.ledgered
