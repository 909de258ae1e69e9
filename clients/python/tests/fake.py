"""A scripted HTTP server on a loopback port, for answers the real server never gives
(a trickling body, a huge one, a live stream that breaks its bounds).

One request per connection (every answer says ``connection: close``). The handler gets
each request and the connection's writer and answers however it likes, for as long as
it likes; :meth:`FakeServer.stop` ends whatever is still going on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Handler = Callable[[Request, asyncio.StreamWriter], Awaitable[None]]

_REASONS = {200: "OK", 201: "Created", 404: "Not Found", 503: "Service Unavailable"}


def head(status: int, headers: dict[str, str] | None = None) -> bytes:
    """A response's status line and headers (``connection: close`` added)."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    for k, v in {**(headers or {}), "connection": "close"}.items():
        lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def send_json(writer: asyncio.StreamWriter, status: int, body: Any) -> None:
    data = json.dumps(body).encode()
    writer.write(
        head(status, {"content-type": "application/json", "content-length": str(len(data))})
    )
    writer.write(data)
    await writer.drain()


async def hold() -> None:
    """Keeps a connection open until the server stops."""
    await asyncio.Event().wait()


class FakeServer:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        #: Every request, in arrival order.
        self.requests: list[Request] = []
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paths(self, suffix: str) -> list[Request]:
        return [r for r in self.requests if r.path.endswith(suffix)]

    def __enter__(self) -> FakeServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers: dict[str, str] = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            length = int(headers.get("content-length", "0"))
            body = await reader.readexactly(length) if length else b""
            request = Request(method, target.split("?", 1)[0], headers, body)
            self.requests.append(request)
            await self.handler(request, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass  # the server stops: the connection ends here
        finally:
            with contextlib.suppress(Exception):
                writer.close()
