"""Tollgate's Python client: runs and events, approval gates, the execution guard, and
the pod side of pod-per-run approvals.

::

    from tollgate import Client

    with Client("http://127.0.0.1:8080", token=agent_jwt) as client:
        run = client.create_run(owner="alice", budget={"tools": {"web_fetch": 1}})
        decision = run.gate("web_fetch", url="https://example.com", message="Fetch the docs?")
        if decision.approved:
            with run.execute(decision) as ex:
                ex.dispatch()
                response = httpx.get("https://example.com")
                ex.record({"http_status": response.status_code})
        run.complete()
"""

from ._async import (
    APPROVAL_RESOLVED,
    MAX_BATCH_EVENTS,
    AsyncClient,
    AsyncExecution,
    AsyncRun,
    Decision,
    NotSent,
    SendFailed,
)
from ._errors import (
    AlreadyDispatched,
    ApprovalPending,
    ConfigError,
    Conflict,
    Forbidden,
    InvalidEvent,
    InvalidRequest,
    NotExecuted,
    NotFound,
    OutcomeUnknown,
    RunEnded,
    RunExists,
    RunTerminal,
    TollgateError,
    ToolDenied,
    TransportError,
    Unauthorized,
    Unavailable,
    UnexpectedAnswer,
    WaitTimedOut,
)
from ._gated import current_run, gated, use_run
from ._hash import arguments_hash, canonical_json
from ._http import ClientConfig, __version__
from ._models import Budget
from ._retry import RetryPolicy
from ._sync import Client, Execution, Run
from ._ws import LiveConnection, LiveEvent, WsUnavailable

__all__ = [
    "APPROVAL_RESOLVED",
    "MAX_BATCH_EVENTS",
    "AlreadyDispatched",
    "ApprovalPending",
    "AsyncClient",
    "AsyncExecution",
    "AsyncRun",
    "Budget",
    "Client",
    "ClientConfig",
    "ConfigError",
    "Conflict",
    "Decision",
    "Execution",
    "Forbidden",
    "InvalidEvent",
    "InvalidRequest",
    "LiveConnection",
    "LiveEvent",
    "NotExecuted",
    "NotFound",
    "NotSent",
    "OutcomeUnknown",
    "RetryPolicy",
    "Run",
    "RunEnded",
    "RunExists",
    "RunTerminal",
    "SendFailed",
    "TollgateError",
    "ToolDenied",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "UnexpectedAnswer",
    "WaitTimedOut",
    "WsUnavailable",
    "__version__",
    "arguments_hash",
    "canonical_json",
    "current_run",
    "gated",
    "use_run",
]
