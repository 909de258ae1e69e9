"""The async front door against a real server: a gate that outlives live-stream windows
resumes from its last event, and no token ever reaches a log line, an error or a repr."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from tollgate import AsyncClient, NotFound, RunTerminal
from tollgate.operator import AsyncOperator

from .conftest import Server
from .proxy import CuttingProxy
from .transports import RecordingTransport


async def test_a_gate_resumes_across_windows(server: Server) -> None:
    """The server ends each live-stream response after its window (2 s here); the gate
    reopens it with the last id it read and still gets the decision."""
    port = int(server.url.rsplit(":", 1)[1])
    proxy = CuttingProxy(port).start()  # counts, never cuts
    try:
        async with (
            AsyncClient(proxy.url, token=server.agent_token) as client,
            AsyncOperator(server.url, server.operator_token) as op,
        ):
            run = await client.create_run(owner="alice")
            pending: list[str] = []
            seen: list[dict[str, Any]] = []
            gate = asyncio.create_task(
                run.gate("web_fetch", on_pending=pending.append, on_event=seen.append)
            )
            deadline = time.monotonic() + 20
            while len(proxy.streams) < 2:  # the first window has ended
                assert time.monotonic() < deadline, "no second stream"
                await asyncio.sleep(0.05)
            assert not gate.done()
            assert len(pending) == 1
            await run.append({"type": "agent.message", "text": "still here"})
            answer = await op.approve(run.run_id, pending[0], scope="once")
            assert answer.state == "approved"
            decision = await asyncio.wait_for(gate, 20)
    finally:
        proxy.stop()
    assert decision.approved and decision.decided_by == "alice"
    first, second = proxy.streams[0], proxy.streams[1]
    assert not first.cut and first.last_event_id == "2"  # after the card's own event
    assert second.last_event_id == (first.last_whole_id or "2")
    types = [e["type"] for e in seen]
    assert types.count("tool.approval_resolved") == 1
    assert "agent.message" in types


async def test_tokens_never_reach_logs_errors_or_reprs(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    recorder = RecordingTransport()
    async with AsyncClient(server.url, token=server.agent_token, transport=recorder) as client:
        run = await client.create_run(owner="alice")
        recorder.inject = [("/events", 503, "0")]
        await run.append({"type": "agent.message"})
        await run.complete()
        with pytest.raises(RunTerminal) as ended:
            await run.append({"type": "agent.message"})
        with pytest.raises(NotFound) as missing:
            await run.approval("nope")
        shown = " ".join(
            [
                caplog.text,
                str(ended.value),
                repr(ended.value),
                str(missing.value),
                repr(run),
                repr(client),
            ]
        )
    for secret in (server.agent_token, run.token, server.operator_token):
        assert secret not in shown
    assert "retrying" in caplog.text  # the retry was logged, without its token
