"""Following runs live over WebSocket: the ``tollgate.v1`` protocol of ``GET /api/ws``
(``tollgate serve``) or a deployment's WebSocket API, whichever ``GET /api/live``
advertises.

One :class:`LiveConnection` follows several runs (at most
:data:`MAX_SUBSCRIPTIONS` at once). The client rule, per run: it keeps the last
sequence it handed out and drops a frame at or below it; a frame that skips ahead is
held (at most ``max_held`` per run; past that the held frames are dropped) and the run
is subscribed again with ``after`` = that last sequence; a dropped connection is opened
again after a bounded, jittered backoff and every run subscribed again the same way. So
every sequence comes out exactly once and in order, whatever the transport loses; after
a run's ``done`` frame its follow ends. A refused upgrade (401, 403, and 409
``run_terminal``: a run token of an ended run connects no more) raises the error it
means at once; a first connection that cannot be opened at all raises
:class:`WsUnavailable` (the caller falls back to the SSE stream).

The WebSocket library (``websockets``) runs on asyncio: under another event loop the
caller uses the SSE stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from ._errors import ConfigError, TransportError, UnexpectedAnswer, error_from_answer
from ._http import USER_AGENT
from ._models import WsFrame
from ._retry import reconnect_backoff

log = logging.getLogger("tollgate")

#: The subprotocol offered (and answered by the server).
SUBPROTOCOL = "tollgate.v1"
#: Prefix of the subprotocol entry that carries the credential.
BEARER_PREFIX = "bearer."
#: Runs one connection follows at once (the server refuses one more).
MAX_SUBSCRIPTIONS = 16
#: Frames that skipped ahead held per run while the gap is filled again.
MAX_HELD = 256
#: Events per run handed over but not yet taken by its reader.
EVENT_BUFFER = 256
#: The largest frame read (an event is at most 64 KiB of payload).
MAX_FRAME_BYTES = 4 << 20
#: The first wait after a dropped connection.
FIRST_BACKOFF = 0.5


class WsUnavailable(TransportError):
    """No WebSocket connection could be opened (none advertised, the upgrade failed, or
    no asyncio loop): follow the SSE stream instead."""


@dataclass(frozen=True)
class LiveEvent:
    """One run event, handed out once and in sequence order."""

    run_id: str
    sequence: int
    #: The event's type.
    type: str
    #: The event exactly as replay serves it.
    data: dict[str, Any]


def resolve(base_url: str, advertised: str) -> str | None:
    """``advertised`` (``GET /api/live``'s ``websocket_url``) as a WebSocket URL: an
    absolute ``ws``/``wss`` one as it is, ``http``/``https`` with the scheme swapped, a
    path resolved against ``base_url`` (its path prefix kept) with ``http``→``ws``,
    ``https``→``wss``; ``None`` for anything else."""
    if advertised.startswith("/"):
        base = urlsplit(base_url)
        url = base._replace(path=base.path.rstrip("/") + advertised, query="", fragment="")
    else:
        url = urlsplit(advertised)
    scheme = {"http": "ws", "ws": "ws", "https": "wss", "wss": "wss"}.get(url.scheme)
    if scheme is None or not url.netloc:
        return None
    return urlunsplit(url._replace(scheme=scheme))


def _status_of(code: str) -> int:
    """The HTTP status an ``error`` frame's ``code`` stands for."""
    return {
        "unauthorized": 401,
        "forbidden": 403,
        "not_found": 404,
        "too_many_streams": 429,
        "limit_reached": 429,
        "unavailable": 503,
        "internal": 503,
    }.get(code, 400)


def _transient(status: int) -> bool:
    return status >= 500 or status in (408, 429)


@dataclass
class _Sub:
    run_id: str
    last: int
    send: MemoryObjectSendStream[LiveEvent | BaseException | None]
    #: Frames past a gap, by sequence: (type, data).
    held: dict[int, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    #: A subscribe sent and its ``subscribed`` not yet read.
    pending: bool = False
    ended: bool = False


class LiveConnection:
    """One WebSocket connection following runs; use it as an async context manager::

    async with client.live() as live:
        async for event in live.follow(run_id):
            ...

    ``url`` is the WebSocket URL, or ``None`` to learn it from ``discover`` when
    entered (a coroutine answering the URL or ``None`` when none is advertised).
    ``run_id`` names the run a run token is for (a run token follows that run only).
    """

    def __init__(
        self,
        url: str | None,
        token: str,
        *,
        discover: Callable[[], Awaitable[str | None]] | None = None,
        run_id: str | None = None,
        max_held: int = MAX_HELD,
        buffer: int = EVENT_BUFFER,
        open_timeout: float = 10.0,
        max_backoff: float = 30.0,
    ) -> None:
        if not token or not token.strip():
            raise ConfigError("the token is empty")
        if max_held < 1 or buffer < 1:
            raise ConfigError("max_held and buffer are at least 1")
        self._url = url
        self._discover = discover
        self._token = token.strip()
        self._run_id = run_id
        self._max_held = max_held
        self._buffer = buffer
        self._open_timeout = open_timeout
        self._max_backoff = max_backoff
        self._subs: dict[str, _Sub] = {}
        self._ws: Any = None
        self._tg: TaskGroup | None = None
        self._fatal: BaseException | None = None
        self._opened = anyio.Event()
        #: Connections opened (the first and every reconnect).
        self.connections = 0
        #: Frames dropped as repeats, and frames that skipped ahead (held or dropped).
        self.repeats = 0
        self.skips = 0

    def __repr__(self) -> str:
        return f"LiveConnection(url={self._url!r}, runs={sorted(self._subs)!r})"

    async def __aenter__(self) -> LiveConnection:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise WsUnavailable("the WebSocket client needs an asyncio event loop") from None
        if self._url is None and self._discover is not None:
            self._url = await self._discover()
        if self._url is None:
            raise WsUnavailable("no WebSocket endpoint is advertised here")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._run)
        return self

    async def __aexit__(self, *exc: object) -> None:
        tg, self._tg = self._tg, None
        if tg is None:
            return
        tg.cancel_scope.cancel()
        await tg.__aexit__(None, None, None)

    # Following --------------------------------------------------------------------

    async def follow(self, run_id: str, after: int = 0) -> AsyncGenerator[LiveEvent, None]:
        """The run's events after ``after``, each once and in order, until the run ended
        and all were handed out. Raises what the server refused (:class:`~tollgate.Forbidden`,
        :class:`~tollgate.NotFound`, :class:`~tollgate.Unauthorized`, …), or
        :class:`WsUnavailable` when the first connection could not be opened."""
        if self._tg is None:
            raise ConfigError("enter the LiveConnection (async with) before following")
        if run_id in self._subs:
            raise ConfigError(f"run {run_id} is followed on this connection already")
        if len(self._subs) >= MAX_SUBSCRIPTIONS:
            raise ConfigError(f"a connection follows at most {MAX_SUBSCRIPTIONS} runs at once")
        if self._fatal is not None:
            raise self._fatal
        send, receive = anyio.create_memory_object_stream[LiveEvent | BaseException | None](
            self._buffer
        )
        sub = _Sub(run_id, max(0, after), send)
        self._subs[run_id] = sub
        await self._subscribe(sub)
        try:
            async with receive:
                async for item in receive:
                    if item is None:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    yield item
        finally:
            self._subs.pop(run_id, None)
            send.close()
            if not sub.ended and self._ws is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    await self._send({"action": "unsubscribe", "run_id": run_id})

    async def _send(self, message: dict[str, Any]) -> bool:
        ws = self._ws
        if ws is None:
            return False
        try:
            await ws.send(json.dumps(message))
            return True
        except Exception as e:  # the connection broke: the reader reconnects
            log.debug("live: sending failed: %s", type(e).__name__)
            return False

    async def _subscribe(self, sub: _Sub) -> None:
        if sub.ended or self._ws is None:
            return
        sub.pending = True
        await self._send({"action": "subscribe", "run_id": sub.run_id, "after": sub.last})

    # The connection ---------------------------------------------------------------

    def _target(self) -> str:
        assert self._url is not None
        if self._run_id is None:
            return self._url
        parts = urlsplit(self._url)
        query = "&".join(q for q in (parts.query, urlencode({"run_id": self._run_id})) if q)
        return urlunsplit(parts._replace(query=query))

    async def _open(self) -> Any:
        from websockets.asyncio.client import connect
        from websockets.typing import Subprotocol

        return await connect(
            self._target(),
            subprotocols=[Subprotocol(SUBPROTOCOL), Subprotocol(BEARER_PREFIX + self._token)],
            open_timeout=self._open_timeout,
            max_size=MAX_FRAME_BYTES,
            compression=None,
            proxy=None,
            user_agent_header=USER_AGENT,
            close_timeout=2,
        )

    async def _end_all(self, error: BaseException) -> None:
        self._fatal = error
        for sub in list(self._subs.values()):
            sub.ended = True
            with anyio.move_on_after(5):
                await sub.send.send(error)

    def _backoff(self, failures: int) -> float:
        ceiling = reconnect_backoff(FIRST_BACKOFF, failures, self._max_backoff)
        return ceiling * random.uniform(0.5, 1.0)

    async def _run(self) -> None:
        from websockets.exceptions import InvalidStatus

        failures = 0
        while True:
            try:
                ws = await self._open()
            except InvalidStatus as e:
                status = e.response.status_code
                try:
                    body = json.loads(e.response.body or b"null")
                except ValueError:
                    body = None
                if status in (401, 403, 409):
                    # 409: this run token's run has ended (``run_terminal``); asking
                    # again changes nothing. The caller reads the rest from the pages.
                    await self._end_all(error_from_answer(status, body))
                    return
                why = f"the upgrade was refused ({status})"
                if self.connections == 0:
                    await self._end_all(WsUnavailable(why))
                    return
            except Exception as e:
                why = f"connecting failed: {type(e).__name__}"
                if self.connections == 0:
                    await self._end_all(WsUnavailable(why))
                    return
            else:
                self.connections += 1
                self._ws = ws
                self._opened.set()
                try:
                    for sub in list(self._subs.values()):
                        await self._subscribe(sub)
                    async for message in ws:
                        if isinstance(message, str) and await self._frame(message):
                            failures = 0
                    why = "the connection closed"
                except Exception as e:
                    why = f"the connection broke: {type(e).__name__}"
                finally:
                    self._ws = None
                    with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                        await ws.close()
            failures += 1
            delay = self._backoff(failures)
            log.debug("live: %s; reconnecting in %.2f s", why, delay)
            await anyio.sleep(delay)

    async def _frame(self, text: str) -> bool:
        """Handles one frame; whether it handed out an event."""
        try:
            frame = WsFrame.from_json(json.loads(text))
        except (ValueError, UnexpectedAnswer):
            return False
        sub = self._subs.get(frame.run_id or "")
        if sub is None or sub.ended:
            return False
        seq, data, kind = frame.id, frame.data, frame.event
        if seq is not None:
            if seq <= sub.last:
                self.repeats += 1
                return False
            event = data if isinstance(data, dict) else {"sequence": seq, "type": kind}
            if seq > sub.last + 1:
                self.skips += 1
                if len(sub.held) < self._max_held:
                    sub.held[seq] = (kind, event)
                else:
                    sub.held.clear()  # bounded: the new subscription sends them again
                if not sub.pending:
                    await self._subscribe(sub)
                return False
            await self._deliver(sub, seq, kind, event)
            while (nxt := sub.held.pop(sub.last + 1, None)) is not None:
                await self._deliver(sub, sub.last + 1, *nxt)
            for old in [s for s in sub.held if s <= sub.last]:
                del sub.held[old]
            return True
        body = data if isinstance(data, dict) else {}
        if kind == "subscribed":
            sub.pending = False
        elif kind == "done":
            terminal = body.get("terminal_sequence")
            if isinstance(terminal, int) and terminal > sub.last:
                # The end came before every event did: fill the gap first.
                if not sub.pending:
                    await self._subscribe(sub)
                return False
            sub.ended = True
            await sub.send.send(None)
        elif kind == "error":
            code = body.get("code")
            status = _status_of(code if isinstance(code, str) else "")
            if _transient(status):
                assert self._tg is not None
                self._tg.start_soon(self._resubscribe_later, sub)
            else:
                sub.ended = True
                await sub.send.send(error_from_answer(status, body))
        return False

    async def _resubscribe_later(self, sub: _Sub) -> None:
        await anyio.sleep(self._backoff(2))
        if self._subs.get(sub.run_id) is sub:
            await self._subscribe(sub)

    async def _deliver(self, sub: _Sub, seq: int, kind: str, event: dict[str, Any]) -> None:
        sub.last = seq
        try:
            await sub.send.send(LiveEvent(sub.run_id, seq, kind, event))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            sub.ended = True
