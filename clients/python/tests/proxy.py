"""A loopback TCP proxy in front of ``tollgate serve`` that breaks the live stream.

One request per connection (it adds ``Connection: close`` to each request head). For a
live-stream request (``GET …/stream``) it records the ``Last-Event-ID`` the client sent
and, while it has cuts left, closes the connection once ``cut_after`` bytes of the
answer have gone through — wherever that falls, often mid-frame — noting the id of the
last whole frame it let through. With ``stream_status`` it answers every live-stream
request itself with that status instead (a gateway without the streaming route).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from dataclasses import dataclass, field


@dataclass
class StreamConnection:
    """One live-stream request through the proxy."""

    last_event_id: str | None
    #: The id of the last whole frame forwarded to the client.
    last_whole_id: str | None = None
    cut: bool = False
    forwarded: int = 0


@dataclass
class CuttingProxy:
    upstream_port: int
    cut_after: int = 1200
    max_cuts: int = 0
    stream_status: int | None = None
    streams: list[StreamConnection] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    cuts: int = 0
    port: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> CuttingProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        self._thread.join(10)

    def cut_count(self) -> int:
        with self._lock:
            return self.cuts

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            head = await client_r.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            client_w.close()
            return
        text = head.decode("latin-1")
        request_line = text.split("\r\n", 1)[0]
        with self._lock:
            self.requests.append(request_line)
        is_stream = request_line.startswith("GET ") and "/stream" in request_line.split(" ")[1]
        conn: StreamConnection | None = None
        if is_stream:
            m = re.search(r"(?im)^last-event-id:\s*(\S+)\s*$", text)
            conn = StreamConnection(m.group(1) if m else None)
            with self._lock:
                self.streams.append(conn)
            if self.stream_status is not None:
                client_w.write(
                    f"HTTP/1.1 {self.stream_status} Not Found\r\ncontent-length: 0\r\n"
                    "connection: close\r\n\r\n".encode()
                )
                await client_w.drain()
                client_w.close()
                return
        lines = [
            line for line in text.split("\r\n")[:-2] if not line.lower().startswith("connection:")
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
            try:
                while data := await client_r.read(65536):
                    up_w.write(data)
                    await up_w.drain()
            except (ConnectionError, OSError):
                pass

        async def downward() -> None:
            seen = b""
            try:
                while data := await up_r.read(65536):
                    if conn is not None:
                        with self._lock:
                            cutting = self.cuts < self.max_cuts
                        if cutting and conn.forwarded + len(data) >= self.cut_after:
                            data = data[: max(self.cut_after - conn.forwarded, 0)]
                            conn.cut = True
                        conn.forwarded += len(data)
                        seen += data
                        # Whole frames end with a blank line; note the last one's id.
                        for frame in re.findall(rb"(?:^|\n)((?:[^\n]+\n)+)\n", seen):
                            m = re.search(rb"(?m)^id: ?(\d+)\s*$", frame)
                            if m:
                                conn.last_whole_id = m.group(1).decode()
                        seen = seen[seen.rfind(b"\n\n") + 2 :] if b"\n\n" in seen else seen
                    client_w.write(data)
                    await client_w.drain()
                    if conn is not None and conn.cut:
                        with self._lock:
                            self.cuts += 1
                        return
            except (ConnectionError, OSError):
                pass

        down = asyncio.ensure_future(downward())
        up = asyncio.ensure_future(upward())
        await down
        up.cancel()
        for w in (client_w, up_w):
            with contextlib.suppress(ConnectionError, OSError):
                w.close()
