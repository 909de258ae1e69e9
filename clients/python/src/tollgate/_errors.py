"""One exception class per kind of failure, in the contract's words.

A refusal the server answered carries its status, the error body's ``code``, ``state``
and ``request_id`` (the server's id of the request, for its logs). Server refusals are
mapped by status and by the body's ``state``: a 409 ``{state: "outcome_unknown"}`` is
:class:`OutcomeUnknown`, never a dict to look into.
"""

from __future__ import annotations

from typing import Any


class TollgateError(Exception):
    """Everything this package raises."""

    #: The HTTP status of the answer, when there was one.
    status: int | None = None
    #: The error body's ``code`` (``invalid_request``, ``run_terminal``, …).
    code: str | None = None
    #: The error body's ``state`` (``unknown``, ``outcome_unknown``, …).
    state: str | None = None
    #: The server's id of the refused request (its ``x-request-id``).
    request_id: str | None = None
    #: Whether the same call may succeed later (transport failures, 429 and 5xx).
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        state: str | None = None,
        request_id: str | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        if state is not None:
            self.state = state
        if request_id is not None:
            self.request_id = request_id
        #: The error body as the server sent it (empty when there was none).
        self.body: dict[str, Any] = dict(body or {})

    @property
    def reason(self) -> str | None:
        """The body's ``reason`` (e.g. ``no_budget`` for a refused start)."""
        value = self.body.get("reason")
        return value if isinstance(value, str) else None

    @property
    def approval_id(self) -> str | None:
        """The body's ``approval_id`` (the attempt that blocks), when given."""
        value = self.body.get("approval_id")
        return value if isinstance(value, str) else None


class ConfigError(TollgateError):
    """The base URL, a token or an argument cannot be used (nothing was sent)."""


class InvalidEvent(ConfigError):
    """An event given to ``append`` is not a JSON object with a string ``type``."""


class TransportError(TollgateError):
    """The request could not be sent or its answer not read, after every retry."""

    retryable = True


class InvalidRequest(TollgateError):
    """400 or 413: the server refused the request as malformed; nothing was written."""


class Unauthorized(TollgateError):
    """401: the token is missing, invalid or expired."""


class Forbidden(TollgateError):
    """403: the token may not do this (role, another run, another project)."""


class NotFound(TollgateError):
    """404: no such run, card, receipt or attempt (``state`` ``unknown`` when said)."""


class Conflict(TollgateError):
    """409: what stands refuses the request; :attr:`state` says what."""


class RunTerminal(Conflict):
    """409 ``run_terminal``: the run has ended; nothing more can be appended."""


class RunExists(Conflict):
    """409 ``run_exists``: a run with this id exists with other fields or creator."""


class ApprovalPending(Conflict):
    """409 ``pending``: the card still waits for a human."""


class NotExecuted(Conflict):
    """409 ``not_executed``: the call was refused (see :attr:`reason`); a new attempt
    needs a fresh approval."""


class OutcomeUnknown(Conflict):
    """409 ``outcome_unknown``: an attempt of this call was dispatched and its outcome is
    unknown. Nothing may start it again until an operator reconciles it; this client
    never retries it."""


class AlreadyDispatched(Conflict):
    """409 ``dispatched``: the attempt was dispatched already (an earlier request whose
    answer was lost, or another holder). Do not send."""


class Unavailable(TollgateError):
    """429 or 5xx on every attempt the retry policy allowed (``Retry-After`` kept)."""

    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        #: The last ``Retry-After``, in seconds.
        self.retry_after = retry_after


class UnexpectedAnswer(TollgateError):
    """An answer this client does not expect (status, or a body missing a field)."""


class RunEnded(TollgateError):
    """The run ended while a gate waited for its card."""

    def __init__(self, run_id: str, request_id: str) -> None:
        super().__init__(f"run {run_id} ended while waiting for approval request {request_id}")
        self.run_id = run_id
        self.card_request_id = request_id


class WaitTimedOut(TollgateError):
    """The card neither resolved nor expired well past its deadline."""

    def __init__(self, request_id: str, waited: float) -> None:
        super().__init__(f"gave up waiting for approval request {request_id} after {waited:.1f} s")
        self.card_request_id = request_id
        self.waited = waited


class ToolDenied(TollgateError):
    """A gated tool call was denied by an operator or expired (``@gated`` raises it)."""

    def __init__(self, tool_name: str, state: str, decided_by: str | None) -> None:
        who = f" by {decided_by}" if decided_by else ""
        super().__init__(f"{tool_name} was not approved: {state}{who}", state=state)
        self.tool_name = tool_name
        self.decided_by = decided_by


_CONFLICTS: dict[str, type[Conflict]] = {
    "run_terminal": RunTerminal,
    "run_exists": RunExists,
    "pending": ApprovalPending,
    "not_executed": NotExecuted,
    "outcome_unknown": OutcomeUnknown,
    "dispatched": AlreadyDispatched,
}


def conflict_for(state: str | None) -> type[Conflict]:
    """The :class:`Conflict` subclass for a 409's ``state``."""
    return _CONFLICTS.get(state or "", Conflict)


def error_from_answer(
    status: int,
    body: Any,
    *,
    retry_after: float | None = None,
    header_request_id: str | None = None,
) -> TollgateError:
    """A refusal answer as the exception it means."""
    fields: dict[str, Any] = body if isinstance(body, dict) else {}

    def text(key: str) -> str | None:
        value = fields.get(key)
        return value if isinstance(value, str) else None

    message = text("error") or f"HTTP {status}"
    kw: dict[str, Any] = {
        "status": status,
        "code": text("code"),
        "state": text("state"),
        "request_id": text("request_id") or header_request_id,
        "body": fields,
    }
    if status in (400, 413):
        return InvalidRequest(message, **kw)
    if status == 401:
        return Unauthorized(message, **kw)
    if status == 403:
        return Forbidden(message, **kw)
    if status == 404:
        return NotFound(message, **kw)
    if status == 409:
        return conflict_for(kw["state"])(message, **kw)
    if status == 429 or 500 <= status <= 599:
        return Unavailable(message, retry_after=retry_after, **kw)
    return UnexpectedAnswer(message, **kw)
