"""The HTTP contract's bodies, as ``openapi.json`` (``components.schemas``) names them.

Hand-written; ``tests/test_models.py`` holds each one to the document: its fields are
the schema's ``properties`` and the fields without a default are the schema's
``required``. Answers are read with :meth:`Model.from_json`, which keeps fields this
client does not know in ``extra`` (the server may add some) instead of dropping them.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from ._errors import UnexpectedAnswer

M = TypeVar("M", bound="Model")

#: Dataclass fields that are not the schema's (see ``Model``).
_LOCAL = {"extra"}

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """A model's field types, resolved once."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _named(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value is of a field's declared type (``null`` only where the type
    allows ``None``; list items and mapping values checked as well)."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if origin is dict:
        _, item = typing.get_args(hint) or (str, Any)
        return isinstance(value, dict) and all(_fits(v, item) for v in value.values())
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


@dataclass
class Model:
    """A body of the contract."""

    #: The schema's name in ``openapi.json``.
    schema_name: ClassVar[str] = ""

    @classmethod
    def from_json(cls: type[M], body: Any, status: int = 200) -> M:
        """Reads an answer's JSON; a missing required field is :class:`UnexpectedAnswer`."""
        if not isinstance(body, dict):
            raise UnexpectedAnswer(
                f"{cls.schema_name}: the answer is not a JSON object", status=status
            )
        known: dict[str, Any] = {}
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in _LOCAL:
                continue
            if f.name in body:
                if not _fits(body[f.name], hints[f.name]):
                    raise UnexpectedAnswer(
                        f"{cls.schema_name}: the answer's {f.name} is not {_named(hints[f.name])}",
                        status=status,
                    )
                known[f.name] = body[f.name]
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise UnexpectedAnswer(
                    f"{cls.schema_name}: the answer lacks {f.name}", status=status
                )
        extra = {k: v for k, v in body.items() if k not in known}
        obj = cls(**known)
        if hasattr(obj, "extra"):
            obj.extra = extra
        return obj

    def to_json(self) -> dict[str, Any]:
        """The body to send: every field that is set (``None`` left out)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in _LOCAL:
                continue
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value
        extra = getattr(self, "extra", None)
        if isinstance(extra, dict):
            for k, v in extra.items():
                out.setdefault(k, v)
        return out


@dataclass
class ErrorBody(Model):
    """Every 4xx/5xx answer: ``{error, code, request_id, state?, status?, terminal_sequence?}``."""

    schema_name: ClassVar[str] = "ErrorBody"
    error: str
    code: str
    request_id: str
    state: str | None = None
    status: str | None = None
    terminal_sequence: int | None = None
    reason: str | None = None
    approval_id: str | None = None


@dataclass
class Event(Model):
    """One event of a run: the envelope; the payload fields are in ``extra``."""

    schema_name: ClassVar[str] = "Event"
    protocol_version: str
    run_id: str
    sequence: int
    type: str
    timestamp_utc: str
    extra: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        """A payload field (or an envelope one)."""
        if key in self.extra:
            return self.extra[key]
        return getattr(self, key, default)


@dataclass
class EventPage(Model):
    """``GET /api/runs/{id}/events``."""

    schema_name: ClassVar[str] = "EventPage"
    run_id: str
    events: list[dict[str, Any]]
    next_after: int
    has_more: bool
    terminal: bool


@dataclass
class Budget:
    """A run's budget for approved execution: tool name → most starts, and a ceiling."""

    tools: dict[str, int] = field(default_factory=dict)
    call_ceiling: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tools": dict(self.tools)}
        if self.call_ceiling is not None:
            out["call_ceiling"] = self.call_ceiling
        return out


@dataclass
class CreateRun(Model):
    """``POST /api/runs``'s body; every field optional."""

    schema_name: ClassVar[str] = "CreateRun"
    run_id: str | None = None
    kind: str | None = None
    parent_run_id: str | None = None
    subtask_id: int | str | None = None
    owner: str | None = None
    project_id: str | None = None
    channel_id: str | None = None
    delivery_id: str | None = None
    budget: dict[str, Any] | None = None
    execution_mode: str | None = None
    agenthost_origin: str | None = None


@dataclass
class RunReceipt(Model):
    """A create's answer and ``GET /api/receipts/{delivery_id}``."""

    schema_name: ClassVar[str] = "RunReceipt"
    run_id: str
    run_token: str = field(repr=False)
    sequence: int
    status: str | None = None
    agenthost_credential: str | None = field(default=None, repr=False)


@dataclass
class AppendEvents(Model):
    """``POST /api/runs/{id}/events``'s body."""

    schema_name: ClassVar[str] = "AppendEvents"
    events: list[dict[str, Any]]


@dataclass
class Appended(Model):
    """An append's answer."""

    schema_name: ClassVar[str] = "Appended"
    run_id: str
    sequences: list[int]
    #: A pod card's announcement: its request, state, holder, deadline; what was dropped.
    request_id: str | None = None
    state: str | None = None
    held_by: str | None = None
    expires_at: str | None = None
    resolved: bool | None = None
    dropped: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunEnded(Model):
    """``complete`` / ``fail`` / ``cancel``'s answer."""

    schema_name: ClassVar[str] = "RunEnded"
    run_id: str
    status: str
    sequence: int


@dataclass
class ArmApproval(Model):
    """``POST /api/runs/{id}/approval-requests``'s body."""

    schema_name: ClassVar[str] = "ArmApproval"
    request_id: str
    tool_name: str
    tool_call_id: str | None = None
    approval_id: str | None = None
    url: str | None = None
    intention: str | None = None
    message: str | None = None
    arguments_hash: str | None = None
    #: Shown to the operator, display only; the server redacts and bounds it.
    arguments_preview: dict[str, Any] | None = None
    timeout_seconds: int | None = None


@dataclass
class Armed(Model):
    """An arm's answer."""

    schema_name: ClassVar[str] = "Armed"
    run_id: str
    request_id: str
    display_id: str
    state: str
    expires_at: str | None = None
    sequence: int | None = None
    auto_approved: bool | None = None
    scope: str | None = None
    policy_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Decide(Model):
    """An operator's decision: ``POST …/tool-approvals`` or ``…/tool-denials``."""

    schema_name: ClassVar[str] = "Decide"
    request_id: str
    scope: str | None = None
    tool_name: str | None = None
    #: Why the operator decided so (at most 1024 characters, no control characters).
    reason: str | None = None


@dataclass
class Decided(Model):
    """A decision's answer: the card's real state."""

    schema_name: ClassVar[str] = "Decided"
    run_id: str
    request_id: str
    resolved: bool
    state: str
    expired: bool
    approved: bool | None = None
    denied: bool | None = None
    decided_by: str | None = None
    scope: str | None = None
    reason: str | None = None
    decision_reason: str | None = None
    pod_applied: bool | None = None
    #: The standing grant this approval made (:class:`Grant`'s fields), else ``None``.
    grant: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Grant(Model):
    """What a standing grant covers: later cards for ``tool_name`` within ``scope``
    (``run``, ``tool`` or ``always``)."""

    schema_name: ClassVar[str] = "Grant"
    tool_name: str
    scope: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Card(Model):
    """An approval card as the server holds it."""

    schema_name: ClassVar[str] = "Card"
    run_id: str
    request_id: str
    display_id: str
    tool_name: str
    tool_call_id: str
    approval_id: str
    state: str
    created_at: str
    expires_at: str
    url: str | None = None
    intention: str | None = None
    message: str | None = None
    arguments_hash: str | None = None
    arguments_preview: dict[str, Any] | None = None
    scope: str | None = None
    decided_by: str | None = None
    decided_at: str | None = None
    auto_approved: bool | None = None
    policy_id: str | None = None
    reason: str | None = None
    decision_reason: str | None = None
    held_by: str | None = None
    coordinator_run_id: str | None = None
    subtask_id: int | str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class CardPage(Model):
    """``GET /api/approvals?state=pending``."""

    schema_name: ClassVar[str] = "CardPage"
    approvals: list[dict[str, Any]]
    has_more: bool
    next_after: str | None = None


@dataclass
class RunCards(Model):
    """``GET /api/runs/{id}/approvals?state=pending``."""

    schema_name: ClassVar[str] = "RunCards"
    run_id: str
    approvals: list[dict[str, Any]]
    has_more: bool


@dataclass
class Policy(Model):
    """A scope grant."""

    schema_name: ClassVar[str] = "Policy"
    policy_id: str
    scope: str
    tool_name: str
    origin_run_id: str
    request_id: str
    granted_by: str
    granted_at: str
    covers_nothing: bool
    owner: str | None = None
    project_id: str | None = None
    revoked_at: str | None = None
    revoked_by: str | None = None


@dataclass
class PolicyPage(Model):
    """``GET /api/policies``."""

    schema_name: ClassVar[str] = "PolicyPage"
    policies: list[dict[str, Any]]
    has_more: bool
    next_cursor: str | None = None


@dataclass
class RunSummary(Model):
    """One run of ``GET /api/runs``."""

    schema_name: ClassVar[str] = "RunSummary"
    run_id: str
    kind: str
    status: str
    created_at: int
    owner: str | None = None
    project_id: str | None = None
    channel_id: str | None = None
    ended_at: int | None = None


@dataclass
class RunList(Model):
    """``GET /api/runs``: one project's runs, newest first; a page may be short (even
    empty) while ``has_more`` is true."""

    schema_name: ClassVar[str] = "RunList"
    runs: list[dict[str, Any]]
    has_more: bool
    next_cursor: str | None = None


@dataclass
class Delivery(Model):
    """One notification delivery (a dead letter of ``GET /api/notifications/dead-letters``)."""

    schema_name: ClassVar[str] = "Delivery"
    delivery_id: str
    sink: str
    kind: str
    run_id: str
    request_id: str
    sequence: int
    state: str
    attempts: int
    created_at: str
    updated_at: str
    project: str | None = None
    last_error: str | None = None
    next_attempt_at: str | None = None


@dataclass
class DeadLetters(Model):
    """``GET /api/notifications/dead-letters``: the project's dead letters, newest first."""

    schema_name: ClassVar[str] = "DeadLetters"
    dead_letters: list[dict[str, Any]]


@dataclass
class SlackAnswer(Model):
    """What ``POST /api/slack/interactions`` answers a verified interaction."""

    schema_name: ClassVar[str] = "SlackAnswer"
    outcome: str
    state: str | None = None
    decided_by: str | None = None
    message: str | None = None


@dataclass
class Start(Model):
    """``POST …/tool-calls/{tool_call_id}/start``'s body."""

    schema_name: ClassVar[str] = "Start"
    request_id: str
    approval_id: str
    tool_name: str
    arguments_hash: str | None = None


@dataclass
class Dispatch(Model):
    """``POST …/dispatch``'s body."""

    schema_name: ClassVar[str] = "Dispatch"
    approval_id: str


@dataclass
class Settle(Model):
    """``POST …/settle``'s body."""

    schema_name: ClassVar[str] = "Settle"
    approval_id: str
    evidence: str
    result: Any = None
    error: Any = None


@dataclass
class Reconcile(Model):
    """An operator's reconciliation of an ``outcome_unknown`` record."""

    schema_name: ClassVar[str] = "Reconcile"
    observed: str


@dataclass
class MutationRecord(Model):
    """A durable ``mutation_outcome/v1`` record; its other fields are in ``extra``."""

    schema_name: ClassVar[str] = "MutationRecord"
    #: ``mutation_outcome/v1``.
    schema: str
    run_id: str
    tool_call_id: str
    approval_id: str
    tool_name: str
    state: str
    execution_status: str | None = None
    result: Any = None
    error: Any = None
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class MutationList(Model):
    """``GET /api/runs/{id}/mutations``."""

    schema_name: ClassVar[str] = "MutationList"
    run_id: str
    mutations: list[dict[str, Any]]
    has_more: bool


@dataclass
class ExecutionAnswer(Model):
    """``start`` / ``dispatch`` / ``settle`` / ``reconcile``'s answer (and their 409s)."""

    schema_name: ClassVar[str] = "ExecutionAnswer"
    state: str
    sequence: int | None = None
    reason: str | None = None


@dataclass
class StreamEnd(Model):
    """The live stream's final ``event: done`` frame's data."""

    schema_name: ClassVar[str] = "StreamEnd"
    run_id: str
    terminal_sequence: int


@dataclass
class LiveEndpoints(Model):
    """``GET /api/live``: the WebSocket endpoint (``None``: only the SSE stream)."""

    schema_name: ClassVar[str] = "LiveEndpoints"
    sse: bool
    websocket_url: str | None = None


@dataclass
class WsFrame(Model):
    """A WebSocket frame: an event (``id`` its sequence, ``data`` the event as replay
    serves it) or a control frame (no ``id``: ``subscribed``, ``done``, ``error``, …)."""

    schema_name: ClassVar[str] = "WsFrame"
    event: str
    data: Any
    run_id: str | None = None
    id: int | None = None


@dataclass
class Dropped(Model):
    """An event an append dropped (a pod card's heartbeat after it ended, …)."""

    schema_name: ClassVar[str] = "Dropped"
    index: int
    type: str
    reason: str


@dataclass
class ConsoleConfig(Model):
    """``GET /api/console/config``."""

    schema_name: ClassVar[str] = "ConsoleConfig"
    sub: str
    always_eligible: list[str]
    project_id: str | None = None


@dataclass
class ConsoleSignIn(Model):
    """``GET /api/console/sign-in``: ``oidc`` is a ``ConsoleOidc`` object, or ``None``."""

    schema_name: ClassVar[str] = "ConsoleSignIn"
    oidc: dict[str, Any] | None = None


@dataclass
class ConsoleOidc(Model):
    """The console's sign-in with an OpenID Connect provider (authorization code + PKCE)."""

    schema_name: ClassVar[str] = "ConsoleOidc"
    provider: str
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    client_id: str
    scopes: str
    redirect_uri: str | None = None


@dataclass
class ApprovalRequired(Model):
    """The payload of ``tool.approval_required`` (beside the event's envelope)."""

    schema_name: ClassVar[str] = "ApprovalRequired"
    requestId: str
    displayId: str
    toolName: str
    url: str | None = None
    intention: str | None = None
    message: str | None = None
    argumentsPreview: dict[str, Any] | None = None
    tool_call_id: str | None = None
    approval_id: str | None = None


@dataclass
class RunStarted(Model):
    """The payload of ``run_started`` (sequence 1): the run's shape."""

    schema_name: ClassVar[str] = "RunStarted"
    kind: str
    parent_run_id: str | None = None
    subtask_id: Any = None
    owner: str | None = None
    project_id: str | None = None
    execution_mode: str | None = None


@dataclass
class ApprovalPending(Model):
    """The payload of ``tool.approval_pending``: a heartbeat while a card waits."""

    schema_name: ClassVar[str] = "ApprovalPending"
    requestId: str
    displayId: str
    toolName: str


@dataclass
class ApprovalResolved(Model):
    """The payload of ``tool.approval_resolved``: how a card ended."""

    schema_name: ClassVar[str] = "ApprovalResolved"
    requestId: str
    runId: str
    approved: bool
    expired: bool
    decidedBy: str | None = None
    scope: str | None = None
    reason: str | None = None
    decisionReason: str | None = None
    tool_call_id: str | None = None
    approval_id: str | None = None


@dataclass
class AutoApproved(Model):
    """The payload of ``tool.auto_approved``: a standing grant approved a gate."""

    schema_name: ClassVar[str] = "AutoApproved"
    requestId: str
    displayId: str
    toolName: str
    scope: str
    policyId: str
    tool_call_id: str | None = None
    approval_id: str | None = None


@dataclass
class PolicyRevoked(Model):
    """The payload of ``tool.policy_revoked``."""

    schema_name: ClassVar[str] = "PolicyRevoked"
    policyId: str
    scope: str
    toolName: str
    revokedBy: str | None = None


@dataclass
class ChildApprovalRequired(Model):
    """The payload of ``coordinator.child_approval_required``."""

    schema_name: ClassVar[str] = "ChildApprovalRequired"
    childRunId: str
    subtaskId: Any
    requestId: str
    toolName: str
    url: str | None = None
    argumentsPreview: dict[str, Any] | None = None
    tool_call_id: str | None = None
    approval_id: str | None = None


@dataclass
class ChildApprovalResolved(Model):
    """The payload of ``coordinator.child_approval_resolved``."""

    schema_name: ClassVar[str] = "ChildApprovalResolved"
    childRunId: str
    subtaskId: Any
    requestId: str
    approved: bool
    expired: bool
    decidedBy: str | None = None
    scope: str | None = None
    reason: str | None = None
    decisionReason: str | None = None
    tool_call_id: str | None = None
    approval_id: str | None = None


@dataclass
class ChildStallDetected(Model):
    """The payload of ``coordinator.child_stall_detected``."""

    schema_name: ClassVar[str] = "ChildStallDetected"
    childRunId: str
    subtaskId: Any
    silentSeconds: int
    staleSinceUtc: str
    stallTimeoutSeconds: int
    lastEventSequence: int
    lastEventType: str | None = None
    action: str | None = None


@dataclass
class ExecutionIds(Model):
    """The payload of ``tool_execution_started`` and ``heartbeat``."""

    schema_name: ClassVar[str] = "ExecutionIds"
    tool_name: str
    tool_call_id: str
    approval_id: str


@dataclass
class ToolExecution(Model):
    """The payload of ``tool_execution``: the terminal execution decision."""

    schema_name: ClassVar[str] = "ToolExecution"
    tool_name: str
    tool_call_id: str
    approval_id: str
    execution_status: str
    mutation_outcome: str
    result: Any = None
    error: Any = None
    reason: str | None = None


@dataclass
class ExecutionReconciled(Model):
    """The payload of ``tool_execution_reconciled``."""

    schema_name: ClassVar[str] = "ExecutionReconciled"
    tool_name: str
    tool_call_id: str
    approval_id: str
    observed: str
    mutation_outcome: str
    reconciled_by: str


@dataclass
class ExecutionUpdated(Model):
    """The payload of ``tool_execution_updated``."""

    schema_name: ClassVar[str] = "ExecutionUpdated"
    tool_name: str
    tool_call_id: str
    approval_id: str
    mutation_outcome: str
    previous_outcome: str
    evidence: str | None = None
    execution_status: str | None = None
    result: Any = None
    error: Any = None
    reason: str | None = None


#: Every model of a schema in ``openapi.json``.
MODELS: tuple[type[Model], ...] = (
    ErrorBody,
    Event,
    EventPage,
    CreateRun,
    RunReceipt,
    AppendEvents,
    Appended,
    RunEnded,
    ArmApproval,
    Armed,
    Decide,
    Decided,
    Grant,
    Card,
    CardPage,
    RunCards,
    Policy,
    PolicyPage,
    RunSummary,
    RunList,
    Delivery,
    DeadLetters,
    SlackAnswer,
    Start,
    Dispatch,
    Settle,
    Reconcile,
    MutationRecord,
    MutationList,
    ExecutionAnswer,
    StreamEnd,
    LiveEndpoints,
    WsFrame,
    Dropped,
    ConsoleConfig,
    ConsoleSignIn,
    ConsoleOidc,
    ApprovalRequired,
    RunStarted,
    ApprovalPending,
    ApprovalResolved,
    AutoApproved,
    PolicyRevoked,
    ChildApprovalRequired,
    ChildApprovalResolved,
    ChildStallDetected,
    ExecutionIds,
    ToolExecution,
    ExecutionReconciled,
    ExecutionUpdated,
)
