"""The pod side of pod-per-run approvals: an in-memory gate and its ASGI routes.

A run created with ``execution_mode="pod"`` keeps its pending cards in its AgentHost
pod's memory: here, a :class:`PodGate`. The agent arms a card with :meth:`PodGate.arm`
and awaits the returned :class:`PendingApproval`; Tollgate forwards an operator's
decision to the pod's routes (:meth:`PodGate.app`, Starlette; ``pip install
tollgate[pod]``):

- ``POST /tool-approvals`` ``{runId, requestId, scope, decisionId?, toolName?}``,
- ``POST /tool-denials`` ``{runId, requestId, decisionId?, toolName?}``,
- ``GET /tool-approvals/{requestId}`` (the card),

each with ``Authorization: Bearer <credential>``, the run's ``agenthost_credential``
(compared in constant time; missing or wrong → 401). Answers:

==========================================================  ==========================
200 ``{runId, requestId, toolName, state, applied: true,     a pending card decided by
resolved: true, expired: false, scope?}``                    this request
200 ``{…, applied: false, expired}``                         the card had already ended
404 ``{error, state: "unknown"}``                            no such card on that run
409 ``{error: "Run is not active.", state: "pending"}``      its run has ended
409 ``{error: "the card is for another tool", state:         the request names another
"pending"}``                                                 tool (nothing applied)
==========================================================  ==========================

An approval with scope ``tool`` or ``run`` also approves later arms of the same tool on
the same run in this pod at once (``always``: on any run of the pod); ``once`` nothing.
With :meth:`PodGate.announce_through`, each card the gate holds for that run is put on
the run's stream (``tool.approval_required``, a ``tool.approval_pending`` every
``heartbeat_every`` seconds while it waits, ``tool.approval_resolved {expired: true}``
when it expires in the pod), so Tollgate lists it and forwards decisions with its tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._async import DEFAULT_GATE_TIMEOUT, AsyncRun
from ._errors import TollgateError

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

log = logging.getLogger("tollgate.pod")

#: Default of :meth:`PodGate.heartbeat_every`, in seconds.
DEFAULT_POD_HEARTBEAT = 20.0

_SCOPES = ("once", "run", "tool", "always")


def _scope(value: Any) -> str:
    return value if value in _SCOPES else "once"


@dataclass(frozen=True)
class PodDecision:
    """How a pod card ended: ``approved`` (``auto``: by an in-pod bridge), ``denied``
    or ``expired``."""

    state: str
    scope: str | None = None
    auto: bool = False

    @property
    def approved(self) -> bool:
        return self.state == "approved"


EXPIRED = PodDecision("expired")


@dataclass(frozen=True)
class PodAnswer:
    """What a decision did: the HTTP status and JSON body the routes answer."""

    status: int
    body: dict[str, Any]

    @property
    def applied(self) -> bool:
        return self.body.get("applied") is True


def _ended_answer(
    run_id: str, request_id: str, tool_name: str, decision: PodDecision, applied: bool
) -> PodAnswer:
    body: dict[str, Any] = {
        "runId": run_id,
        "requestId": request_id,
        "toolName": tool_name,
        "state": decision.state,
        "applied": applied,
        "resolved": True,
        "expired": decision.state == "expired",
    }
    if decision.scope is not None:
        body["scope"] = decision.scope
    return PodAnswer(200, body)


UNKNOWN = PodAnswer(404, {"error": "no such approval request", "state": "unknown"})
RUN_NOT_ACTIVE = PodAnswer(409, {"error": "Run is not active.", "state": "pending"})
OTHER_TOOL = PodAnswer(409, {"error": "the card is for another tool", "state": "pending"})


@dataclass
class PodArm:
    """A card to hold in the pod."""

    request_id: str
    run_id: str
    tool_name: str
    tool_call_id: str | None = None
    approval_id: str | None = None
    url: str | None = None
    intention: str | None = None
    message: str | None = None
    timeout: float = DEFAULT_GATE_TIMEOUT


@dataclass
class _Card:
    arm: PodArm
    expires_at: float
    state: PodDecision | None = None
    decided_by_id: str | None = None
    waiters: dict[int, asyncio.Future[PodDecision]] = field(default_factory=dict)
    ended: asyncio.Event | None = None

    def end(self, decision: PodDecision) -> None:
        self.state = decision
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_result(decision)
        self.waiters.clear()
        if self.ended is not None:
            self.ended.set()

    def expire_if_due(self, now: float) -> None:
        if self.state is None and now >= self.expires_at:
            self.end(EXPIRED)

    def to_json(self) -> dict[str, Any]:
        a = self.arm
        card: dict[str, Any] = {
            "runId": a.run_id,
            "requestId": a.request_id,
            "toolName": a.tool_name,
            "toolCallId": a.tool_call_id or a.request_id,
            "approvalId": a.approval_id or a.request_id,
            "url": a.url,
            "intention": a.intention,
            "message": a.message,
            "state": self.state.state if self.state else "pending",
        }
        if self.state is not None:
            card["scope"] = self.state.scope
            card["autoApproved"] = self.state.approved and self.state.auto
        return card


class PendingApproval:
    """The future of a pod card's decision (``await`` it). Cancelling every waiter of
    a card that is still pending expires it: no decision may apply to a call that no
    longer waits."""

    def __init__(
        self,
        gate: PodGate,
        request_id: str,
        waiter: int,
        expires_at: float,
        immediate: PodDecision | None,
        future: asyncio.Future[PodDecision] | None,
    ) -> None:
        self._gate = gate
        self.request_id = request_id
        self._waiter = waiter
        self._expires_at = expires_at
        self._decision = immediate
        self._future = future

    @property
    def decided(self) -> PodDecision | None:
        """The decision, when it was known at arm time (a bridge, or an ended card)."""
        return self._decision

    def __await__(self) -> Any:
        return self.wait().__await__()

    async def wait(self) -> PodDecision:
        if self._decision is not None:
            return self._decision
        assert self._future is not None
        try:
            while (left := self._expires_at - time.monotonic()) > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    self._decision = await asyncio.wait_for(asyncio.shield(self._future), left)
                    return self._decision
        except asyncio.CancelledError:
            self.cancel()
            raise
        # Due: the card expires now unless a decision won just before.
        self._decision = self._gate._settled(self.request_id)
        return self._decision

    def cancel(self) -> None:
        """Nobody waits here any more (expires the card when it was the last waiter)."""
        if self._decision is not None:
            return
        card = self._gate._cards.get(self.request_id)
        if card is not None:
            card.waiters.pop(self._waiter, None)
            if card.state is None and not card.waiters:
                card.end(EXPIRED)
        # This waiter gave up: for it the call will not run.
        self._decision = EXPIRED
        if self._future is not None and not self._future.done():
            self._future.cancel()


class PodGate:
    """The in-memory gate of one AgentHost pod. Use it from the event loop that serves
    its routes (:meth:`arm` needs a running loop)."""

    def __init__(self, credential: str) -> None:
        self._credential = hashlib.sha256(credential.encode()).digest()
        self._empty = not credential
        self._cards: dict[str, _Card] = {}
        self._ended_runs: set[str] = set()
        self._bridges: dict[tuple[str, str], str] = {}
        self._next_waiter = 0
        self._announce: dict[str, AsyncRun] = {}
        self._heartbeat = DEFAULT_POD_HEARTBEAT
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"PodGate(cards={len(self._cards)})"

    # Cards ----------------------------------------------------------------------------

    def arm(
        self,
        request_id: str,
        run_id: str,
        tool_name: str,
        *,
        tool_call_id: str | None = None,
        approval_id: str | None = None,
        url: str | None = None,
        intention: str | None = None,
        message: str | None = None,
        timeout: float = DEFAULT_GATE_TIMEOUT,
    ) -> PendingApproval:
        """Holds a card (now) and gives the future of its decision. A bridge covering
        it approves it at once. Arming a ``request_id`` the pod holds for the same run
        and tool waits on that card; for another run or tool it is expired at once."""
        arm = PodArm(
            request_id,
            run_id,
            tool_name,
            tool_call_id,
            approval_id,
            url,
            intention,
            message,
            timeout,
        )
        now = time.monotonic()
        self._next_waiter += 1
        waiter = self._next_waiter
        held = self._cards.get(request_id)
        if held is not None and (held.arm.run_id != run_id or held.arm.tool_name != tool_name):
            return PendingApproval(self, request_id, waiter, now, EXPIRED, None)
        if held is None:
            scope = self._bridge_for(run_id, tool_name)
            state = PodDecision("approved", scope, True) if scope else None
            held = _Card(arm, now + timeout, state, ended=asyncio.Event())
            self._cards[request_id] = held
            run = self._announce.get(run_id)
            if state is None and run is not None:
                with contextlib.suppress(RuntimeError):
                    task = asyncio.get_running_loop().create_task(self._announce_card(run, held))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        held.expire_if_due(now)
        if held.state is not None:
            return PendingApproval(self, request_id, waiter, held.expires_at, held.state, None)
        fut: asyncio.Future[PodDecision] = asyncio.get_running_loop().create_future()
        held.waiters[waiter] = fut
        return PendingApproval(self, request_id, waiter, held.expires_at, None, fut)

    def _settled(self, request_id: str) -> PodDecision:
        card = self._cards.get(request_id)
        if card is None:
            return EXPIRED
        card.expire_if_due(time.monotonic())
        return card.state or EXPIRED

    def _bridge_for(self, run_id: str, tool_name: str) -> str | None:
        return self._bridges.get((run_id, tool_name)) or self._bridges.get(("", tool_name))

    def _install_bridge(self, arm: PodArm, scope: str) -> None:
        if scope in ("tool", "run"):
            self._bridges[(arm.run_id, arm.tool_name)] = scope
        elif scope == "always":
            self._bridges[("", arm.tool_name)] = scope

    def approve(self, run_id: str, request_id: str, scope: str = "once") -> PodAnswer:
        """Approves a card as ``POST /tool-approvals`` does."""
        return self.decide(run_id, request_id, approve=True, scope=scope)

    def deny(self, run_id: str, request_id: str) -> PodAnswer:
        """Denies a card as ``POST /tool-denials`` does."""
        return self.decide(run_id, request_id, approve=False)

    def decide(
        self,
        run_id: str,
        request_id: str,
        *,
        approve: bool,
        scope: str = "once",
        decision_id: str | None = None,
        tool_name: str | None = None,
    ) -> PodAnswer:
        """Decides a card. With Tollgate's ``decisionId``: when the card was ended by
        that very decision, a repeat (its first answer was lost) is ``applied`` again."""
        card = self._cards.get(request_id)
        if card is None or card.arm.run_id != run_id:
            return UNKNOWN
        if tool_name is not None and tool_name != card.arm.tool_name:
            return OTHER_TOOL
        scope = _scope(scope)
        card.expire_if_due(time.monotonic())
        name = card.arm.tool_name
        if card.state is not None:
            d = card.state
            same = (
                decision_id is not None
                and card.decided_by_id == decision_id
                and not d.auto
                and (
                    (approve and d.approved and d.scope == scope)
                    or (not approve and d.state == "denied")
                )
            )
            return _ended_answer(run_id, request_id, name, d, applied=same)
        if run_id in self._ended_runs:
            return RUN_NOT_ACTIVE
        decision = PodDecision("approved", scope, False) if approve else PodDecision("denied")
        if approve:
            # The bridge is in place before the waiting call resumes.
            self._install_bridge(card.arm, scope)
        card.decided_by_id = decision_id
        card.end(decision)
        return _ended_answer(run_id, request_id, name, decision, applied=True)

    def end_run(self, run_id: str) -> None:
        """Marks a run ended: its pending cards can no longer be decided (409)."""
        self._ended_runs.add(run_id)

    def card(self, request_id: str) -> dict[str, Any] | None:
        """The card as ``GET /tool-approvals/{requestId}`` answers it."""
        card = self._cards.get(request_id)
        if card is None:
            return None
        card.expire_if_due(time.monotonic())
        return card.to_json()

    # Announcing -----------------------------------------------------------------------

    def announce_through(self, run: AsyncRun) -> PodGate:
        """Announces the cards armed from now on for ``run`` on its stream."""
        self._announce[run.run_id] = run
        return self

    def heartbeat_every(self, seconds: float) -> PodGate:
        """How often a waiting card's ``tool.approval_pending`` is appended (default
        20 s; Tollgate drops one within half its own heartbeat interval of the last)."""
        self._heartbeat = max(seconds, 0.1)
        return self

    async def _post(self, run: AsyncRun, event: dict[str, Any]) -> dict[str, Any]:
        answer = await run._call("POST", ["events"], {"events": [event]})
        result: dict[str, Any] = answer.expect(200)
        return result

    async def _announce_card(self, run: AsyncRun, card: _Card) -> None:
        arm = card.arm
        display = arm.request_id[:8]
        required: dict[str, Any] = {
            "type": "tool.approval_required",
            "requestId": arm.request_id,
            "displayId": display,
            "toolName": arm.tool_name,
            "timeoutSeconds": max(1, int(arm.timeout)),
        }
        for key, value in (
            ("url", arm.url),
            ("intention", arm.intention),
            ("message", arm.message),
            ("toolCallId", arm.tool_call_id),
            ("approvalId", arm.approval_id),
        ):
            if value is not None:
                required[key] = value
        # Refused (its id taken, the run ended, a bad field): no operator can ever see
        # it, so it expires here at once (fail closed). An outage leaves it waiting.
        try:
            answer = await self._post(run, required)
            refused = answer.get("state") not in (None, "pending")
        except TollgateError as e:
            if e.retryable:
                log.warning("pod card %s not announced: Tollgate unavailable", arm.request_id)
                return
            log.warning("pod card %s refused by Tollgate; it expires", arm.request_id)
            refused = True
        if refused:
            if card.state is None:
                card.end(EXPIRED)
            return
        beat = {
            "type": "tool.approval_pending",
            "requestId": arm.request_id,
            "displayId": display,
            "toolName": arm.tool_name,
        }
        ended = card.ended
        assert ended is not None
        while True:
            card.expire_if_due(time.monotonic())
            if card.state is not None:
                if card.state.state != "expired":
                    return  # decided through Tollgate, which recorded it
                break
            now = time.monotonic()
            step = min(self._heartbeat, card.expires_at - now)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ended.wait(), max(step, 0))
                continue
            if card.state is None and time.monotonic() < card.expires_at:
                try:
                    await self._post(run, beat)
                except TollgateError as e:
                    log.warning("pod card %s heartbeat not appended: %s", arm.request_id, e)
        expired = {
            "type": "tool.approval_resolved",
            "requestId": arm.request_id,
            "displayId": display,
            "toolName": arm.tool_name,
            "approved": False,
            "expired": True,
        }
        for attempt in range(3):
            try:
                await self._post(run, expired)
                return
            except TollgateError as e:
                if attempt == 2:
                    log.warning("pod card %s expiry not appended: %s", arm.request_id, e)
                else:
                    await asyncio.sleep(2**attempt)

    # Routes ---------------------------------------------------------------------------

    def is_authorized(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` value carries this pod's credential (compared in
        constant time)."""
        if self._empty or not authorization or not authorization.startswith("Bearer "):
            return False
        token = authorization[len("Bearer ") :].strip()
        if not token:
            return False
        return hmac.compare_digest(hashlib.sha256(token.encode()).digest(), self._credential)

    def routes(self) -> list[Route]:
        """``POST /tool-approvals``, ``POST /tool-denials``, ``GET /tool-approvals/{id}``
        to mount into the pod's Starlette app."""
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        def unauthorized() -> Response:
            return JSONResponse(
                {"error": "missing or invalid bearer credential"},
                status_code=401,
                headers={"www-authenticate": "Bearer"},
            )

        def answer(a: PodAnswer) -> Response:
            return JSONResponse(a.body, status_code=a.status)

        async def decision(request: Request, approve: bool) -> Response:
            if not self.is_authorized(request.headers.get("authorization")):
                return unauthorized()
            try:
                body = json.loads(await request.body())
            except ValueError:
                body = None
            if not isinstance(body, dict):
                return JSONResponse(
                    {"error": "the body must be JSON {runId, requestId, scope?}"}, status_code=400
                )
            fields = {}
            for key in ("runId", "requestId"):
                value = body.get(key)
                if not isinstance(value, str) or not value:
                    return JSONResponse(
                        {"error": f"{key} must be a non-empty string"}, status_code=400
                    )
                fields[key] = value
            decision_id = body.get("decisionId")
            if not isinstance(decision_id, str) or not 0 < len(decision_id) <= 128:
                decision_id = None
            tool_name = body.get("toolName")
            return answer(
                self.decide(
                    fields["runId"],
                    fields["requestId"],
                    approve=approve,
                    scope=_scope(body.get("scope")),
                    decision_id=decision_id,
                    tool_name=tool_name if isinstance(tool_name, str) else None,
                )
            )

        async def approve_route(request: Request) -> Response:
            return await decision(request, True)

        async def deny_route(request: Request) -> Response:
            return await decision(request, False)

        async def card_route(request: Request) -> Response:
            if not self.is_authorized(request.headers.get("authorization")):
                return unauthorized()
            card = self.card(request.path_params["request_id"])
            if card is None:
                return answer(UNKNOWN)
            return JSONResponse(card)

        return [
            Route("/tool-approvals", approve_route, methods=["POST"]),
            Route("/tool-denials", deny_route, methods=["POST"]),
            Route("/tool-approvals/{request_id}", card_route, methods=["GET"]),
        ]

    def app(self) -> Starlette:
        """A Starlette app serving only :meth:`routes`."""
        from starlette.applications import Starlette

        return Starlette(routes=self.routes())
