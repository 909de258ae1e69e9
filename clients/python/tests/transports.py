"""An httpx transport that records every request the client sends (to the real server)
and can answer some itself first, as an overloaded server would."""

from __future__ import annotations

import json
import time

import httpx


class RecordingTransport(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        #: (method, path, monotonic time) of every request, in order.
        self.sent: list[tuple[str, str, float]] = []
        #: Answers to give instead of the server's: (path suffix, status, Retry-After).
        self.inject: list[tuple[str, int, str | None]] = []

    def paths(self, method: str, suffix: str) -> list[str]:
        return [p for m, p, _ in self.sent if m == method and p.endswith(suffix)]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.sent.append((request.method, path, time.monotonic()))
        for i, (suffix, status, retry_after) in enumerate(self.inject):
            if path.endswith(suffix):
                del self.inject[i]
                headers = {"content-type": "application/json"}
                if retry_after is not None:
                    headers["retry-after"] = retry_after
                body = {"error": "busy", "code": "unavailable", "request_id": "injected-1"}
                return httpx.Response(status, headers=headers, content=json.dumps(body).encode())
        return await super().handle_async_request(request)
