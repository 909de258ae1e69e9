"""A loopback TCP proxy in front of ``tollgate serve`` that breaks WebSocket connections.

Plain requests go through one per connection (``Connection: close`` added), except
``GET /api/live``, answered ``{"websocket_url": null}`` when ``advertise`` is off, and
the SSE stream, answered ``stream_status`` when that is set. A
WebSocket upgrade (``GET /api/ws``) is refused with ``ws_status`` when that is set;
otherwise its bytes go through both ways, and the server's frames are read one by one:
while it has cuts left, the proxy closes a connection partway through its
``cut_every``-th event frame (half of the frame sent); while it has drops left, it
leaves out every ``drop_every``-th event frame (the stream stays a valid WebSocket
stream, the client sees a sequence skip ahead).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field


@dataclass
class WsProxy:
    upstream_port: int
    advertise: bool = True
    ws_status: int | None = None
    stream_status: int | None = None
    cut_every: int = 0
    max_cuts: int = 0
    drop_every: int = 0
    max_drops: int = 0
    requests: list[str] = field(default_factory=list)
    cuts: int = 0
    drops: int = 0
    #: WebSocket connections opened through the proxy.
    upgrades: int = 0
    port: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> WsProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        self._thread.join(10)

    def paths(self) -> list[str]:
        with self._lock:
            return [r.split(" ")[1].split("?")[0] for r in self.requests]

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _answer(self, w: asyncio.StreamWriter, status: int, body: bytes) -> None:
        w.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body
        )
        await w.drain()
        w.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            head = await client_r.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            client_w.close()
            return
        text = head.decode("latin-1")
        request_line = text.split("\r\n", 1)[0]
        path = request_line.split(" ")[1].split("?")[0]
        with self._lock:
            self.requests.append(request_line)
        websocket = path == "/api/ws"
        if path == "/api/live" and not self.advertise:
            await self._answer(client_w, 200, b'{"websocket_url":null,"sse":true}')
            return
        if path.endswith("/stream") and self.stream_status is not None:
            await self._answer(client_w, self.stream_status, b'{"error":"no such route"}')
            return
        if websocket and self.ws_status is not None:
            await self._answer(client_w, self.ws_status, b'{"error":"no such route"}')
            return
        if not websocket:
            lines = [
                line
                for line in text.split("\r\n")[:-2]
                if not line.lower().startswith("connection:")
            ]
            head = ("\r\n".join([*lines, "connection: close"]) + "\r\n\r\n").encode("latin-1")
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        up_w.write(head)
        await up_w.drain()

        async def upward() -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await client_r.read(65536):
                    up_w.write(data)
                    await up_w.drain()

        async def plain() -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await up_r.read(65536):
                    client_w.write(data)
                    await client_w.drain()

        async def frames() -> None:
            with contextlib.suppress(ConnectionError, OSError, asyncio.IncompleteReadError):
                answer = await up_r.readuntil(b"\r\n\r\n")
                client_w.write(answer)
                await client_w.drain()
                if b" 101 " not in answer.split(b"\r\n", 1)[0]:
                    # A refused upgrade: its body too, as the server sent it.
                    length = 0
                    for line in answer.decode("latin-1").split("\r\n")[1:]:
                        name, _, value = line.partition(":")
                        if name.strip().lower() == "content-length":
                            length = int(value.strip())
                    if length:
                        client_w.write(await up_r.readexactly(length))
                        await client_w.drain()
                    return
                with self._lock:
                    self.upgrades += 1
                events = 0
                while True:
                    first = await up_r.readexactly(2)
                    size = first[1] & 0x7F
                    ext = b""
                    if size == 126:
                        ext = await up_r.readexactly(2)
                        size = int.from_bytes(ext, "big")
                    elif size == 127:
                        ext = await up_r.readexactly(8)
                        size = int.from_bytes(ext, "big")
                    payload = await up_r.readexactly(size)
                    frame = first + ext + payload
                    is_event = first[0] & 0x0F == 1 and b'"id":' in payload
                    if is_event:
                        events += 1
                        with self._lock:
                            cut = (
                                self.cut_every > 0
                                and events % self.cut_every == 0
                                and self.cuts < self.max_cuts
                            )
                            drop = (
                                not cut
                                and self.drop_every > 0
                                and events % self.drop_every == 0
                                and self.drops < self.max_drops
                            )
                            self.cuts += cut
                            self.drops += drop
                        if cut:
                            client_w.write(frame[: len(frame) // 2])
                            await client_w.drain()
                            return
                        if drop:
                            continue
                    client_w.write(frame)
                    await client_w.drain()

        down = asyncio.ensure_future(frames() if websocket else plain())
        up = asyncio.ensure_future(upward())
        await down
        up.cancel()
        for w in (client_w, up_w):
            with contextlib.suppress(ConnectionError, OSError):
                w.close()
