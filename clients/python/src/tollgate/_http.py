"""One server, requests with bounded retries, answers as JSON.

Tokens go only into the ``Authorization`` header and never into an error message or a
log line; transport errors are described without their URL. Redirects are not followed
(a token is never sent along one).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
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


@dataclass(frozen=True)
class ClientConfig:
    """How a client talks to the server (times in seconds)."""

    #: Retries of transport errors, 429 and 5xx (every request).
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: How long one attempt of a plain request may take.
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
    if isinstance(err, httpx.TimeoutException):
        what = "timed out"
    elif isinstance(err, httpx.ConnectError):
        what = "cannot connect"
    elif isinstance(err, (httpx.RemoteProtocolError, httpx.ReadError)):
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
                response = await self._client.request(
                    method,
                    url,
                    headers=headers,
                    json=body if body is not None else None,
                    params=params,
                )
                answer = read(response)
            except httpx.TransportError as e:
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

    def stream(self, segments: Sequence[str], token: str, last_event_id: int) -> Any:
        """A ``GET`` of the live stream after ``last_event_id``: an async context manager
        giving the response (no read timeout: the reader bounds each wait itself)."""
        headers = {
            "authorization": _bearer(token),
            "accept": "text/event-stream",
            "last-event-id": str(last_event_id),
            "cache-control": "no-cache",
        }
        timeout = httpx.Timeout(
            self.config.request_timeout, connect=self.config.connect_timeout, read=None
        )
        return self._client.stream("GET", self.url(segments), headers=headers, timeout=timeout)


def read(response: httpx.Response) -> Answer:
    """The whole answer; a body that is not JSON becomes ``{"error": <its text>}``."""
    body: Any
    try:
        body = response.json() if response.content else None
    except ValueError:
        body = {"error": response.text[:200]}
    return Answer(
        status=response.status_code,
        body=body,
        retry_after=retry_after(response.headers),
        request_id=response.headers.get("x-request-id"),
    )
