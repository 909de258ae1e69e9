"""Gates against a real server: a human's decision reaches the waiting agent through
the live stream, across twenty cuts of it, or by polling where there is no stream."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tollgate import Client, ClientConfig, Decision, RunEnded
from tollgate.operator import Operator

from .conftest import Server
from .proxy import CuttingProxy


def wait_for(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Polls ``check`` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def operator(server: Server) -> Iterator[Operator]:
    with Operator(server.url, server.operator_token) as op:
        yield op


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with Client(server.url, token=server.agent_token) as c:
        yield c


class Background:
    """A function run on a thread; its result or exception collected."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.result = fn()
            except BaseException as e:  # handed to the test
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 60.0) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the background call did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def pending_card(op: Operator, run_id: str) -> dict[str, Any]:
    cards: list[dict[str, Any]] = wait_for("the card", lambda: op.pending(run_id))
    assert len(cards) == 1
    return cards[0]


def test_approved_gate_returns_the_decision(
    client: Client, operator: Operator, server: Server
) -> None:
    run = client.create_run(owner="alice", budget={"tools": {"web_fetch": 1}})
    gate = Background(
        lambda: run.gate(
            "web_fetch",
            url="https://example.com/docs",
            message="The agent wants to fetch a URL.",
            arguments={"url": "https://example.com/docs"},
        )
    )
    card = pending_card(operator, run.run_id)
    assert card["tool_name"] == "web_fetch"
    assert card["url"] == "https://example.com/docs"
    assert card["message"] == "The agent wants to fetch a URL."
    answer = operator.approve(run.run_id, card["request_id"], scope="tool")
    assert answer.state == "approved"
    decision: Decision = gate.join()
    assert decision.approved
    assert (decision.state, decision.scope, decision.decided_by) == ("approved", "tool", "alice")
    assert decision.request_id == card["request_id"]
    assert decision.arguments_hash == card["arguments_hash"]
    # Scope `tool` grants a policy: the next gate of that tool is approved at once.
    again = run.gate("web_fetch", url="https://example.com/other")
    assert again.approved and again.auto
    assert again.decided_by is not None and again.decided_by.startswith("policy:")
    assert operator.pending(run.run_id) == []


def test_denied_and_expired_gates(client: Client, operator: Operator) -> None:
    run = client.create_run(owner="alice")
    gate = Background(lambda: run.gate("shell", message="rm -rf build/"))
    card = pending_card(operator, run.run_id)
    operator.deny(run.run_id, card["request_id"])
    denied: Decision = gate.join()
    assert (denied.approved, denied.state, denied.decided_by) == (False, "denied", "alice")

    started = time.monotonic()
    expired = run.gate("shell", message="nobody answers", timeout=1)
    assert (expired.approved, expired.state) == (False, "expired")
    assert time.monotonic() - started < 15


def test_the_preview_is_shown_redacted_and_the_reason_recorded(
    client: Client, operator: Operator
) -> None:
    run = client.create_run(owner="alice")
    gate = Background(
        lambda: run.gate(
            "send_email",
            arguments={"to": "ops@example.com", "api_key": "sk-SECRET"},
            arguments_preview={"to": "ops@example.com", "api_key": "sk-SECRET"},
        )
    )
    card = pending_card(operator, run.run_id)
    assert card["arguments_preview"] == {"to": "ops@example.com", "api_key": "[redacted]"}
    answer = operator.deny(run.run_id, card["request_id"], reason="not this recipient")
    assert (answer.state, answer.decision_reason) == ("denied", "not this recipient")
    denied: Decision = gate.join()
    assert denied.state == "denied"
    # A repeat with another reason answers the first decision's.
    again = operator.approve(run.run_id, card["request_id"], reason="changed my mind")
    assert (again.state, again.decision_reason) == ("denied", "not this recipient")
    events = run.events().events
    resolved = [e for e in events if e["type"] == "tool.approval_resolved"]
    assert [e.get("decisionReason") for e in resolved] == ["not this recipient"]
    required = [e for e in events if e["type"] == "tool.approval_required"]
    assert required[0].get("argumentsPreview") == card["arguments_preview"]
    assert "sk-SECRET" not in repr(events)


def test_the_run_ending_ends_the_wait(client: Client, operator: Operator) -> None:
    run = client.create_run(owner="alice")
    gate = Background(lambda: run.gate("shell"))
    pending_card(operator, run.run_id)
    other = client.run(run.run_id, run.token)
    other.cancel(reason="shutting down")
    with pytest.raises(RunEnded):
        gate.join()


def test_twenty_cuts_resume_with_last_event_id(
    server: Server, client: Client, operator: Operator
) -> None:
    """The live stream is cut twenty times while the gate waits, mid-frame wherever the
    byte count falls: the gate resumes each time with the id of the last whole frame it
    read, sees every event once and in order, and returns the one decision."""
    port = int(server.url.rsplit(":", 1)[1])
    proxy = CuttingProxy(port, cut_after=1200, max_cuts=20).start()
    try:
        with Client(proxy.url, token=server.agent_token) as via_proxy:
            run = via_proxy.create_run(owner="alice")
            writer = client.run(run.run_id, run.token)
            seen: list[dict[str, Any]] = []
            gate = Background(lambda: run.gate("web_fetch", on_event=seen.append))
            card = pending_card(operator, run.run_id)
            # Events keep coming until the stream has been cut twenty times.
            written = 0
            deadline = time.monotonic() + 90
            while proxy.cut_count() < 20:
                assert time.monotonic() < deadline, f"only {proxy.cut_count()} cuts"
                writer.append({"type": "agent.message", "text": f"step {written} " + "x" * 100})
                written += 1
                time.sleep(0.01)
            # Decided once the gate listens again after the last cut, so the decision
            # reaches it on the resumed stream (not through the card read before it).
            wait_for("the 21st stream", lambda: len(proxy.streams) >= 21)
            decided = operator.approve(run.run_id, card["request_id"])
            assert decided.state == "approved"
            decision: Decision = gate.join()
            streams = list(proxy.streams)
    finally:
        proxy.stop()
    assert decision.approved and decision.request_id == card["request_id"]
    assert proxy.cuts == 20
    # Twenty cut responses, then the one that carried the resolution.
    assert len(streams) == 21
    assert not streams[-1].cut
    assert sum(1 for s in streams if s.cut) == 20
    for before, after in itertools.pairwise(streams):
        if before.cut:
            assert before.last_whole_id is not None
            assert after.last_event_id == before.last_whole_id, (before, after)
    assert all(s.last_event_id is not None for s in streams)
    # Every event after the card's, once each and in order, up to its resolution.
    sequences = [e["sequence"] for e in seen]
    assert sequences == list(range(sequences[0], sequences[0] + len(sequences)))
    assert seen[-1]["type"] == "tool.approval_resolved"
    assert seen[-1]["requestId"] == card["request_id"]
    assert sum(1 for e in seen if e["type"] == "agent.message") == written
    page = client.run(run.run_id, run.token).events(sequences[0] - 1, 1000)
    assert [e["sequence"] for e in page.events] == sequences


def test_polls_the_pages_where_the_stream_is_unavailable(
    server: Server, operator: Operator
) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    proxy = CuttingProxy(port, stream_status=404).start()
    try:
        config = ClientConfig(poll_interval=0.1)
        with Client(proxy.url, token=server.agent_token, config=config) as c:
            run = c.create_run(owner="alice")
            gate = Background(lambda: run.gate("web_fetch"))
            card = pending_card(operator, run.run_id)
            wait_for(
                "polling",
                lambda: sum(1 for r in proxy.requests if "/events?after=" in r) >= 2,
            )
            operator.deny(run.run_id, card["request_id"])
            decision: Decision = gate.join()
    finally:
        proxy.stop()
    assert decision.state == "denied"
    assert len(proxy.streams) == 1  # tried once, then polled
