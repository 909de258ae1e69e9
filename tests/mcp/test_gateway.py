"""`tollgate mcp proxy` from the outside: each scenario is an agent on the official MCP
SDK (stdio client) talking to the gateway, which runs a real upstream (mcp-server-git or
tollgate-mcp-echo), and an operator deciding its cards over HTTP. Each asserts on what
can be observed: the run's replayed events, the files the upstream changed (or did not),
the answers and errors the agent got."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from conftest import (
    ECHO,
    OPERATOR,
    TOLLGATE,
    Server,
    git,
    mcp_server_git,
    open_direct,
    open_gateway,
    text_of,
    types_of,
)

pytestmark = pytest.mark.anyio


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def for_request(events: list[dict[str, Any]], request_id: str) -> list[str]:
    """The types of the events that name this card or its ledger record, in order."""
    out = []
    for e in events:
        if request_id in (e.get("requestId"), e.get("tool_call_id")):
            out.append(e["type"])
    return out


class Call:
    """A tools/call running in the background of a task group; ``result`` once answered."""

    def __init__(self) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = anyio.Event()


def start_call(tg: Any, gw: Any, tool: str, arguments: dict[str, Any], **kw: Any) -> Call:
    call = Call()

    async def run() -> None:
        try:
            call.result = await gw.session.call_tool(tool, arguments, **kw)
        except Exception as e:
            call.error = e
        finally:
            call.done.set()

    tg.start_soon(run)
    return call


async def answered(call: Call, timeout: float = 15) -> Any:
    with anyio.fail_after(timeout):
        await call.done.wait()
    if call.error is not None:
        raise call.error
    return call.result


# 1 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("upstream", ["echo", "git"])
async def test_tools_list_passes_the_upstreams_tools_unchanged(server: Server, upstream: str) -> None:
    command = [str(ECHO)] if upstream == "echo" else mcp_server_git()
    async with open_direct(command) as direct:
        want = [t.model_dump(by_alias=True, exclude_none=True) for t in (await direct.list_tools()).tools]
        want_info = direct.server_info
    async with open_gateway(server, upstream=command) as gw:
        got = [t.model_dump(by_alias=True, exclude_none=True) for t in (await gw.session.list_tools()).tools]
        assert gw.session.server_info == want_info
        run = gw.run_id
    assert got == want
    names = {t["name"] for t in got}
    if upstream == "echo":
        assert names == {"echo", "append", "hang", "crash"}
        assert next(t for t in got if t["name"] == "echo")["annotations"] == {"readOnlyHint": True}
    else:
        assert {"git_status", "git_add", "git_commit", "git_log"} <= names
        add = next(t for t in got if t["name"] == "git_add")
        assert add["annotations"]["readOnlyHint"] is False
        assert "files" in add["inputSchema"]["properties"]
    events = await server.wait_event(run, lambda e: e["type"] == "run_completed")
    assert events
    evs = await server.events(run)
    # Listing decides nothing: no card, no call.
    assert "tool.approval_required" not in types_of(evs)
    started = of_type(evs, "mcp.session_started")[0]
    assert started["upstream"]["name"] == want_info.name


# 2 ------------------------------------------------------------------------------------


async def test_git_add_and_commit_ask_and_run_once_approved(server: Server, repo: Path) -> None:
    async with open_gateway(server, upstream=mcp_server_git()) as gw, anyio.create_task_group() as tg:
        add_args = {"repo_path": str(repo), "files": ["notes.txt"]}
        call = start_call(tg, gw, "git_add", add_args)
        (card,) = await server.wait_cards(gw.run_id)
        assert card["tool_name"] == gw.tool("git_add")
        # (The listing from every tenant's cards on DynamoDB has no preview; the event has.)
        (required,) = of_type(await server.events(gw.run_id), "tool.approval_required")
        assert required["requestId"] == card["request_id"]
        assert required["argumentsPreview"]["arguments"] == add_args
        # Nothing is staged while the card waits.
        await anyio.sleep(0.3)
        assert not call.done.is_set()
        assert git(repo, "diff", "--cached", "--name-only") == ""
        decided = await server.approve(card)
        assert decided["state"] == "approved" and decided["decided_by"] == OPERATOR
        result = await answered(call)
        assert not result.is_error, text_of(result)
        assert git(repo, "diff", "--cached", "--name-only").split() == ["notes.txt"]

        call = start_call(tg, gw, "git_commit", {"repo_path": str(repo), "message": "add notes"})
        (commit_card,) = await server.wait_cards(gw.run_id)
        assert commit_card["tool_name"] == gw.tool("git_commit")
        assert git(repo, "log", "-1", "--format=%s").strip() == "first"
        await server.approve(commit_card)
        result = await answered(call)
        assert not result.is_error, text_of(result)
        assert git(repo, "log", "-1", "--format=%s").strip() == "add notes"
        assert git(repo, "show", "--name-only", "--format=", "HEAD").split() == ["notes.txt"]

    events = await server.events(gw.run_id)
    for c in (card, commit_card):
        assert for_request(events, c["request_id"]) == [
            "tool.approval_required",
            "tool.approval_resolved",
            "tool_execution_started",
            "tool_execution",
        ]
        (resolved,) = [e for e in of_type(events, "tool.approval_resolved") if e["requestId"] == c["request_id"]]
        assert resolved["approved"] is True and resolved["decidedBy"] == OPERATOR and resolved["scope"] == "once"
        (done,) = [e for e in of_type(events, "tool_execution") if e["tool_call_id"] == c["tool_call_id"]]
        assert done["tool_name"] == c["tool_name"]
        assert (done["execution_status"], done["mutation_outcome"]) == ("executed", "completed")


# 3 ------------------------------------------------------------------------------------


async def test_a_denial_is_a_tool_error_with_the_reason_and_nothing_changes(server: Server, repo: Path) -> None:
    before = git(repo, "status", "--porcelain")
    async with open_gateway(server, upstream=mcp_server_git()) as gw, anyio.create_task_group() as tg:
        call = start_call(tg, gw, "git_add", {"repo_path": str(repo), "files": ["notes.txt"]})
        (card,) = await server.wait_cards(gw.run_id)
        decided = await server.deny(card, reason="not on a Friday")
        assert decided["state"] == "denied"
        result = await answered(call)
    assert result.is_error
    assert "not on a Friday" in text_of(result)
    assert OPERATOR in text_of(result)
    assert git(repo, "status", "--porcelain") == before == "?? notes.txt\n"
    events = await server.events(gw.run_id)
    assert for_request(events, card["request_id"]) == ["tool.approval_required", "tool.approval_resolved"]
    (resolved,) = of_type(events, "tool.approval_resolved")
    assert resolved["approved"] is False and resolved["decisionReason"] == "not on a Friday"
    assert "tool_execution_started" not in types_of(events)


# 4 ------------------------------------------------------------------------------------


async def test_a_card_nobody_answers_expires_and_the_call_is_not_made(server: Server, tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    async with open_gateway(server, "--timeout", "3") as gw:
        t0 = time.monotonic()
        result = await gw.session.call_tool("append", {"path": str(target), "line": "x"})
        waited = time.monotonic() - t0
    assert result.is_error
    assert "expired" in text_of(result)
    assert 2.5 <= waited < 15, waited
    assert not target.exists()
    events = await server.events(gw.run_id)
    (resolved,) = of_type(events, "tool.approval_resolved")
    assert resolved["expired"] is True and resolved["approved"] is False
    assert "tool_execution_started" not in types_of(events)


# 5 ------------------------------------------------------------------------------------

POLICY = """
[[rule]]
name = "echo is harmless"
tool = "echo"
decision = "allow"

[[rule]]
name = "no secrets"
tool = "append"
when = [{ pointer = "/path", regex = ".*secret.*" }]
decision = "deny"
message = "agents do not write secrets"
"""


async def test_policy_rules_allow_and_deny_without_a_card(server: Server, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    secret = tmp_path / "secret.txt"
    other = tmp_path / "other.txt"
    async with open_gateway(server, "--policy", str(policy)) as gw:
        allowed = await gw.session.call_tool("echo", {"text": "ping"})
        assert not allowed.is_error and text_of(allowed) == "ping"
        denied = await gw.session.call_tool("append", {"path": str(secret), "line": "hunter2"})
        assert denied.is_error
        assert "agents do not write secrets" in text_of(denied) and "no secrets" in text_of(denied)
        assert not secret.exists()
        events = await server.events(gw.run_id)
        assert "tool.approval_required" not in types_of(events)
        await server.wait_no_cards(gw.run_id)
        (ok,) = of_type(events, "mcp.call_allowed")
        assert (ok["tool"], ok["tool_name"], ok["rule"]) == ("echo", gw.tool("echo"), "echo is harmless")
        (no,) = of_type(events, "mcp.call_denied")
        assert (no["tool"], no["rule"], no["message"]) == ("append", "no secrets", "agents do not write secrets")
        # What no rule covers is still asked.
        async with anyio.create_task_group() as tg:
            call = start_call(tg, gw, "append", {"path": str(other), "line": "y"})
            (card,) = await server.wait_cards(gw.run_id)
            assert card["tool_name"] == gw.tool("append")
            await server.approve(card)
            assert not (await answered(call)).is_error
    assert other.read_text() == "y\n"


# 6 ------------------------------------------------------------------------------------


async def test_trusted_read_only_hints_allow_and_untrusted_ones_ask(server: Server, tmp_path: Path) -> None:
    async with open_gateway(server, "--trust-annotations") as gw:
        result = await gw.session.call_tool("echo", {"text": "trusted"})
        assert not result.is_error and text_of(result) == "trusted"
        events = await server.events(gw.run_id)
        assert "tool.approval_required" not in types_of(events)
        (ok,) = of_type(events, "mcp.call_allowed")
        assert ok["rule"] == "annotations"
        # A tool without the hint still asks.
        async with anyio.create_task_group() as tg:
            call = start_call(tg, gw, "append", {"path": str(tmp_path / "f"), "line": "z"})
            (card,) = await server.wait_cards(gw.run_id)
            assert card["tool_name"] == gw.tool("append")
            await server.deny(card)
            assert (await answered(call)).is_error
    assert not (tmp_path / "f").exists()

    async with open_gateway(server) as gw, anyio.create_task_group() as tg:
        call = start_call(tg, gw, "echo", {"text": "asked"})
        (card,) = await server.wait_cards(gw.run_id)
        assert card["tool_name"] == gw.tool("echo")
        assert "readOnly=true" in card["message"]
        await server.approve(card)
        result = await answered(call)
        assert text_of(result) == "asked"
    assert "mcp.call_allowed" not in types_of(await server.events(gw.run_id))


# 7 ------------------------------------------------------------------------------------


async def test_scope_tool_approves_the_next_call_of_the_tool_without_a_card(server: Server, tmp_path: Path) -> None:
    target = tmp_path / "log.txt"
    async with open_gateway(server) as gw:
        async with anyio.create_task_group() as tg:
            call = start_call(tg, gw, "append", {"path": str(target), "line": "one"})
            (card,) = await server.wait_cards(gw.run_id)
            decided = await server.approve(card, scope="tool")
            assert decided["scope"] == "tool"
            assert decided["grant"] == {"tool_name": gw.tool("append"), "scope": "tool"}
            assert not (await answered(call)).is_error
        # Other arguments, same tool: approved by the grant, no card.
        with anyio.fail_after(10):
            second = await gw.session.call_tool("append", {"path": str(target), "line": "two"})
        assert not second.is_error, text_of(second)
        await server.wait_no_cards(gw.run_id)
    assert target.read_text() == "one\ntwo\n"
    events = await server.events(gw.run_id)
    assert len(of_type(events, "tool.approval_required")) == 1
    (auto,) = of_type(events, "tool.auto_approved")
    assert (auto["toolName"], auto["scope"]) == (gw.tool("append"), "tool")


# 8 ------------------------------------------------------------------------------------


async def test_a_call_without_an_answer_is_outcome_unknown_until_reconciled(server: Server) -> None:
    async with open_gateway(server, "--call-timeout", "2") as gw:
        async with anyio.create_task_group() as tg:
            call = start_call(tg, gw, "hang", {})
            (card,) = await server.wait_cards(gw.run_id)
            await server.approve(card)
            result = await answered(call, timeout=20)
        assert result.is_error
        text = text_of(result)
        assert "outcome_unknown" in text and "Do not retry" in text
        m = re.search(r"tollgate reconcile (\S+) (\S+) (\S+) --observed", text)
        assert m, text
        run, tool_call_id, approval_id = m.groups()
        assert (run, tool_call_id) == (gw.run_id, card["tool_call_id"])
        events = await server.events(gw.run_id)
        (settled,) = of_type(events, "tool_execution")
        assert settled["mutation_outcome"] == "outcome_unknown"

        # The identical call is refused, without a card.
        again = await gw.session.call_tool("hang", {})
        assert again.is_error and "Refused" in text_of(again) and tool_call_id in text_of(again)
        await server.wait_no_cards(gw.run_id)
        assert len(of_type(await server.events(gw.run_id), "tool.approval_required")) == 1

        # An operator says it did not happen: the same call asks afresh.
        out = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [str(TOLLGATE), "reconcile", run, tool_call_id, approval_id, "--observed", "not_applied"],
                env=dict(os.environ, TOLLGATE_URL=server.url, TOLLGATE_TOKEN=server.operator_token),
                capture_output=True,
                text=True,
                timeout=30,
            )
        )
        assert out.returncode == 0, out.stderr
        reconciled = await server.wait_event(gw.run_id, lambda e: e["type"] == "tool_execution_reconciled")
        assert reconciled["tool_call_id"] == tool_call_id
        async with anyio.create_task_group() as tg:
            call = start_call(tg, gw, "hang", {})
            (fresh,) = await server.wait_cards(gw.run_id)
            assert fresh["request_id"] != card["request_id"]
            await server.deny(fresh, reason="enough")
            assert "enough" in text_of(await answered(call))
    assert len(of_type(await server.events(gw.run_id), "tool.approval_required")) == 2


# 9 ------------------------------------------------------------------------------------


async def test_cancelling_a_pending_call_withdraws_its_card(server: Server, tmp_path: Path) -> None:
    target = tmp_path / "never.txt"
    async with open_gateway(server) as gw:
        scope = anyio.CancelScope()

        async def call() -> None:
            with scope:
                await gw.session.call_tool("append", {"path": str(target), "line": "x"})

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            (card,) = await server.wait_cards(gw.run_id)
            scope.cancel()  # the SDK sends notifications/cancelled for the request
        resolved = await server.wait_event(
            gw.run_id, lambda e: e["type"] == "tool.approval_resolved" and e["requestId"] == card["request_id"]
        )
        assert resolved["reason"] == "withdrawn" and resolved["approved"] is False
        await server.wait_no_cards(gw.run_id)
        # The session goes on.
        assert {t.name for t in (await gw.session.list_tools()).tools} >= {"append"}
    assert not target.exists()
    assert "tool_execution_started" not in types_of(await server.events(gw.run_id))


# 10 -----------------------------------------------------------------------------------


async def test_twenty_concurrent_asks_are_each_answered_with_their_own_result(server: Server) -> None:
    n = 20
    async with open_gateway(server) as gw, anyio.create_task_group() as tg:
        calls = [start_call(tg, gw, "echo", {"text": f"message {i}"}) for i in range(n)]
        cards = await server.wait_cards(gw.run_id, n, timeout=30)
        assert len(cards) == n
        required = of_type(await server.events(gw.run_id), "tool.approval_required")
        assert sorted(e["argumentsPreview"]["arguments"]["text"] for e in required) == sorted(
            f"message {i}" for i in range(n)
        )
        async with anyio.create_task_group() as deciders:
            for c in cards:
                deciders.start_soon(server.approve, c)
        results = [await answered(c, timeout=30) for c in calls]
    assert [text_of(r) for r in results] == [f"message {i}" for i in range(n)]
    events = await server.events(gw.run_id)
    executed = of_type(events, "tool_execution")
    assert len(executed) == n
    assert {e["result"]["content"] for e in executed} == {f"message {i}" for i in range(n)}
    assert {e["tool_call_id"] for e in executed} == {c["tool_call_id"] for c in cards}


# 11 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["crash_tool", "sigkill"])
async def test_the_run_fails_when_the_upstream_dies(server: Server, how: str) -> None:
    async with open_gateway(server) as gw:
        run = gw.run_id
        if how == "sigkill":
            (echo_pid,) = gw.upstream_pids("tollgate-mcp-echo")
            os.kill(echo_pid, signal.SIGKILL)
        else:
            async with anyio.create_task_group() as tg:
                call = start_call(tg, gw, "crash", {})
                (card,) = await server.wait_cards(run)
                await server.approve(card)
                with anyio.fail_after(15):
                    await call.done.wait()
            # The agent hears of it: an error, or the session's end.
            assert call.error is not None or call.result.is_error
        failed = await server.wait_terminal(run)
        proxy = gw.proxy_pid
        with anyio.fail_after(10):
            while True:
                try:
                    proxy()
                except AssertionError:
                    break  # the proxy exited
                await anyio.sleep(0.1)
    assert failed["type"] == "run_failed", failed
    assert failed.get("reason") == "mcp_upstream_ended", failed


# 12 -----------------------------------------------------------------------------------


async def test_a_killed_proxys_card_still_expires_on_the_servers_timer(server: Server, tmp_path: Path) -> None:
    target = tmp_path / "never.txt"
    async with open_gateway(server, "--timeout", "3") as gw, anyio.create_task_group() as tg:
        call = start_call(tg, gw, "append", {"path": str(target), "line": "x"})
        (card,) = await server.wait_cards(gw.run_id)
        gw.kill_proxy()
        with anyio.fail_after(10):
            await call.done.wait()
        assert call.error is not None  # the connection closed under the call
        resolved = await server.wait_event(
            gw.run_id,
            lambda e: e["type"] == "tool.approval_resolved" and e["requestId"] == card["request_id"],
            timeout=20,
        )
    assert resolved["expired"] is True and resolved["approved"] is False
    await server.wait_no_cards(gw.run_id)
    assert not target.exists()


# 13 -----------------------------------------------------------------------------------


async def test_closing_stdin_completes_the_run(server: Server) -> None:
    async with open_gateway(server) as gw:
        assert (await gw.session.list_tools()).tools
        run = gw.run_id
        assert "run_completed" not in types_of(await server.events(run))
    # Leaving the client closes the proxy's stdin.
    ended = await server.wait_terminal(run)
    assert ended["type"] == "run_completed"
    evs = await server.events(run)
    assert types_of(evs)[:2] == ["run_started", "mcp.session_started"]
    assert evs[-1]["type"] == "run_completed"


# 13c: the session ends while an approved call is in flight upstream: the gateway settles
# it (outcome unknown: it was sent, no answer came) before the run completes, so the
# run's stream says so and the record is not left dispatched.


async def test_a_call_in_flight_when_the_session_ends_is_settled_before_the_run_completes(
    server: Server,
) -> None:
    async with open_gateway(server) as gw:
        async with anyio.create_task_group() as tg:
            start_call(tg, gw, "hang", {})
            (card,) = await server.wait_cards(gw.run_id)
            await server.approve(card)
            await server.wait_event(gw.run_id, lambda e: e["type"] == "tool_execution_started")
            # The agent gives up and leaves (after dispatch the cancel changes nothing).
            tg.cancel_scope.cancel()
        run = gw.run_id
    await server.wait_terminal(run)
    events = await server.events(run)
    assert types_of(events)[-2:] == ["tool_execution", "run_completed"], types_of(events)
    settled = events[-2]
    assert (settled["tool_call_id"], settled["mutation_outcome"]) == (card["tool_call_id"], "outcome_unknown")
    (record,) = (await anyio.to_thread.run_sync(lambda: server.request("GET", f"/api/runs/{run}/mutations")))[
        "mutations"
    ]
    assert record["state"] == "outcome_unknown"


# 14 -----------------------------------------------------------------------------------


async def test_progress_notifications_arrive_while_a_card_waits(server: Server) -> None:
    seen: list[tuple[float, float, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((time.monotonic(), value, message))

    async with open_gateway(server) as gw, anyio.create_task_group() as tg:
        t0 = time.monotonic()
        call = start_call(tg, gw, "echo", {"text": "slowly"}, progress_callback=progress)
        (card,) = await server.wait_cards(gw.run_id)
        with anyio.fail_after(7):
            while len(seen) < 2:
                await anyio.sleep(0.1)
        await server.approve(card)
        result = await answered(call)
    assert text_of(result) == "slowly"
    assert seen[0][0] - t0 < 6
    assert [v for _, v, _ in seen[:2]] == [1.0, 2.0]
    assert all(card["display_id"] in (m or "") for _, _, m in seen)


# 13b: a host stopping its servers (SIGTERM) while a card waits: the run completes and
# the card ends with it (reason run_ended); nothing runs.


async def test_sigterm_while_a_card_waits_completes_the_run_and_ends_the_card(server: Server) -> None:
    async with open_gateway(server) as gw, anyio.create_task_group() as tg:
        call = start_call(tg, gw, "echo", {"text": "never"})
        (card,) = await server.wait_cards(gw.run_id)
        os.kill(gw.proxy_pid(), signal.SIGTERM)
        with anyio.fail_after(10):
            await call.done.wait()
        ended = await server.wait_terminal(gw.run_id)
        resolved = await server.wait_event(
            gw.run_id, lambda e: e["type"] == "tool.approval_resolved" and e["requestId"] == card["request_id"]
        )
    assert ended["type"] == "run_completed"
    assert (resolved["approved"], resolved["expired"], resolved["reason"]) == (False, True, "run_ended")
    await server.wait_no_cards(gw.run_id)
    events = await server.events(gw.run_id)
    assert "tool_execution_started" not in types_of(events)
