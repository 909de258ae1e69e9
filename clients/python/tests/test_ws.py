"""Following runs over WebSocket against a real server: backlog, live events and the end
on one connection; every sequence once and in order across repeated cuts and lost
frames; refused credentials; SSE where no WebSocket is advertised or it cannot be
opened; a gate's decision arriving over WebSocket."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from typing import Any

import anyio
import pytest

from tollgate import (
    AsyncClient,
    AsyncRun,
    ClientConfig,
    Forbidden,
    LiveConnection,
    LiveEvent,
    Unauthorized,
    WsUnavailable,
)
from tollgate._ws import resolve
from tollgate.operator import AsyncOperator

from .conftest import Server
from .ws_proxy import WsProxy


def upstream(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


async def collect(live: LiveConnection, run_id: str, after: int = 0) -> list[LiveEvent]:
    out: list[LiveEvent] = []
    async with aclosing(live.follow(run_id, after)) as events:
        async for event in events:
            out.append(event)
    return out


async def writer(run: AsyncRun, count: int, batch: int = 1) -> None:
    """Appends ``count`` messages, ``batch`` per request, then completes the run."""
    written = 0
    while written < count:
        n = min(batch, count - written)
        await run.append(*[{"type": "agent.message", "text": f"m{written + i}"} for i in range(n)])
        written += n
        await asyncio.sleep(0)
    await run.complete()


def test_the_advertised_endpoint_resolves_against_the_base() -> None:
    assert resolve("http://127.0.0.1:8080", "/api/ws") == "ws://127.0.0.1:8080/api/ws"
    assert (
        resolve("https://api.example.com/prod/", "/api/ws") == "wss://api.example.com/prod/api/ws"
    )
    assert resolve("https://a.example", "wss://ws.example.com/live") == "wss://ws.example.com/live"
    assert resolve("https://a.example", "https://ws.example.com/x") == "wss://ws.example.com/x"
    assert resolve("https://a.example", "ftp://x") is None
    assert resolve("https://a.example", "not a url") is None


async def test_backlog_live_and_done_over_one_connection(server: Server) -> None:
    """Two runs on one connection: each one's backlog, then its live events, then its
    end; every sequence once, in order; nothing after the terminal event."""
    with WsProxy(upstream(server)) as proxy:
        async with AsyncClient(proxy.url, token=server.agent_token) as client:
            a = await client.create_run(owner="alice")
            b = await client.create_run(owner="alice")
            for run in (a, b):
                await run.append(*[{"type": "agent.message", "text": str(i)} for i in range(5)])
            async with client.live() as live:
                follow_a = asyncio.create_task(collect(live, a.run_id))
                follow_b = asyncio.create_task(collect(live, b.run_id, after=3))
                await asyncio.gather(writer(a, 20), writer(b, 7))
                got_a, got_b = await asyncio.wait_for(asyncio.gather(follow_a, follow_b), 60)
                assert live.connections == 1
            page_a = await a.events(0, 1000)
            page_b = await b.events(0, 1000)
    assert proxy.upgrades == 1
    assert [e.sequence for e in got_a] == [e["sequence"] for e in page_a.events]
    assert [e.sequence for e in got_a] == list(range(1, len(got_a) + 1))
    assert [e.sequence for e in got_b] == [
        e["sequence"] for e in page_b.events if e["sequence"] > 3
    ]
    for got, page in ((got_a, page_a), (got_b, page_b)):
        assert got[-1].sequence == page.events[-1]["sequence"]
        assert got[-1].type == "run_completed"
        by_seq = {e["sequence"]: e for e in page.events}
        assert all(e.data == by_seq[e.sequence] for e in got)  # as replay serves them
    assert sum(1 for e in got_a if e.type == "agent.message") == 25


@pytest.mark.parametrize("cuts,drops", [(12, 0), (8, 6)])
async def test_every_sequence_once_across_cuts_and_lost_frames(
    server: Server, cuts: int, drops: int
) -> None:
    """Three hundred appends while the proxy cuts the connection mid-frame ``cuts``
    times and leaves out ``drops`` frames: the follower reconnects and resubscribes after
    the last sequence it handed out, and sees 1..=N exactly once and in order."""
    with WsProxy(
        upstream(server), cut_every=23, max_cuts=cuts, drop_every=17, max_drops=drops
    ) as proxy:
        async with AsyncClient(proxy.url, token=server.agent_token) as client:
            run = await client.create_run(owner="alice")
            async with client.live() as live:
                follow = asyncio.create_task(collect(live, run.run_id))
                await writer(run, 300, batch=3)
                got = await asyncio.wait_for(follow, 120)
                connections, skips = live.connections, live.skips
            last = (await run.events(0, 1000)).events[-1]["sequence"]
    assert [e.sequence for e in got] == list(range(1, last + 1))
    assert got[-1].type == "run_completed"
    assert proxy.cuts == cuts and proxy.drops == drops
    assert connections == cuts + 1
    if drops:
        assert skips >= drops


async def test_a_run_follows_itself_with_its_token_across_cuts(server: Server) -> None:
    """``run.follow()`` with the run token (``?run_id=``), cut five times while the run
    lives: it reconnects each time and sees every sequence once and in order."""
    with WsProxy(upstream(server), cut_every=9, max_cuts=5) as proxy:
        async with AsyncClient(proxy.url, token=server.agent_token) as client:
            run = await client.create_run(owner="alice")
            await run.append(*[{"type": "agent.message", "text": str(i)} for i in range(40)])
            seen: list[int] = []

            async def follow() -> None:
                async with aclosing(run.follow()) as events:
                    async for event in events:
                        seen.append(event["sequence"])

            task = asyncio.create_task(follow())
            # More events while the follower is cut and reconnects; the run ends only
            # after its fifth cut (a run token of an ended run connects no more).
            for i in range(60):
                await run.append({"type": "agent.message", "text": f"m{i}"})
                await asyncio.sleep(0.01)
            with anyio.fail_after(60):
                while proxy.cuts < 5:
                    await asyncio.sleep(0.05)
            await run.complete()
            await asyncio.wait_for(task, 60)
            last = (await run.events(0, 1000)).events[-1]["sequence"]
    assert seen == list(range(1, last + 1))
    assert proxy.cuts == 5
    assert all("run_id=" in r for r in proxy.requests if r.split(" ")[1].startswith("/api/ws"))
    assert "/stream" not in " ".join(proxy.paths())


async def test_a_follow_cut_as_its_run_ends_reads_the_rest_from_the_pages(
    server: Server,
) -> None:
    """The connection is cut and the run ends before the follower reconnects: the run
    token's upgrade is refused (409 ``run_terminal``), and the follow reads the rest from
    the event pages instead of retrying for ever; every sequence once and in order."""
    with WsProxy(upstream(server), cut_every=5, max_cuts=1) as proxy:
        async with AsyncClient(proxy.url, token=server.agent_token) as client:
            run = await client.create_run(owner="alice")
            seen: list[int] = []

            async def follow() -> None:
                async with aclosing(run.follow()) as events:
                    async for event in events:
                        seen.append(event["sequence"])

            await run.append(*[{"type": "agent.message", "text": str(i)} for i in range(3)])
            task = asyncio.create_task(follow())
            with anyio.fail_after(30):
                while len(seen) < 4:  # run_started and the three messages
                    await asyncio.sleep(0.02)
            # The fifth event frame, the run's terminal event, is cut mid-frame.
            await run.complete()
            await asyncio.wait_for(task, 60)
            last = (await run.events(0, 1000)).events[-1]["sequence"]
    assert proxy.cuts == 1
    assert seen == list(range(1, last + 1))
    upgrades = [r for r in proxy.requests if r.split(" ")[1].startswith("/api/ws")]
    assert len(upgrades) == 2, upgrades  # the first, and the one refused: no retry loop
    assert any("/events?" in r for r in proxy.requests)


async def test_refused_credentials_are_errors_not_retries(server: Server) -> None:
    async with AsyncClient(server.url, token=server.agent_token) as client:
        run = await client.create_run(owner="alice")
        other = await client.create_run(owner="alice")
        url = await client._websocket_url()
        assert url is not None
        # A forged JWT: the upgrade is refused (401), once.
        forged = server.agent_token[:-4] + (
            "AAAA" if not server.agent_token.endswith("AAAA") else "BBBB"
        )
        async with LiveConnection(url, forged) as live:
            with pytest.raises(Unauthorized):
                await asyncio.wait_for(collect(live, run.run_id), 30)
            assert live.connections == 0
        # A run token opened for another run: refused at the upgrade (403).
        async with LiveConnection(url, run.token, run_id=other.run_id) as live:
            with pytest.raises(Forbidden):
                await asyncio.wait_for(collect(live, other.run_id), 30)
            assert live.connections == 0
        # A run token on its own run's connection, subscribing to another run: refused.
        async with LiveConnection(url, run.token, run_id=run.run_id) as live:
            with pytest.raises(Forbidden):
                await asyncio.wait_for(collect(live, other.run_id), 30)
            assert live.connections == 1
        # An agent token that is not the run's owner's agent sees nothing of it.
        stranger = server.token("someone-else", "agent")
        async with LiveConnection(url, stranger) as live:
            with pytest.raises((Forbidden, Unauthorized)) as refused:
                await asyncio.wait_for(collect(live, run.run_id), 30)
            assert live.connections == 1
        text = f"{refused.value!s} {refused.value!r}"
        assert stranger not in text and run.token not in text


@pytest.mark.parametrize("how", ["not_advertised", "upgrade_fails", "config_off"])
async def test_the_gate_falls_back_to_sse(server: Server, how: str) -> None:
    """No WebSocket advertised, an upgrade refused (404), or WebSocket turned off: the
    gate waits on the SSE stream and gets the decision there."""
    proxy = WsProxy(
        upstream(server),
        advertise=how != "not_advertised",
        ws_status=404 if how == "upgrade_fails" else None,
    )
    config = ClientConfig(websocket=how != "config_off")
    with proxy:
        async with (
            AsyncClient(proxy.url, token=server.agent_token, config=config) as client,
            AsyncOperator(server.url, server.operator_token) as op,
        ):
            run = await client.create_run(owner="alice")
            pending: list[str] = []
            gate = asyncio.create_task(run.gate("web_fetch", on_pending=pending.append))
            await until(lambda: "/stream" in " ".join(proxy.paths()))
            await op.approve(run.run_id, pending[0])
            decision = await asyncio.wait_for(gate, 30)
            # The discovery is learnt once per client.
            await client._websocket_url()
            assert client._ws_known == (how != "config_off")
    assert decision.approved
    paths = proxy.paths()
    assert paths.count("/api/live") == (0 if how == "config_off" else 1)
    assert paths.count("/api/ws") == (1 if how == "upgrade_fails" else 0)
    assert proxy.upgrades == 0


@pytest.mark.parametrize("sse", [True, False])
async def test_follow_falls_back_to_sse_then_pages(server: Server, sse: bool) -> None:
    """No WebSocket advertised: ``run.follow()`` reads the SSE stream; where that is not
    offered either (404), the event pages. The same events either way."""
    proxy = WsProxy(upstream(server), advertise=False, stream_status=None if sse else 404)
    with proxy:
        config = ClientConfig(poll_interval=0.05)
        async with AsyncClient(proxy.url, token=server.agent_token, config=config) as client:
            run = await client.create_run(owner="alice")
            await run.append({"type": "agent.message"})
            seen: list[dict[str, Any]] = []

            async def follow() -> None:
                async with aclosing(run.follow()) as events:
                    async for event in events:
                        seen.append(event)

            task = asyncio.create_task(follow())
            await until(lambda: len(seen) >= 2)
            await writer(run, 5)
            await asyncio.wait_for(task, 30)
            page = await run.events(0, 1000)
    assert seen == page.events
    assert [e["sequence"] for e in seen] == list(range(1, 9))
    assert seen[-1]["type"] == "run_completed"
    paths = proxy.paths()
    assert "/api/ws" not in paths
    streams = [p for p in paths if p.endswith("/stream")]
    assert len(streams) >= 1
    # Page reads: the test's own one, and the follower's where it polled.
    pages = [r for r in proxy.requests if r.startswith("GET ") and "/events?" in r]
    assert (len(pages) == 1) == sse


async def test_live_says_when_no_websocket_is_advertised(server: Server) -> None:
    with WsProxy(upstream(server), advertise=False) as proxy:
        async with AsyncClient(proxy.url, token=server.agent_token) as client:
            with pytest.raises(WsUnavailable):
                async with client.live():
                    pass


async def test_a_gate_resolves_over_websocket_across_cuts(server: Server) -> None:
    """The gate's wait follows the run over WebSocket (no SSE request at all); cut three
    times, it sees every event once and in order up to the card's resolution."""
    with WsProxy(upstream(server), cut_every=4, max_cuts=3) as proxy:
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
            await until(lambda: proxy.upgrades >= 1 and bool(pending))
            written = 0
            while proxy.cuts < 3:
                await run.append({"type": "agent.message", "text": f"step {written}"})
                written += 1
                await asyncio.sleep(0.01)
                assert written < 500, "the proxy never cut"
            await op.approve(run.run_id, pending[0])
            decision = await asyncio.wait_for(gate, 60)
    assert decision.approved and decision.decided_by == "alice"
    paths = proxy.paths()
    assert "/stream" not in " ".join(paths)
    assert paths.count("/api/live") == 1
    assert proxy.upgrades == 4  # the first connection and three reconnects
    sequences = [e["sequence"] for e in seen]
    assert sequences == list(range(sequences[0], sequences[0] + len(sequences)))
    assert seen[-1]["type"] == "tool.approval_resolved"
    assert sum(1 for e in seen if e["type"] == "agent.message") == written


async def until(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)
