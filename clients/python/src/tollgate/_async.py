"""The agent side, async: :class:`AsyncClient` creates :class:`AsyncRun` s; a run
appends events, arms gates and waits for their decisions, runs approved calls under the
execution guard, and ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast

import anyio
import httpx

from ._errors import (
    ConfigError,
    InvalidEvent,
    RunEnded,
    RunTerminal,
    TollgateError,
    ToolDenied,
    TransportError,
    Unavailable,
    UnexpectedAnswer,
    WaitTimedOut,
    conflict_for,
    error_from_answer,
)
from ._hash import arguments_hash
from ._http import ClientConfig, Http, describe, is_event_stream
from ._models import (
    Appended,
    ArmApproval,
    Armed,
    Budget,
    Card,
    CreateRun,
    EventPage,
    ExecutionAnswer,
    LiveEndpoints,
    MutationRecord,
    RunReceipt,
    Settle,
    Start,
)
from ._models import (
    RunEnded as RunEndedBody,
)
from ._retry import MIN_RECONNECT, reconnect_backoff
from ._sse import MAX_FRAME_DATA, MAX_LINE, Comment, Frame, Retry, SseParser
from ._ws import LiveConnection, WsUnavailable, resolve

log = logging.getLogger("tollgate")

#: Most events one append request carries (the server's batch limit).
MAX_BATCH_EVENTS = 99
#: The server's default card timeout, in seconds.
DEFAULT_GATE_TIMEOUT = 300.0
#: The event that announces a card's resolution.
APPROVAL_RESOLVED = "tool.approval_resolved"
#: Refusals at admission: the server announced ``tool_execution_started`` before them.
ADMISSION_REFUSALS = ("no_budget", "tool_not_in_budget", "budget_exhausted", "call_ceiling_reached")
#: The most bytes of result and error facts together the server keeps.
MAX_FACTS_BYTES = 32 * 1024
_MAX_MESSAGE = 1000

EventHook = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Decision:
    """How a gate ended: ``state`` is ``approved``, ``denied`` or ``expired``.

    An approved decision is what :meth:`AsyncRun.execute` takes to run the call under
    the execution guard. ``auto`` says a durable policy approved it without a card
    (the card's ``auto_approved``; ``decided_by`` is then ``policy:<policy_id>``); such
    a call is not on the ledger.
    """

    state: str
    request_id: str
    tool_name: str
    tool_call_id: str
    approval_id: str
    arguments_hash: str | None = None
    scope: str | None = None
    decided_by: str | None = None
    auto: bool = False
    display_id: str | None = None

    @property
    def approved(self) -> bool:
        """Whether the call may go ahead."""
        return self.state == "approved"


@dataclass(frozen=True)
class _Verdict:
    state: str
    scope: str | None = None
    decided_by: str | None = None
    auto: bool = False


def _scope(value: Any) -> str:
    return value if value in ("once", "run", "tool", "always") else "once"


def _verdict_from_event(data: Mapping[str, Any]) -> _Verdict:
    decided_by = data.get("decidedBy")
    decided_by = decided_by if isinstance(decided_by, str) else None
    if data.get("approved") is True:
        return _Verdict("approved", _scope(data.get("scope")), decided_by)
    if data.get("expired") is True:
        return _Verdict("expired")
    return _Verdict("denied", None, decided_by)


def _verdict_from_card(card: Mapping[str, Any]) -> _Verdict | None:
    decided_by = card.get("decided_by")
    decided_by = decided_by if isinstance(decided_by, str) else None
    state = card.get("state")
    if state == "approved":
        # Only the card's own flag says a policy approved it: `decided_by` is whatever
        # the decider's token names.
        auto = card.get("auto_approved") is True
        return _Verdict("approved", _scope(card.get("scope")), decided_by, auto)
    if state == "denied":
        return _Verdict("denied", None, decided_by)
    if state == "expired":
        return _Verdict("expired")
    return None


def _clip(text: str) -> str:
    return text[:_MAX_MESSAGE]


#: What stands in for facts that are not JSON (a set, a datetime, a cycle, NaN, …).
FACTS_UNSERIALIZABLE = "facts_unserializable"


def _json_fact(value: Any) -> Any:
    """``value`` as plain JSON (a copy), or a stub saying it is not JSON."""
    if value is None:
        return None
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as e:
        log.warning("facts that are not JSON were replaced by a stub (%s)", type(e).__name__)
        return {"code": FACTS_UNSERIALIZABLE}


def _facts(result: Any, error: Any) -> tuple[Any, Any]:
    """Facts as JSON, bounded to what the server keeps (not JSON, or too large → a stub
    saying so)."""
    result, error = _json_fact(result), _json_fact(error)

    def size(v: Any) -> int:
        return 0 if v is None else len(json.dumps(v, separators=(",", ":")))

    if size(result) + size(error) <= MAX_FACTS_BYTES:
        return result, error

    def stub(v: Any) -> Any:
        return None if v is None else {"code": "facts_too_large", "bytes": size(v)}

    return stub(result), stub(error)


class NotSent(Exception):
    """Raise it inside an execution guard when the request certainly never left this
    process (it could not be built, the connection was refused): the attempt settles
    ``not_sent``, with the message you give it (your own words, kept in the record: never
    a secret). Only when certain — a wrong ``not_sent`` lets a fresh approval run the
    mutation again."""


class SendFailed(Exception):
    """Raise it inside an execution guard when the transport failed without an answer,
    to record the message you give it — your own words, free of secrets — with the
    settlement (``raise SendFailed("connection reset") from e``). Other exceptions are
    recorded by their type's name only: their text (a URL with a key in it, …) never
    reaches the record or the run's events. Raised on like any other exception."""


def _failure(code: str, exc: BaseException) -> dict[str, Any]:
    """The error facts of a failure: a fixed code, the exception's type, and the message
    only when the caller wrote it for the record."""
    cause = exc.__cause__ if isinstance(exc, SendFailed) else None
    facts: dict[str, Any] = {"code": code, "type": type(cause or exc).__name__}
    if isinstance(exc, (NotSent, SendFailed)) and str(exc):
        facts["message"] = _clip(str(exc))
    return facts


class AsyncExecution:
    """The execution guard of one approved call (``async with run.execute(decision)``).

    Entering starts the attempt (``POST …/start``: admission, ``tool_execution_started``).
    Call :meth:`dispatch` right before the request goes out; then leaving the block
    settles it by what actually happened:

    - the block finished after ``dispatch()`` → ``confirmed`` (with :meth:`record`'s
      facts) → ``completed``;
    - an exception after ``dispatch()`` → ``ambiguous`` → ``outcome_unknown``;
    - an exception before ``dispatch()``, or :class:`NotSent` → ``not_sent`` →
      ``not_executed``.

    A refused or failed ``start`` or ``dispatch`` settles nothing (do not send; the
    server settled a refused attempt, and its deadline settles the rest). An ambiguous
    attempt is never retried: a new start of it raises :class:`~tollgate.OutcomeUnknown`
    until an operator reconciles it.

    An exception's text is never recorded (it may hold a URL with a key in it): the
    error facts are ``{"code": ..., "type": <its class name>}``, and a message only
    through :class:`NotSent` or :class:`SendFailed`.
    """

    def __init__(
        self,
        run: AsyncRun,
        decision: Decision,
        tool_call_id: str | None = None,
        approval_id: str | None = None,
    ) -> None:
        self.run = run
        self.decision = decision
        self.tool_call_id = tool_call_id or decision.tool_call_id
        self.approval_id = approval_id or decision.approval_id
        #: The sequence of ``tool_execution_started``, once started.
        self.sequence: int | None = None
        #: ``confirmed``, ``ambiguous`` or ``not_sent`` once settled.
        self.evidence: str | None = None
        #: The durable record's state once settled (``not_ledgered`` for a call a
        #: policy approved).
        self.state: str | None = None
        #: Why the settlement could not be recorded (the deadline settles it instead).
        self.unsettled: TollgateError | None = None
        self._attempted = False
        self._started = False
        self._dispatched = False
        self._dispatch_failed = False
        self._result: Any = None
        self._error: Any = None

    @property
    def ledgered(self) -> bool:
        """Whether the call is on the execution ledger (a human approved it)."""
        return not self.decision.auto

    @property
    def dispatched(self) -> bool:
        return self._dispatched

    def idempotency_key(self) -> str:
        """``<run_id>:<tool_call_id>:<approval_id>``: one key per attempt, for remote
        APIs that deduplicate requests."""
        return f"{self.run.run_id}:{self.tool_call_id}:{self.approval_id}"

    def record(self, result: Any = None, *, error: Any = None) -> None:
        """The facts a ``confirmed`` settlement keeps: ``result`` for a success,
        ``error`` for an application-level error response (e.g. ``{"http_status":
        422}``). Facts are what the ledger keeps — never credentials or payloads. They
        are copied as JSON now; what is not JSON is recorded as ``{"code":
        "facts_unserializable"}`` (the settlement still goes ahead)."""
        self._result, self._error = _json_fact(result), _json_fact(error)

    async def start(self) -> None:
        """``POST …/tool-calls/{tool_call_id}/start``. Only a ``200 {state: "intent"}``
        starts the attempt; a refusal or failure raises, and then :meth:`finish` settles
        nothing (the attempt is not this guard's: another process may have sent it)."""
        if self._attempted:
            raise ConfigError("this attempt was started already")
        d = self.decision
        if not d.approved:
            raise ToolDenied(d.tool_name, d.state, d.decided_by)
        self._attempted = True
        if d.auto:
            self._started = True
            self.state = "not_ledgered"
            return
        body = Start(
            request_id=d.request_id,
            approval_id=self.approval_id,
            tool_name=d.tool_name,
            arguments_hash=d.arguments_hash,
        ).to_json()
        answer = await self.run._call("POST", ["tool-calls", self.tool_call_id, "start"], body)
        if (
            answer.status == 409
            and isinstance(answer.body, dict)
            and answer.body.get("reason") in ADMISSION_REFUSALS
        ):
            self.run._execution_started(d.tool_name)
        got = answer.expect(200)
        started = ExecutionAnswer.from_json(got, answer.status)
        if started.state == "intent":
            self.run._execution_started(d.tool_name)
            self.sequence = started.sequence
            self.state = "intent"
            self._started = True
            return
        # A repeated start answers the attempt's later state: it is not ours to send.
        raise conflict_for(started.state)(
            f"the attempt is already {started.state}; it is not sent again",
            status=answer.status,
            state=started.state,
            body=got,
        )

    async def dispatch(self) -> None:
        """``intent → dispatched`` (``POST …/dispatch``), right before sending. Only a
        ``200 {state: "dispatched"}`` returns; anything else raises and nothing may be
        sent."""
        if not self._started:
            raise ConfigError("dispatch before start")
        if self._dispatched:
            raise ConfigError("this attempt was dispatched already; it is not sent twice")
        if self.decision.auto:
            self._dispatched = True
            return
        self._dispatch_failed = True
        answer = await self.run._call(
            "POST",
            ["tool-calls", self.tool_call_id, "dispatch"],
            {"approval_id": self.approval_id},
        )
        got = answer.expect(200)
        state = ExecutionAnswer.from_json(got, answer.status).state
        if state != "dispatched":
            raise conflict_for(state)(
                "dispatch did not answer dispatched; do not send",
                status=answer.status,
                state=state,
                body=got,
            )
        self._dispatch_failed = False
        self._dispatched = True
        self.state = "dispatched"

    def _evidence(self, exc: BaseException | None) -> tuple[str, Any, Any]:
        if isinstance(exc, NotSent):
            return "not_sent", None, _failure("not_sent", exc)
        if not self._dispatched:
            if exc is None:
                return "not_sent", None, {"code": "not_sent", "message": "not dispatched"}
            return "not_sent", None, _failure("not_sent", exc)
        if exc is None:
            return "confirmed", self._result, self._error
        timeouts = (
            TimeoutError,
            asyncio.TimeoutError,
            httpx.TimeoutException,
            anyio.get_cancelled_exc_class(),
        )
        code = "timeout" if isinstance(exc, timeouts) else "transport"
        return "ambiguous", None, _failure(code, exc)

    async def finish(self, exc: BaseException | None) -> None:
        """Settles by what happened (what leaving the block does); nothing when the
        attempt was not started (its start refused or failed), settled already, or its
        dispatch refused or failed."""
        if not self._started or self.evidence is not None or self._dispatch_failed:
            return
        evidence, result, error = self._evidence(exc)
        self.evidence = evidence
        if self.decision.auto:
            return
        try:
            self.state = await self.run.settle(
                self.tool_call_id, self.approval_id, evidence, result=result, error=error
            )
        except TollgateError as e:
            log.warning(
                "the settlement of tool call %s (%s) could not be recorded: %s",
                self.tool_call_id,
                evidence,
                e,
            )
            self.unsettled = e

    async def __aenter__(self) -> AsyncExecution:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        with anyio.CancelScope(shield=True):
            await self.finish(exc)
        return isinstance(exc, NotSent)


class _Step:
    """How one stream response or one polling round ended."""

    RESOLVED = "resolved"
    RUN_ENDED = "run_ended"
    AGAIN = "again"
    FALLBACK = "fallback"
    #: No WebSocket here: the SSE stream next.
    SSE = "sse"
    FAILED = "failed"

    def __init__(
        self,
        kind: str,
        verdict: _Verdict | None = None,
        wait: float = 0.0,
        error: TollgateError | None = None,
        retry_after: float | None = None,
        progressed: bool = False,
    ) -> None:
        self.kind = kind
        self.verdict = verdict
        self.wait = wait
        self.error = error
        self.retry_after = retry_after
        self.progressed = progressed


@dataclass
class _Watch:
    request_id: str
    after: int
    on_event: EventHook | None
    streaming: bool = True
    #: Over WebSocket (while one is advertised and opens), else the SSE stream.
    websocket: bool = True
    retry_hint: float = 1.0
    #: Live-stream responses opened (the first and every reconnect).
    connections: int = 0


class AsyncRun:
    """One run: its id and run token (never shown by ``repr``). Every method talks to
    the server with the run token."""

    def __init__(
        self,
        client: AsyncClient,
        run_id: str,
        run_token: str,
        *,
        created: bool = False,
        agenthost_credential: str | None = None,
        status: str | None = None,
    ) -> None:
        self.client = client
        self.run_id = run_id
        self._token = run_token
        #: Whether ``create_run`` created it just now (201) rather than found it (200).
        self.created = created
        #: For a pod run: the credential its AgentHost pod checks (a secret).
        self.agenthost_credential = agenthost_credential
        #: Its status, when a receipt said.
        self.status = status
        self._on_started: Callable[[str], None] | None = None

    def __repr__(self) -> str:
        return f"AsyncRun(run_id={self.run_id!r}, created={self.created!r})"

    @property
    def token(self) -> str:
        """The run's token (a secret: give it only to whoever acts for this run)."""
        return self._token

    def on_tool_execution_started(self, hook: Callable[[str], None] | None) -> AsyncRun:
        """The optional adapter hook: called with the tool's name whenever the server
        announced ``tool_execution_started`` for a call this handle started (admitted,
        or refused at admission right after). Not for a policy-approved call."""
        self._on_started = hook
        return self

    def _execution_started(self, tool_name: str) -> None:
        if self._on_started is not None:
            self._on_started(tool_name)

    async def _call(self, method: str, rest: list[str], body: Any = None, **kw: Any) -> Any:
        return await self.client._http.send(
            method, ["api", "runs", self.run_id, *rest], self._token, body, **kw
        )

    # Events ---------------------------------------------------------------------------

    async def append(self, *events: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> list[int]:
        """Appends events (``POST /api/runs/{id}/events``) and returns their sequences.

        Each event is a mapping with a string ``type``; one without an ``event_id`` gets a
        fresh UUID, so a retried request answers the original sequences instead of
        appending twice. More than 99 go in several requests (each atomic on its own).
        Accepts events as arguments, or one iterable of them.
        """
        flat: list[Mapping[str, Any]] = []
        for item in events:
            if isinstance(item, Mapping):
                flat.append(item)
            else:
                flat.extend(item)
        keyed = [_keyed(i, e) for i, e in enumerate(flat)]
        if not keyed:
            raise InvalidEvent("nothing to append")
        sequences: list[int] = []
        for start in range(0, len(keyed), MAX_BATCH_EVENTS):
            batch = keyed[start : start + MAX_BATCH_EVENTS]
            answer = await self._call("POST", ["events"], {"events": batch})
            got = Appended.from_json(answer.expect(200), answer.status)
            if len(got.sequences) != len(batch):
                raise UnexpectedAnswer("one sequence per event", status=answer.status)
            sequences.extend(got.sequences)
        return sequences

    async def events(self, after: int = 0, limit: int | None = None) -> EventPage:
        """One page of the run's events after ``after`` (``limit`` 1–1000)."""
        params = {"after": str(after)}
        if limit is not None:
            params["limit"] = str(limit)
        answer = await self._call("GET", ["events"], params=params)
        return EventPage.from_json(answer.expect(200), answer.status)

    async def complete(self, **fields: Any) -> RunEndedBody:
        """Completes the run (``run_completed``, with ``fields`` in it); a repeat answers
        the same sequence."""
        return await self._finish("complete", fields)

    async def fail(self, **fields: Any) -> RunEndedBody:
        """Fails the run (``run_failed``)."""
        return await self._finish("fail", fields)

    async def cancel(self, **fields: Any) -> RunEndedBody:
        """Cancels the run (``run_cancelled``)."""
        return await self._finish("cancel", fields)

    async def _finish(self, verb: str, fields: dict[str, Any]) -> RunEndedBody:
        answer = await self._call("POST", [verb], dict(fields))
        return RunEndedBody.from_json(answer.expect(200), answer.status)

    # Gates ----------------------------------------------------------------------------

    async def approval(self, request_id: str) -> Card:
        """The card as the server holds it (``GET …/approval-requests/{request_id}``)."""
        answer = await self._call("GET", ["approval-requests", request_id])
        return Card.from_json(answer.expect(200), answer.status)

    async def gate(
        self,
        tool_name: str,
        *,
        arguments: Any = None,
        url: str | None = None,
        message: str | None = None,
        intention: str | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
        tool_call_id: str | None = None,
        approval_id: str | None = None,
        on_event: EventHook | None = None,
        on_pending: Callable[[str], None] | None = None,
        arguments_preview: dict[str, Any] | None = None,
    ) -> Decision:
        """Arms a card and waits for its decision.

        The card is bound to ``arguments`` (its ``arguments_hash``), shows ``url``,
        ``message``, ``intention`` and ``arguments_preview`` (a JSON object, display
        only: the server replaces values under secret-looking keys with
        ``"[redacted]"`` and bounds it), and expires after ``timeout`` seconds (default
        300, rounded up to whole seconds). A policy covering the call approves it at
        once. Otherwise the gate waits for the card's ``tool.approval_resolved`` on the
        run's live stream, resuming with ``Last-Event-ID`` after every window or drop
        (and reading the card itself after each reconnect), or polls the event pages
        where the stream is unavailable. ``on_pending`` is called with the card's
        ``request_id`` once it waits for a human; ``on_event`` sees each event read
        meanwhile, once, in order. The run ending first raises :class:`~tollgate.RunEnded`; a card
        neither decided nor expired ``expiry_grace`` after its deadline raises
        :class:`~tollgate.WaitTimedOut`.
        """
        timeout = DEFAULT_GATE_TIMEOUT if timeout is None else float(timeout)
        if not 0 < timeout <= 7 * 24 * 3600:
            raise ConfigError("a card's timeout is 1 s to 7 days")
        rid = request_id or str(uuid.uuid4())
        hashed = arguments_hash(arguments) if arguments is not None else None
        body = ArmApproval(
            request_id=rid,
            tool_name=tool_name,
            tool_call_id=tool_call_id,
            approval_id=approval_id,
            url=url,
            intention=intention,
            message=message,
            arguments_hash=hashed,
            arguments_preview=arguments_preview,
            timeout_seconds=max(1, math.ceil(timeout)),
        ).to_json()
        answer = await self._call("POST", ["approval-requests"], body)
        armed = Armed.from_json(answer.expect(200, 201), answer.status)

        def decision(v: _Verdict) -> Decision:
            return Decision(
                state=v.state,
                request_id=rid,
                tool_name=tool_name,
                tool_call_id=tool_call_id or rid,
                approval_id=approval_id or rid,
                arguments_hash=hashed,
                scope=v.scope,
                decided_by=v.decided_by,
                auto=v.auto,
                display_id=armed.display_id,
            )

        if armed.state == "approved" and armed.auto_approved:
            policy = f"policy:{armed.policy_id}" if armed.policy_id else None
            return decision(_Verdict("approved", _scope(armed.scope), policy, True))
        if armed.state in ("approved", "denied", "expired"):
            card = await self.approval(rid)
            v = _verdict_from_card(card.to_json())
            if v is None:
                raise UnexpectedAnswer("a decided card's state", status=200)
            return decision(v)
        if armed.state != "pending":
            raise UnexpectedAnswer(f"the card's state {armed.state!r}", status=answer.status)
        log.info("waiting for approval: run %s request %s", self.run_id, rid)
        if on_pending is not None:
            on_pending(rid)
        # A fresh card's resolution follows its `tool.approval_required`; a repeated arm
        # does not say where that is, so the wait reads from the start.
        watch = _Watch(rid, armed.sequence or 0, on_event)
        return decision(await self._wait(watch, timeout))

    async def _wait(self, w: _Watch, timeout: float) -> _Verdict:
        config = self.client.config
        started = anyio.current_time()
        give_up_at = started + timeout + config.expiry_grace
        failures = 0
        first = True
        while True:
            if anyio.current_time() >= give_up_at:
                try:
                    v = await self._card_verdict(w.request_id)
                except TollgateError:
                    v = None
                if v is not None:
                    return v
                raise WaitTimedOut(w.request_id, anyio.current_time() - started)
            if w.streaming and not first:
                # The safety net: after every reconnect, the card itself.
                try:
                    v = await self._card_verdict(w.request_id)
                except TollgateError as e:
                    if not e.retryable:
                        raise
                    v = None
                if v is not None:
                    return v
            first = False
            if not w.streaming:
                step = await self._poll_once(w)
            elif w.websocket:
                step = await self._ws_once(w, give_up_at)
            else:
                step = await self._stream_once(w, give_up_at)
            if step.kind == _Step.RESOLVED and step.verdict is not None:
                return step.verdict
            if step.kind == _Step.RUN_ENDED:
                v = await self._card_verdict(w.request_id)
                if v is not None:
                    return v
                raise RunEnded(self.run_id, w.request_id)
            if step.kind == _Step.SSE:
                log.debug("no WebSocket endpoint (%s); following the SSE stream", step.error)
                w.websocket = False
                first = True
                continue
            if step.kind == _Step.FALLBACK:
                log.debug("live stream unavailable; polling the event pages")
                w.streaming = False
                wait = 0.0
            elif step.kind == _Step.FAILED and not step.progressed:
                failures += 1
                wait = max(
                    reconnect_backoff(w.retry_hint, failures, config.max_reconnect_delay),
                    min(step.retry_after or 0.0, config.max_reconnect_delay),
                )
                log.debug("waiting for the card: reconnecting in %.2f s (%s)", wait, step.error)
            elif step.kind == _Step.FAILED:
                # It dropped after delivering events: the server is there; resume now.
                failures = 0
                wait = MIN_RECONNECT
            else:
                failures = 0
                wait = step.wait
            left = give_up_at - anyio.current_time()
            await anyio.sleep(max(0.0, min(wait, left)))

    async def _card_verdict(self, request_id: str) -> _Verdict | None:
        card = (await self.approval(request_id)).to_json()
        # A card the run's end closed was never decided: the run ending is the answer.
        if card.get("reason") == "run_ended":
            return None
        return _verdict_from_card(card)

    def _seen(self, w: _Watch, event: dict[str, Any]) -> _Verdict | None:
        """Handles one new event; the card's verdict when it is its resolution."""
        if w.on_event is not None:
            w.on_event(event)
        if event.get("type") == APPROVAL_RESOLVED and event.get("requestId") == w.request_id:
            # Closed by its run's end (announced just before the terminal event, which
            # follows): the run's end is the answer, not an expiry.
            if event.get("reason") == "run_ended":
                return None
            return _verdict_from_event(event)
        return None

    def _live(self) -> LiveConnection:
        config = self.client.config
        return LiveConnection(
            None,
            self._token,
            discover=self.client._websocket_url,
            run_id=self.run_id,
            open_timeout=config.connect_timeout,
            max_backoff=config.max_reconnect_delay,
        )

    async def _ws_once(self, w: _Watch, give_up_at: float) -> _Step:
        """The wait over WebSocket: the follower resumes across drops by itself."""
        try:
            async with self._live() as live:
                w.connections += 1
                with anyio.move_on_after(max(0.0, give_up_at - anyio.current_time())):
                    async with aclosing(live.follow(self.run_id, w.after)) as events:
                        async for event in events:
                            w.after = event.sequence
                            verdict = self._seen(w, event.data)
                            if verdict is not None:
                                return _Step(_Step.RESOLVED, verdict=verdict)
                    return _Step(_Step.RUN_ENDED)
                return _Step(_Step.AGAIN)
        except WsUnavailable as e:
            return _Step(_Step.SSE, error=e)
        except RunTerminal:
            # Reconnecting with the run token after the run ended (its connection is
            # refused then): the card is read as the run left it.
            return _Step(_Step.RUN_ENDED)

    async def follow(self, after: int = 0) -> AsyncGenerator[dict[str, Any], None]:
        """The run's events after ``after``, each once and in sequence order, until the run
        ended and every event was handed out: over WebSocket where ``GET /api/live``
        advertises one, else (or when it cannot be opened) on the SSE stream, resumed
        with ``Last-Event-ID``, else from the event pages, read every ``poll_interval``.
        Use it under :func:`contextlib.aclosing` when leaving early::

            async with aclosing(run.follow()) as events:
                async for event in events:
                    ...
        """
        if await self.client._websocket_url() is not None:
            try:
                async with self._live() as live:
                    async with aclosing(live.follow(self.run_id, after)) as events:
                        async for live_event in events:
                            after = live_event.sequence
                            yield live_event.data
                    return
            except WsUnavailable as e:
                log.debug("no WebSocket endpoint (%s); following the SSE stream", e)
            except RunTerminal:
                # The run ended while the connection was down, and a run token of an
                # ended run connects no more: the rest is read from the event pages.
                async for event in self._rest(after):
                    yield event
                return
        st = _Watch("", after, None)
        async with aclosing(self._follow_sse(st)) as sse:
            async for event in sse:
                yield event
        if st.streaming:
            return  # the run ended
        log.debug("no SSE stream here; reading the event pages")
        async for event in self._rest(st.after):
            yield event

    async def _rest(self, after: int) -> AsyncGenerator[dict[str, Any], None]:
        """The events after ``after`` from the event pages, read every ``poll_interval``,
        until the run ended and every event was handed out."""
        poll = self.client.config.poll_interval
        while True:
            page = await self.events(after, 1000)
            for event in page.events:
                seq = event.get("sequence")
                if not isinstance(seq, int) or seq <= after:
                    continue
                after = seq
                yield event
            after = max(after, page.next_after)
            if page.terminal and not page.has_more:
                return
            if not page.has_more or not page.events:
                await anyio.sleep(poll)

    async def _follow_sse(self, st: _Watch) -> AsyncGenerator[dict[str, Any], None]:
        """``follow`` on the SSE stream: the events after ``st.after``, once each and in
        order, until the run ended; ``st.streaming`` turns false where the stream is not
        offered (404/405, or not ``text/event-stream``)."""
        config = self.client.config
        http = self.client._http
        failures = 0
        while True:
            progressed = False
            error: TollgateError | None = None
            try:
                async with http.stream(
                    ["api", "runs", self.run_id, "stream"], self._token, st.after
                ) as resp:
                    if resp.status_code in (404, 405) or (
                        resp.status_code == 200 and not is_event_stream(resp)
                    ):
                        st.streaming = False
                        return
                    if resp.status_code != 200:
                        answer = await http.read_refusal(resp)
                        error = error_from_answer(answer.status, answer.body)
                        if not error.retryable:
                            raise error
                    else:
                        parser = SseParser()
                        chunks = cast(AsyncGenerator[bytes, None], resp.aiter_bytes())
                        try:
                            while not parser.overflowed:
                                chunk: bytes | None = None
                                ended = False
                                with anyio.move_on_after(config.stream_stall):
                                    try:
                                        chunk = await chunks.__anext__()
                                    except StopAsyncIteration:
                                        ended = True  # the end of a window
                                if chunk is None:
                                    break
                                for item in parser.feed(chunk):
                                    if isinstance(item, Retry):
                                        st.retry_hint = min(
                                            item.ms / 1000.0, config.max_reconnect_delay
                                        )
                                    if not isinstance(item, Frame):
                                        continue
                                    if item.done:
                                        return
                                    seq = item.sequence()
                                    if seq is None or seq <= st.after:
                                        continue
                                    try:
                                        event = json.loads(item.data)
                                    except ValueError:
                                        event = None
                                    if not isinstance(event, dict):
                                        event = {"sequence": seq, "type": item.event}
                                    st.after = seq
                                    progressed = True
                                    yield event
                                if ended:
                                    break
                        finally:
                            await chunks.aclose()
            except (TimeoutError, httpx.HTTPError) as e:
                log.debug("follow: the SSE stream broke (%s)", type(e).__name__)
            failures = 0 if progressed and error is None else failures + 1
            wait = (
                st.retry_hint
                if failures == 0
                else reconnect_backoff(st.retry_hint, failures, config.max_reconnect_delay)
            )
            await anyio.sleep(wait)

    async def _stream_once(self, w: _Watch, give_up_at: float) -> _Step:
        config = self.client.config
        http = self.client._http
        w.connections += 1
        progressed = False
        try:
            async with http.stream(
                ["api", "runs", self.run_id, "stream"], self._token, w.after
            ) as resp:
                if resp.status_code != 200:
                    if resp.status_code in (404, 405):
                        return _Step(_Step.FALLBACK)
                    answer = await http.read_refusal(resp)
                    error = error_from_answer(
                        answer.status,
                        answer.body,
                        retry_after=answer.retry_after,
                        header_request_id=answer.request_id,
                    )
                    if error.retryable:
                        return _Step(_Step.FAILED, error=error, retry_after=answer.retry_after)
                    raise error
                if not is_event_stream(resp):
                    return _Step(_Step.FALLBACK)
                parser = SseParser()
                chunks = cast(AsyncGenerator[bytes, None], resp.aiter_bytes())
                try:
                    while True:
                        left = give_up_at - anyio.current_time()
                        if left <= 0:
                            return _Step(_Step.AGAIN)
                        # Any bytes, a keep-alive comment too, say the stream is alive.
                        chunk = None
                        with anyio.move_on_after(min(config.stream_stall, left)):
                            try:
                                chunk = await chunks.__anext__()
                            except StopAsyncIteration:
                                # The end of a window: resume after the server's hint.
                                return _Step(_Step.AGAIN, wait=w.retry_hint)
                        if chunk is None:
                            if anyio.current_time() >= give_up_at:
                                return _Step(_Step.AGAIN)
                            return _Step(
                                _Step.FAILED,
                                error=TransportError(
                                    f"the live stream was silent for {config.stream_stall} s"
                                ),
                                progressed=progressed,
                            )
                        for item in parser.feed(chunk):
                            if isinstance(item, Comment):
                                continue
                            if isinstance(item, Retry):
                                w.retry_hint = min(item.ms / 1000.0, config.max_reconnect_delay)
                                continue
                            if item.done:
                                return _Step(_Step.RUN_ENDED)
                            seq = item.sequence()
                            if seq is None:
                                continue  # not a run event
                            if seq <= w.after:
                                continue  # seen already
                            try:
                                event = json.loads(item.data)
                            except ValueError:
                                event = None
                            if not isinstance(event, dict):
                                event = {"sequence": seq, "type": item.event}
                            w.after = seq
                            progressed = True
                            verdict = self._seen(w, event)
                            if verdict is not None:
                                return _Step(_Step.RESOLVED, verdict=verdict)
                        if parser.overflowed:
                            # A broken response: drop it and resume after the last event.
                            return _Step(
                                _Step.FAILED,
                                error=TransportError(
                                    f"the live stream broke (a line over {MAX_LINE >> 20} MiB"
                                    f" or a frame over {MAX_FRAME_DATA >> 20} MiB)"
                                ),
                                progressed=progressed,
                            )
                finally:
                    await chunks.aclose()
        except TimeoutError:
            return _Step(
                _Step.FAILED,
                error=TransportError(
                    f"the live stream did not answer within {config.request_timeout} s"
                ),
                progressed=progressed,
            )
        except httpx.HTTPError as e:
            return _Step(_Step.FAILED, error=TransportError(describe(e)), progressed=progressed)

    async def _poll_once(self, w: _Watch) -> _Step:
        poll = self.client.config.poll_interval
        while True:
            try:
                page = await self.events(w.after, 1000)
            except (TransportError, Unavailable) as e:
                retry_after = e.retry_after if isinstance(e, Unavailable) else None
                return _Step(_Step.FAILED, error=e, retry_after=retry_after)
            for event in page.events:
                seq = event.get("sequence")
                if not isinstance(seq, int) or seq <= w.after:
                    continue
                w.after = seq
                verdict = self._seen(w, event)
                if verdict is not None:
                    return _Step(_Step.RESOLVED, verdict=verdict)
            w.after = max(w.after, page.next_after)
            if page.terminal:
                return _Step(_Step.RUN_ENDED)
            if not page.has_more or not page.events:
                return _Step(_Step.AGAIN, wait=poll)

    # Execution ------------------------------------------------------------------------

    def execute(
        self,
        decision: Decision,
        *,
        tool_call_id: str | None = None,
        approval_id: str | None = None,
    ) -> AsyncExecution:
        """The execution guard for an approved call::

            async with run.execute(decision) as ex:
                await ex.dispatch()          # right before the request goes out
                response = await send(...)
                ex.record({"http_status": response.status_code})

        ``tool_call_id`` and ``approval_id`` default to the decision's (the card's). A
        decision that is not approved raises :class:`~tollgate.ToolDenied` on entry.
        """
        return AsyncExecution(self, decision, tool_call_id, approval_id)

    async def settle(
        self,
        tool_call_id: str,
        approval_id: str,
        evidence: str,
        *,
        result: Any = None,
        error: Any = None,
    ) -> str:
        """Records evidence for an attempt (``POST …/settle``) and returns the record's
        state. The guard does this itself; use it for what it could not record."""
        result, error = _facts(result, error)
        body = Settle(approval_id=approval_id, evidence=evidence, result=result, error=error)
        answer = await self._call("POST", ["tool-calls", tool_call_id, "settle"], body.to_json())
        return ExecutionAnswer.from_json(answer.expect(200), answer.status).state

    async def mutation(self, tool_call_id: str, approval_id: str) -> MutationRecord:
        """A durable ``mutation_outcome/v1`` record."""
        answer = await self._call("GET", ["mutations", tool_call_id, approval_id])
        return MutationRecord.from_json(answer.expect(200), answer.status)


def _keyed(index: int, event: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(event, Mapping):
        raise InvalidEvent(f"events[{index}] must be a mapping")
    out = dict(event)
    if not isinstance(out.get("type"), str):
        raise InvalidEvent(f'events[{index}] needs a string "type"')
    out.setdefault("event_id", str(uuid.uuid4()))
    return out


class AsyncClient:
    """A connection to one Tollgate server as one agent (its JWT)::

    async with AsyncClient("http://127.0.0.1:8080", token=agent_jwt) as client:
        run = await client.create_run(owner="alice", budget={"tools": {"web_fetch": 1}})
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        config: ClientConfig | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not token or not token.strip():
            raise ConfigError("the token is empty")
        self.config = config or ClientConfig()
        self._http = Http(base_url, self.config, transport)
        self._token = token.strip()
        self._ws_url: str | None = None
        self._ws_known = False

    async def _websocket_url(self) -> str | None:
        """The WebSocket endpoint ``GET /api/live`` advertises, resolved against the base
        URL; learnt once per client (``None``: none, or ``config.websocket`` is off)."""
        if not self.config.websocket:
            return None
        if self._ws_known:
            return self._ws_url
        try:
            answer = await self._http.send("GET", ["api", "live"], self._token)
        except TollgateError as e:
            log.debug("GET /api/live failed (%s); following the SSE stream", e)
            return None
        if answer.status == 200:
            try:
                advertised = LiveEndpoints.from_json(answer.body).websocket_url
            except UnexpectedAnswer as e:
                log.debug("GET /api/live: %s; following the SSE stream", e)
                advertised = None
            self._ws_url = resolve(self._http.base, advertised) if advertised else None
            self._ws_known = True
        elif answer.status in (404, 405):
            self._ws_known = True  # a server from before the WebSocket endpoint
        return self._ws_url

    def live(self) -> LiveConnection:
        """One WebSocket connection following several runs with the agent's token (an
        async context manager; :class:`~tollgate.LiveConnection`). Entering it raises
        :class:`~tollgate.WsUnavailable` where no WebSocket endpoint is advertised or
        it cannot be opened."""
        return LiveConnection(
            None,
            self._token,
            discover=self._websocket_url,
            open_timeout=self.config.connect_timeout,
            max_backoff=self.config.max_reconnect_delay,
        )

    def __repr__(self) -> str:
        return f"AsyncClient(base_url={self._http.base!r})"

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def create_run(
        self,
        *,
        run_id: str | None = None,
        delivery_id: str | None = None,
        owner: str | None = None,
        channel_id: str | None = None,
        budget: Budget | Mapping[str, Any] | None = None,
        kind: str | None = None,
        parent_run_id: str | None = None,
        subtask_id: int | str | None = None,
        project_id: str | None = None,
        execution_mode: str | None = None,
        agenthost_origin: str | None = None,
    ) -> AsyncRun:
        """Creates a run (``POST /api/runs``); safe to retry: with a ``delivery_id`` the
        server answers a repeat with the same run (the receipt), and without one the
        client picks the ``run_id`` itself."""
        if run_id is None and delivery_id is None:
            run_id = f"run-{uuid.uuid4().hex}"
        spec = CreateRun(
            run_id=run_id,
            kind=kind,
            parent_run_id=parent_run_id,
            subtask_id=subtask_id,
            owner=owner,
            project_id=project_id,
            channel_id=channel_id,
            delivery_id=delivery_id,
            budget=budget.to_json()
            if isinstance(budget, Budget)
            else (dict(budget) if budget is not None else None),
            execution_mode=execution_mode,
            agenthost_origin=agenthost_origin,
        )
        answer = await self._http.send("POST", ["api", "runs"], self._token, spec.to_json())
        receipt = RunReceipt.from_json(answer.expect(200, 201), answer.status)
        return AsyncRun(
            self,
            receipt.run_id,
            receipt.run_token,
            created=answer.status == 201,
            agenthost_credential=receipt.agenthost_credential,
            status=receipt.status,
        )

    async def receipt(self, delivery_id: str) -> AsyncRun:
        """The run a create with this ``delivery_id`` made (``GET /api/receipts/…``);
        :class:`~tollgate.NotFound` when there is none."""
        answer = await self._http.send("GET", ["api", "receipts", delivery_id], self._token)
        receipt = RunReceipt.from_json(answer.expect(200), answer.status)
        return AsyncRun(
            self,
            receipt.run_id,
            receipt.run_token,
            agenthost_credential=receipt.agenthost_credential,
            status=receipt.status,
        )

    def run(self, run_id: str, run_token: str) -> AsyncRun:
        """A handle on an existing run from its id and token (nothing is sent)."""
        return AsyncRun(self, run_id, run_token)
