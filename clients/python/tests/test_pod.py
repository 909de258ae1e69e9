"""The pod side: a PodGate serving Tollgate's forwarded decisions on loopback (uvicorn),
announcing its cards on the run; operators decide through Tollgate's HTTP routes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import uvicorn

from tollgate import AsyncClient
from tollgate.operator import AsyncOperator
from tollgate.pod import PodGate

from .conftest import Server, free_port


async def eventually(what: str, check: Callable[[], Awaitable[Any]], timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await check()
        if got:
            return got
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def test_forwarded_decisions_reach_the_pod(server: Server) -> None:
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    async with (
        AsyncClient(server.url, token=server.agent_token) as client,
        AsyncOperator(server.url, server.operator_token) as op,
    ):
        run = await client.create_run(owner="alice", execution_mode="pod", agenthost_origin=origin)
        assert run.agenthost_credential
        gate = PodGate(run.agenthost_credential).announce_through(run)
        pod = uvicorn.Server(
            uvicorn.Config(gate.app(), host="127.0.0.1", port=port, log_level="warning")
        )
        serving = asyncio.create_task(pod.serve())
        try:
            await eventually("the pod", lambda: asyncio.sleep(0, pod.started))

            async def listed(request_id: str) -> dict[str, Any] | None:
                for card in await op.pending(run.run_id):
                    if card["request_id"] == request_id:
                        return card
                return None

            # Approved with scope tool: the waiting call resumes, the bridge covers the next.
            pending = gate.arm("req-1", run.run_id, "web_fetch", url="https://example.com")
            card = await eventually("the announced card", lambda: listed("req-1"))
            assert (card["held_by"], card["tool_name"]) == ("pod", "web_fetch")
            decided = await op.approve(run.run_id, "req-1", scope="tool")
            assert (decided.state, decided.resolved) == ("approved", True)
            decision = await asyncio.wait_for(pending.wait(), 10)
            assert (decision.state, decision.scope, decision.auto) == ("approved", "tool", False)
            bridged = gate.arm("req-2", run.run_id, "web_fetch")
            assert bridged.decided is not None and bridged.decided.auto
            again = await op.approve(run.run_id, "req-1", scope="tool")
            assert again.state == "approved"  # a later click reads the same

            # Another tool still asks; a denial reaches it.
            shell = gate.arm("req-3", run.run_id, "shell", message="rm -rf build/")
            await eventually("the second card", lambda: listed("req-3"))
            denied = await op.deny(run.run_id, "req-3")
            assert denied.state == "denied"
            assert (await asyncio.wait_for(shell.wait(), 10)).state == "denied"

            # Expiring in the pod is announced: Tollgate ends its card too.
            short = gate.arm("req-4", run.run_id, "shell", timeout=1)
            await eventually("the third card", lambda: listed("req-4"))
            assert (await asyncio.wait_for(short.wait(), 10)).state == "expired"

            async def gone() -> bool:
                return await listed("req-4") is None

            await eventually("the expiry on Tollgate", gone)

            # The pod's routes: bearer credential checked; the card as served.
            async with httpx.AsyncClient(base_url=origin) as raw:
                body = {"runId": run.run_id, "requestId": "req-1", "scope": "once"}
                wrong = await raw.post(
                    "/tool-approvals", json=body, headers={"authorization": "Bearer nope"}
                )
                assert wrong.status_code == 401
                auth = {"authorization": f"Bearer {run.agenthost_credential}"}
                seen = await raw.get("/tool-approvals/req-1", headers=auth)
                assert seen.status_code == 200
                assert seen.json()["toolName"] == "web_fetch"
                assert seen.json()["state"] == "approved"
                unknown = await raw.post(
                    "/tool-denials", json={**body, "requestId": "nope"}, headers=auth
                )
                assert (unknown.status_code, unknown.json()["state"]) == (404, "unknown")
                other = await raw.post(
                    "/tool-denials",
                    json={**body, "requestId": "req-1", "toolName": "x"},
                    headers=auth,
                )
                assert other.status_code == 409
                late = await raw.post("/tool-denials", json=body, headers=auth)
                assert late.json()["applied"] is False and late.json()["state"] == "approved"

            events = (await run.events(0, 1000)).events
            resolved = [e["requestId"] for e in events if e["type"] == "tool.approval_resolved"]
            assert sorted(resolved) == ["req-1", "req-3", "req-4"]
            required = [e["requestId"] for e in events if e["type"] == "tool.approval_required"]
            assert required == ["req-1", "req-3", "req-4"]
        finally:
            pod.should_exit = True
            await asyncio.wait_for(serving, 10)


async def test_a_waiting_pod_card_beats_until_decided(server: Server) -> None:
    """While a pod card waits, its heartbeats reach the run's stream; none after the
    decision (the announcer stops once Tollgate recorded it)."""
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    async with (
        AsyncClient(server.url, token=server.agent_token) as client,
        AsyncOperator(server.url, server.operator_token) as op,
    ):
        run = await client.create_run(owner="alice", execution_mode="pod", agenthost_origin=origin)
        assert run.agenthost_credential
        gate = PodGate(run.agenthost_credential).announce_through(run).heartbeat_every(0.3)
        pod = uvicorn.Server(
            uvicorn.Config(gate.app(), host="127.0.0.1", port=port, log_level="warning")
        )
        serving = asyncio.create_task(pod.serve())
        try:
            await eventually("the pod", lambda: asyncio.sleep(0, pod.started))
            pending = gate.arm("beat-1", run.run_id, "web_fetch")

            async def types() -> list[str]:
                return [e["type"] for e in (await run.events(0, 1000)).events]

            async def beating() -> bool:
                return "tool.approval_pending" in await types()

            await eventually("a heartbeat", beating)
            assert (await op.approve(run.run_id, "beat-1")).state == "approved"
            assert (await asyncio.wait_for(pending.wait(), 10)).approved
            await eventually("the announcer to stop", lambda: asyncio.sleep(0, not gate._tasks))
            seen = await types()
            resolved = seen.index("tool.approval_resolved")
            assert "tool.approval_pending" not in seen[resolved:]
            assert seen.count("tool.approval_resolved") == 1
        finally:
            pod.should_exit = True
            await asyncio.wait_for(serving, 10)


async def test_pod_gate_rules() -> None:
    """The gate's own rules, as the Rust PodGate has them: a repeated decision with the
    same decisionId is applied again, another tool or an ended run applies nothing,
    `always` bridges reach every run of the pod, an abandoned card expires."""
    gate = PodGate("s3cret")
    assert gate.is_authorized("Bearer s3cret")
    for bad in (None, "", "Bearer ", "Bearer s3cre", "Basic s3cret", "s3cret"):
        assert not gate.is_authorized(bad)
    assert not PodGate("").is_authorized("Bearer ")

    first = gate.arm("r1", "run-1", "web_fetch")
    applied = gate.decide("run-1", "r1", approve=True, scope="always", decision_id="d-1")
    assert applied.status == 200 and applied.applied
    assert applied.body["scope"] == "always" and applied.body["expired"] is False
    assert (await first).state == "approved"
    repeat = gate.decide("run-1", "r1", approve=True, scope="always", decision_id="d-1")
    assert repeat.applied  # its first answer was lost: applied again
    other = gate.decide("run-1", "r1", approve=True, scope="always", decision_id="d-2")
    assert not other.applied and other.body["state"] == "approved"
    assert gate.deny("run-2", "r1").status == 404
    bridged = gate.arm("r2", "run-9", "web_fetch")  # `always`: any run of the pod
    assert bridged.decided is not None and bridged.decided.auto

    shell = gate.arm("r3", "run-1", "shell")
    assert gate.decide("run-1", "r3", approve=False, tool_name="web_fetch").status == 409
    gate.end_run("run-1")
    ended = gate.deny("run-1", "r3")
    assert (ended.status, ended.body["state"]) == (409, "pending")
    shell.cancel()  # nobody waits any more: it expires, no decision can apply
    card = gate.card("r3")
    assert card is not None and card["state"] == "expired"
    assert (await shell).state == "expired"
