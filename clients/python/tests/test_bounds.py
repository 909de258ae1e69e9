"""What a broken or hostile server cannot make the client do: wait without end for an
answer that trickles in, read a body or a live-stream line without bound, take a
keep-alive-only stream for a silent one, or hand back an answer of the wrong shape as if
it were right. Scripted servers on loopback (tests/fake.py) give those answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import anyio
import httpx
import pytest

from tollgate import (
    AsyncClient,
    ClientConfig,
    RetryPolicy,
    TransportError,
    UnexpectedAnswer,
)
from tollgate._sse import MAX_FRAME_DATA, MAX_LINE

from .fake import FakeServer, Request, head, hold, send_json

RUN = "run-fake"
CARD = "card-1"
ARMED_AT = 2
RESOLVED = (
    f"id: {ARMED_AT + 1}\nevent: tool.approval_resolved\ndata: "
    + json.dumps(
        {
            "sequence": ARMED_AT + 1,
            "type": "tool.approval_resolved",
            "requestId": CARD,
            "approved": True,
            "decidedBy": "alice",
            "scope": "once",
        }
    )
    + "\n\n"
).encode()

StreamScript = Callable[[int, asyncio.StreamWriter], Awaitable[None]]


def stream_head() -> bytes:
    return head(200, {"content-type": "text/event-stream", "cache-control": "no-cache"})


def gate_server(stream: StreamScript) -> FakeServer:
    """A server with one pending card (``CARD``) on ``RUN``; the n-th live-stream
    request (1, 2, …) is answered by ``stream(n, writer)``."""
    streams = 0

    async def handle(req: Request, writer: asyncio.StreamWriter) -> None:
        nonlocal streams
        if req.method == "POST" and req.path.endswith("/approval-requests"):
            armed = {
                "run_id": RUN,
                "request_id": CARD,
                "display_id": "A-1",
                "state": "pending",
                "sequence": ARMED_AT,
            }
            await send_json(writer, 201, armed)
        elif req.method == "GET" and req.path.endswith(f"/approval-requests/{CARD}"):
            card = {
                "run_id": RUN,
                "request_id": CARD,
                "display_id": "A-1",
                "tool_name": "web_fetch",
                "tool_call_id": CARD,
                "approval_id": CARD,
                "state": "pending",
                "created_at": "2026-01-01T00:00:00Z",
                "expires_at": "2026-01-01T00:05:00Z",
            }
            await send_json(writer, 200, card)
        elif req.method == "GET" and req.path.endswith("/stream"):
            streams += 1
            await stream(streams, writer)
        else:
            await send_json(writer, 404, {"error": "no", "code": "not_found", "request_id": "f"})

    return FakeServer(handle)


async def resolved_stream(writer: asyncio.StreamWriter) -> None:
    writer.write(stream_head() + b"retry: 10\n\n" + RESOLVED)
    await writer.drain()
    await hold()


async def gate_on(server: FakeServer, config: ClientConfig) -> str:
    async with AsyncClient(server.url, token="t", config=config) as client:
        decision = await client.run(RUN, "run-token").gate("web_fetch", request_id=CARD)
        return decision.state


def stream_requests(server: FakeServer) -> list[str | None]:
    return [r.headers.get("last-event-id") for r in server.paths("/stream")]


@pytest.mark.parametrize(
    "broken",
    [
        # One line over the cap, its end never coming.
        b"data: " + b"a" * (MAX_LINE + 16),
        # Lines under the cap, one frame gathering more than its cap.
        (b"data: " + b"a" * (MAX_LINE // 2) + b"\n") * (MAX_FRAME_DATA // (MAX_LINE // 2) + 1),
    ],
    ids=["line", "frame"],
)
async def test_a_stream_over_its_bounds_is_dropped_and_resumed(broken: bytes) -> None:
    """A response that buffers past the parser's caps is dropped at once (not when it
    falls silent: here it never would) and the wait resumes from the same event."""

    async def stream(n: int, writer: asyncio.StreamWriter) -> None:
        if n > 1:
            return await resolved_stream(writer)
        writer.write(stream_head() + b"retry: 10\n\n")
        writer.write(broken)
        await writer.drain()
        while True:  # alive, and never a line end
            writer.write(b"a" * 1024)
            await writer.drain()
            await asyncio.sleep(0.05)

    with gate_server(stream) as server:
        with anyio.fail_after(20):
            state = await gate_on(server, ClientConfig(stream_stall=60.0))
    assert state == "approved"
    assert stream_requests(server) == [str(ARMED_AT), str(ARMED_AT)]


async def test_keep_alive_comments_keep_a_quiet_stream_open() -> None:
    """A stream that carries only keep-alives (no event, no id) for longer than
    ``stream_stall`` is alive: the gate stays on it until the resolution comes."""

    async def stream(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(stream_head() + b"retry: 10\n\n")
        for _ in range(16):
            writer.write(b": keep-alive\n\n")
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(RESOLVED)
        await writer.drain()
        await hold()

    with gate_server(stream) as server:
        with anyio.fail_after(20):
            state = await gate_on(server, ClientConfig(stream_stall=0.3))
    assert state == "approved"
    assert stream_requests(server) == [str(ARMED_AT)]


async def test_a_stream_refusal_that_trickles_is_bounded() -> None:
    """A refusal of the live stream whose body trickles in forever is read for at most
    ``request_timeout``; the gate then reconnects."""

    async def stream(n: int, writer: asyncio.StreamWriter) -> None:
        if n > 1:
            return await resolved_stream(writer)
        writer.write(head(503, {"content-type": "application/json", "content-length": "100000"}))
        while True:
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.05)

    with gate_server(stream) as server:
        with anyio.fail_after(20):
            state = await gate_on(server, ClientConfig(request_timeout=0.5, stream_stall=60.0))
    assert state == "approved"
    assert len(stream_requests(server)) == 2


async def test_an_answer_that_trickles_is_bounded_as_a_whole() -> None:
    """Each byte comes well within the read timeout, the whole never does: the attempt
    ends after ``request_timeout`` as a transport error."""

    async def handle(req: Request, writer: asyncio.StreamWriter) -> None:
        writer.write(head(201, {"content-type": "application/json", "content-length": "100000"}))
        while True:
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.05)

    config = ClientConfig(request_timeout=0.5, retry=RetryPolicy.none())
    with FakeServer(handle) as server:
        async with AsyncClient(server.url, token="t", config=config) as client:
            started = anyio.current_time()
            with anyio.fail_after(10), pytest.raises(TransportError) as failed:
                await client.create_run()
            assert anyio.current_time() - started < 5
    assert "timed out" in str(failed.value)


async def test_an_answer_over_the_body_cap_is_not_read() -> None:
    receipt = {"run_id": "run-1", "run_token": "tok", "sequence": 1, "pad": "x" * (9 << 20)}

    async def handle(req: Request, writer: asyncio.StreamWriter) -> None:
        await send_json(writer, 201, receipt)

    with FakeServer(handle) as server:
        async with AsyncClient(server.url, token="t") as client:
            with pytest.raises(UnexpectedAnswer) as big:
                await client.create_run()
    assert big.value.status == 201
    assert len(server.requests) == 1  # not retried


def answering(status: int, content: bytes, headers: dict[str, str]) -> httpx.MockTransport:
    return httpx.MockTransport(lambda req: httpx.Response(status, headers=headers, content=content))


async def test_every_http_failure_is_a_transport_error() -> None:
    """A body that cannot be decoded (say, broken gzip) is a transport failure like a
    reset connection, not an httpx exception."""
    transport = answering(
        201, b"not gzip at all", {"content-type": "application/json", "content-encoding": "gzip"}
    )
    config = ClientConfig(retry=RetryPolicy.none())
    async with AsyncClient(
        "http://tollgate.test", token="t", config=config, transport=transport
    ) as c:
        with pytest.raises(TransportError):
            await c.create_run()


@pytest.mark.parametrize(
    "body",
    [
        {"run_id": [], "run_token": "tok", "sequence": 1},
        {"run_id": "run-1", "run_token": None, "sequence": 1},
        {"run_id": "run-1", "run_token": "tok", "sequence": "1"},
    ],
)
async def test_answers_of_the_wrong_shape_are_unexpected(body: dict[str, object]) -> None:
    transport = answering(201, json.dumps(body).encode(), {"content-type": "application/json"})
    async with AsyncClient("http://tollgate.test", token="t", transport=transport) as c:
        with pytest.raises(UnexpectedAnswer):
            await c.create_run()


async def test_an_execution_answer_of_the_wrong_shape_is_unexpected() -> None:
    transport = answering(200, b'{"state": [1]}', {"content-type": "application/json"})
    async with AsyncClient("http://tollgate.test", token="t", transport=transport) as c:
        run = c.run("run-1", "tok")
        with pytest.raises(UnexpectedAnswer):
            await run.settle("call-1", "approval-1", "confirmed")
