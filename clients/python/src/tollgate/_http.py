"""One server, requests with bounded retries, answers as JSON.

Tokens go only into the ``Authorization`` header and never into an error message or a
log line; transport errors are described without their URL. Redirects are not followed
(a token is never sent along one). Each attempt is bounded in time as a whole
(``request_timeout``, however slowly the answer trickles in) and its body in size
(:data:`MAX_BODY_BYTES`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import anyio
import httpx

from ._errors import ConfigError, TransportError, UnexpectedAnswer, error_from_answer
from ._retry import RetryPolicy

log = logging.getLogger("tollgate")

__version__ = "0.1.0"
USER_AGENT = f"tollgate-python/{__version__}"
#: The largest answer body read (a larger one is not read to its end).
MAX_BODY_BYTES = 8 << 20


@dataclass(frozen=True)
class ClientConfig:
    """How a client talks to the server (times in seconds)."""

    #: Retries of transport errors, 429 and 5xx (every request).
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: How long one attempt of a plain request may take, its answer read to the end
    #: (and opening the live stream, and reading a refusal of it).
    request_timeout: float = 30.0
    #: How long connecting may take.
    connect_timeout: float = 10.0
    #: A live stream silent this long is treated as broken and reopened (the server
    #: sends a keep-alive every 15 s).
    stream_stall: float = 45.0
    #: Between two reads of the event pages when the live stream is unavailable.
    poll_interval: float = 1.0
    #: How long past a card's deadline a gate keeps waiting for its expiry to be
    #: reported before it gives up (:class:`~tollgate.WaitTimedOut`).
    expiry_grace: float = 120.0
    #: The longest wait between reconnects of a live stream after failures.
    max_reconnect_delay: float = 30.0
    #: Follow runs over WebSocket where ``GET /api/live`` advertises an endpoint (else,
    #: or when it cannot be opened, the SSE stream, then the event pages).
    websocket: bool = True


@dataclass
class Answer:
    """A server's answer: status, JSON body (``None`` when there was none)."""

    status: int
    body: Any
    retry_after: float | None = None
    request_id: str | None = None

    def expect(self, *ok: int) -> dict[str, Any]:
        """The body when the status is one of ``ok``; the refusal raised otherwise."""
        if self.status in ok:
            if not isinstance(self.body, dict):
                raise UnexpectedAnswer("the answer is not a JSON object", status=self.status)
            return self.body
        raise error_from_answer(
            self.status,
            self.body,
            retry_after=self.retry_after,
            header_request_id=self.request_id,
        )


def retry_after(headers: httpx.Headers) -> float | None:
    """``Retry-After`` in seconds."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value.strip()), 0.0)
    except ValueError:
        return None


def describe(err: BaseException) -> str:
    """A transport error as one line, without URL or headers."""
    kind = type(err).__name__
    if isinstance(err, (httpx.TimeoutException, TimeoutError)):
        what = "timed out"
    elif isinstance(err, httpx.ConnectError):
        what = "cannot connect"
    elif isinstance(err, (httpx.RemoteProtocolError, httpx.ReadError, httpx.DecodingError)):
        what = "the answer broke off"
    else:
        what = "request failed"
    return f"{what} ({kind})"


def is_event_stream(response: httpx.Response) -> bool:
    return str(response.headers.get("content-type", "")).startswith("text/event-stream")


def _bearer(token: str) -> str:
    token = token.strip()
    if not token or any(c in token for c in "\r\n"):
        raise ConfigError("the token is empty or not a valid HTTP header value")
    return f"Bearer {token}"


class Http:
    """The HTTP side of a client: one ``httpx.AsyncClient``."""

    def __init__(
        self,
        base_url: str,
        config: ClientConfig,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        parts = urlsplit(base_url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError("the server URL must start with http:// or https://")
        self.base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self.config = config
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.request_timeout, connect=config.connect_timeout),
            follow_redirects=False,
            headers={"user-agent": USER_AGENT},
            transport=transport,
            trust_env=False,
        )

    def url(self, segments: Sequence[str]) -> str:
        """``base/seg/seg/…``, every segment percent-encoded."""
        return self.base + "".join("/" + quote(s, safe="") for s in segments)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def send(
        self,
        method: str,
        segments: Sequence[str],
        token: str,
        body: Any = None,
        params: dict[str, str] | None = None,
    ) -> Answer:
        """Sends a request, retrying as the policy allows; the last answer whatever its
        status, or :class:`TransportError` when none came."""
        headers = {"authorization": _bearer(token), "accept": "application/json"}
        url = self.url(segments)
        attempt = 1
        while True:
            answer: Answer | None = None
            failure: str | None = None
            try:
                with anyio.fail_after(self.config.request_timeout):
                    answer = await self._attempt(method, url, headers, body, params)
            except TimeoutError:
                failure = f"timed out (no whole answer within {self.config.request_timeout} s)"
            except httpx.HTTPError as e:
                failure = describe(e)
            delay = self.config.retry.next_delay(
                attempt,
                answer.status if answer is not None else None,
                answer.retry_after if answer is not None else None,
            )
            if delay is None:
                if answer is not None:
                    return answer
                raise TransportError(f"{method} {'/'.join(segments[:2])}…: {failure}")
            log.debug("retrying %s %s (attempt %d) in %.2f s", method, segments[:2], attempt, delay)
            await anyio.sleep(delay)
            attempt += 1

    async def _attempt(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        body: Any,
        params: dict[str, str] | None,
    ) -> Answer:
        request = self._client.build_request(
            method,
            url,
            headers=headers,
            json=body if body is not None else None,
            params=params,
        )
        response = await self._client.send(request, stream=True)
        try:
            content = await read_capped(response)
        finally:
            await response.aclose()
        if content is None:
            if 200 <= response.status_code < 300:
                raise UnexpectedAnswer(
                    f"the answer is over {MAX_BODY_BYTES >> 20} MiB", status=response.status_code
                )
            # A refusal too large to read says no more than its status.
            content = b""
        return answer_of(response, content)

    @contextlib.asynccontextmanager
    async def stream(
        self, segments: Sequence[str], token: str, last_event_id: int
    ) -> AsyncIterator[httpx.Response]:
        """A ``GET`` of the live stream after ``last_event_id``: the response, its head
        awaited at most ``request_timeout`` (:class:`TimeoutError` past it); no read
        timeout on its body (the reader bounds each wait itself). Closed on leaving."""
        headers = {
            "authorization": _bearer(token),
            "accept": "text/event-stream",
            "last-event-id": str(last_event_id),
            "cache-control": "no-cache",
        }
        timeout = httpx.Timeout(
            self.config.request_timeout, connect=self.config.connect_timeout, read=None
        )
        request = self._client.build_request(
            "GET", self.url(segments), headers=headers, timeout=timeout
        )
        with anyio.fail_after(self.config.request_timeout):
            response = await self._client.send(request, stream=True)
        try:
            yield response
        finally:
            await response.aclose()

    async def read_refusal(self, response: httpx.Response) -> Answer:
        """A streamed answer that is not the stream, read whole within
        ``request_timeout`` (:class:`TimeoutError` past it) and at most
        :data:`MAX_BODY_BYTES` (a larger body is left out)."""
        with anyio.fail_after(self.config.request_timeout):
            content = await read_capped(response)
        return answer_of(response, content or b"")


async def read_capped(response: httpx.Response, cap: int = MAX_BODY_BYTES) -> bytes | None:
    """A streamed response's body, or ``None`` when it is over ``cap`` bytes (it is then
    not read further)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def answer_of(response: httpx.Response, content: bytes) -> Answer:
    """An answer from its head and body; a body that is not JSON becomes ``{"error": <its
    text>}``."""
    body: Any
    try:
        body = json.loads(content) if content else None
    except ValueError:
        body = {"error": content[:200].decode("utf-8", errors="replace")}
    return Answer(
        status=response.status_code,
        body=body,
        retry_after=retry_after(response.headers),
        request_id=response.headers.get("x-request-id"),
    )
