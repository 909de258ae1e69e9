//! The one list of the HTTP contract's operations: method, route template, who may call
//! it, its parameters, what it takes and what it answers. `tests/openapi.rs` holds it to
//! the routes the server declares, both ways, and the OpenAPI document is generated from
//! it ([`crate::openapi`]).

/// A credential an operation accepts (a bearer token in `Authorization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// An agent JWT (`role: agent`).
    Agent,
    /// An operator JWT (`role: operator`).
    Operator,
    /// The run token `POST /api/runs` answered (`rt.…`).
    RunToken,
    /// A pod-per-run run's AgentHost credential (`pc.…`).
    PodCredential,
}

impl Credential {
    /// The security scheme's name in the document.
    pub fn scheme(self) -> &'static str {
        match self {
            Credential::Agent => "agentJwt",
            Credential::Operator => "operatorJwt",
            Credential::RunToken => "runToken",
            Credential::PodCredential => "podCredential",
        }
    }
}

/// A body: a named type of this crate (its schema in the document's components), or a
/// media type with no JSON schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// `application/json` of the named type (`"RunReceipt"`, …).
    Json(&'static str),
    /// Any JSON object (a terminal event's payload; this document).
    AnyObject,
    /// `text/event-stream`: the live stream's frames.
    EventStream,
    /// `text/html`.
    Html,
    /// `application/x-www-form-urlencoded` with a `payload` field: a Slack interaction.
    SlackForm,
    /// `text/javascript`.
    JavaScript,
    /// A WebSocket upgrade (101): the messages are [`crate::ws`]'s.
    WebSocket,
}

/// A query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query {
    pub name: &'static str,
    /// `integer` or `string`.
    pub kind: &'static str,
    pub description: &'static str,
    /// An integer's bounds (inclusive).
    pub range: Option<(u64, u64)>,
    /// A string's only values (empty: any).
    pub values: &'static [&'static str],
}

const fn integer(name: &'static str, description: &'static str, range: (u64, u64)) -> Query {
    Query {
        name,
        kind: "integer",
        description,
        range: Some(range),
        values: &[],
    }
}

const fn text(name: &'static str, description: &'static str) -> Query {
    Query {
        name,
        kind: "string",
        description,
        range: None,
        values: &[],
    }
}

/// One operation of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operation {
    pub method: &'static str,
    /// The route template, `{name}` for path parameters (each an id).
    pub path: &'static str,
    pub id: &'static str,
    pub summary: &'static str,
    /// Any of these credentials; none: open.
    pub credentials: &'static [Credential],
    pub query: &'static [Query],
    pub request: Option<Body>,
    /// Each status it answers and the body it answers with (errors: `ErrorBody`).
    pub responses: &'static [(u16, Body)],
}

use Body::*;
use Credential::*;

const ERR: Body = Json("ErrorBody");
/// What every authenticated operation may answer besides its own statuses.
const AUTH_ERRORS: [(u16, Body); 3] = [(401, ERR), (403, ERR), (503, ERR)];

macro_rules! responses {
    ($($status:expr => $body:expr),* $(,)?) => {
        &[$(($status, $body),)* AUTH_ERRORS[0], AUTH_ERRORS[1], AUTH_ERRORS[2]]
    };
}

const AFTER_SEQ: Query = integer(
    "after",
    "Answer events after this sequence (default 0).",
    (0, i64::MAX as u64),
);
const EVENT_LIMIT: Query = integer(
    "limit",
    "Most events to answer (default 100).",
    (1, crate::limits::MAX_PAGE_EVENTS as u64),
);
const CARD_LIMIT: Query = integer(
    "limit",
    "Most cards to answer (default and most 500).",
    (1, crate::limits::MAX_LISTED_CARDS as u64),
);
const POLICY_LIMIT: Query = integer(
    "limit",
    "Most grants to answer (default and most 500).",
    (1, crate::limits::MAX_LISTED_POLICIES as u64),
);
const RUN_LIMIT: Query = integer(
    "limit",
    "Most runs to answer (default 50, most 200).",
    (1, crate::limits::MAX_LISTED_RUNS as u64),
);
const RUN_STATUS: Query = Query {
    values: &["running", "completed", "failed", "cancelled"],
    ..text("status", "Only runs in this status.")
};
const MUTATION_LIMIT: Query = integer(
    "limit",
    "Most records to answer (default 100).",
    (1, crate::limits::MAX_LISTED_MUTATIONS as u64),
);
const PENDING: Query = Query {
    values: &["pending"],
    ..text("state", "`pending` (the only state listed).")
};

/// `complete`, `fail` and `cancel`: the body is the terminal event's payload.
const fn ending(path: &'static str, id: &'static str, summary: &'static str) -> Operation {
    Operation {
        method: "POST",
        path,
        id,
        summary,
        credentials: &[RunToken],
        query: &[],
        request: Some(AnyObject),
        responses: responses![200 => Json("RunEnded"), 400 => ERR, 404 => ERR, 409 => ERR, 413 => ERR],
    }
}

/// Every operation, in the README's order.
pub const OPERATIONS: &[Operation] = &[
    Operation {
        method: "POST",
        path: "/api/runs",
        id: "createRun",
        summary: "Create a run (idempotent with delivery_id); answers its run token.",
        credentials: &[Agent],
        query: &[],
        request: Some(Json("CreateRun")),
        responses: responses![201 => Json("RunReceipt"), 200 => Json("RunReceipt"), 400 => ERR, 409 => ERR, 413 => ERR, 429 => ERR],
    },
    Operation {
        method: "GET",
        path: "/api/receipts/{delivery_id}",
        id: "readReceipt",
        summary: "The run a delivery_id created, with its run token.",
        credentials: &[Agent],
        query: &[],
        request: None,
        responses: responses![200 => Json("RunReceipt"), 404 => ERR],
    },
    Operation {
        method: "POST",
        path: "/api/runs/{run_id}/events",
        id: "appendEvents",
        summary: "Append producer events (1 to 99) to a running run.",
        credentials: &[RunToken, PodCredential],
        query: &[],
        request: Some(Json("AppendEvents")),
        responses: responses![200 => Json("Appended"), 400 => ERR, 404 => ERR, 409 => ERR, 413 => ERR, 429 => ERR],
    },
    ending("/api/runs/{run_id}/complete", "completeRun", "End the run as completed (the body is run_completed's payload)."),
    ending("/api/runs/{run_id}/fail", "failRun", "End the run as failed (the body is run_failed's payload)."),
    ending("/api/runs/{run_id}/cancel", "cancelRun", "End the run as cancelled (the body is run_cancelled's payload)."),
    Operation {
        method: "GET",
        path: "/api/runs/{run_id}/events",
        id: "replayEvents",
        summary: "Replay the run's events after a sequence (JSON pages), or follow them live with Accept: text/event-stream.",
        credentials: &[RunToken, Operator, Agent],
        query: &[AFTER_SEQ, EVENT_LIMIT],
        request: None,
        responses: responses![200 => Json("EventPage"), 400 => ERR, 404 => ERR, 429 => ERR],
    },
    Operation {
        method: "GET",
        path: "/api/runs/{run_id}/stream",
        id: "streamEvents",
        summary: "The live stream (Server-Sent Events) on a streaming endpoint.",
        credentials: &[RunToken, Operator, Agent],
        query: &[AFTER_SEQ],
        request: None,
        responses: responses![200 => EventStream, 400 => ERR, 404 => ERR, 429 => ERR],
    },
    Operation {
        method: "GET",
        path: "/api/live",
        id: "liveEndpoints",
        summary: "How to follow runs live here: the WebSocket endpoint (if any) and SSE.",
        credentials: &[],
        query: &[],
        request: None,
        responses: &[(200, Json("LiveEndpoints"))],
    },
    Operation {
        method: "GET",
        path: "/api/ws",
        id: "liveWebSocket",
        summary: "Live delivery over WebSocket (tollgate serve): subscribe to runs, receive their events.",
        credentials: &[RunToken, Operator, Agent],
        query: &[
            text("access_token", "The credential, where the Sec-WebSocket-Protocol header (`tollgate.v1, bearer.<token>`) cannot carry it."),
            text("run_id", "With a run token: the run it is for (required then)."),
        ],
        request: None,
        responses: &[(101, WebSocket), (400, ERR), (401, ERR), (403, ERR), (429, ERR), (503, ERR)],
    },
    Operation {
        method: "POST",
        path: "/api/runs/{run_id}/approval-requests",
        id: "armApproval",
        summary: "Arm an approval card (idempotent per request_id).",
        credentials: &[RunToken],
        query: &[],
        request: Some(Json("ArmApproval")),
        responses: responses![201 => Json("Armed"), 200 => Json("Armed"), 400 => ERR, 404 => ERR, 409 => ERR, 413 => ERR, 429 => ERR],
    },
    Operation {
        method: "GET",
        path: "/api/runs/{run_id}/approval-requests/{request_id}",
        id: "readCard",
        summary: "One card of the run, wherever it stands.",
        credentials: &[RunToken, Operator, PodCredential],
        query: &[],
        request: None,
        responses: responses![200 => Json("Card"), 404 => ERR],
    },
    Operation {
        method: "POST",
        path: "/api/runs/{run_id}/approval-requests/{request_id}/withdraw",
        id: "withdrawCard",
        summary: "Withdraw a pending card the agent no longer needs (it expires as withdrawn, announced).",
        credentials: &[RunToken],
        query: &[],
        request: None,
        responses: responses![200 => Json("Card"), 400 => ERR, 404 => ERR, 409 => ERR],
    },
    Operation {
        method: "POST",
        path: "/api/runs/{run_id}/tool-approvals",
        id: "approve",
        summary: "Approve a pending card, with a scope (once, run, tool, always).",
        credentials: &[Operator],
        query: &[],
        request: Some(Json("Decide")),
        responses: responses![200 => Json("Decided"), 400 => ERR, 404 => ERR, 409 => ERR, 413 => ERR, 429 => ERR],
    },
    Operation {
        method: "POST",
        path: "/api/runs/{run_id}/tool-denials",
        id: "deny",
        summary: "Deny a pending card.",
        credentials: &[Operator],
        query: &[],
        request: Some(Json("Decide")),
        responses: responses![200 => Json("Decided"), 400 => ERR, 404 => ERR, 409 => ERR, 413 => ERR, 429 => ERR],
    },
    Operation {
        method: "POST",
        path: "/api/slack/interactions",
        id: "slackInteraction",
        summary: "Slack's interactivity request URL: an Approve or Deny click on a card message, decided as the operator the Slack user is mapped to (signed by Slack, no bearer token).",
        credentials: &[],
        query: &[],
        request: Some(SlackForm),
        responses: responses![200 => Json("SlackAnswer"), 400 => ERR, 404 => ERR, 413 => ERR],
    },
    Operation {
        method: "GET",
        path: "/api/runs/{run_id}/approvals",
        id: "listRunApprovals",
        summary: "The run's pending cards.",
        credentials: &[Operator],
        query: &[PENDING],
        request: None,
        responses: responses![200 => Json("RunCards"), 400 => ERR, 404 => ERR],
    },
    Operation {
        method: "GET",
        path: "/api/approvals",
        id: "listApprovals",
        summary: "The project's pending cards, soonest deadline first, in pages.",
        credentials: &[Operator],
        query: &[
            PENDING,
            CARD_LIMIT,
            text("after", "The next_after of the previous page."),
        ],
        request: None,
        responses: responses![200 => Json("CardPage"), 400 => ERR],
    },
    Operation {
        method: "GET",
        path: "/api/runs",
        id: "listRuns",
        summary: "One project's runs, newest first, paged with a cursor.",
        credentials: &[Operator],
        query: &[
            RUN_LIMIT,
            text("after", "The next_cursor of the previous page."),
            RUN_STATUS,
            text("owner", "Only runs of this owner (exact)."),
            text("q", "Only runs whose run_id starts with this."),
            text(
                "project_id",
                "The project to list (an operator of every project; default: runs without a project).",
            ),
        ],
        request: None,
        responses: responses![200 => Json("RunList"), 400 => ERR, 403 => ERR],
    },
    Operation {
        method: "GET",
        path: "/api/policies",
        id: "listPolicies",
        summary: "The project's standing grants.",
        credentials: &[Operator],
        query: &[
            POLICY_LIMIT,
            text("cursor", "The next_cursor of the previous page."),
        ],
        request: None,
        responses: responses![200 => Json("PolicyPage"), 400 => ERR],
    },
    Operation {
        method: "DELETE",
        path: "/api/policies/{policy_id}",
        id: "revokePolicy",
        summary: "Revoke a grant; announced on the running streams it reached.",
        credentials: &[Operator],
        query: &[],
        request: None,
        responses: responses![200 => Json("Policy"), 404 => ERR, 409 => ERR],
    },
    Operation {
        method: "GET",
        path: "/api/notifications/dead-letters",
        id: "listDeadLetters",
        summary: "The project's notification deliveries that were given up on, newest first.",
        credentials: &[Operator],
        query: &[
            integer("limit", "At most this many (default 100).", (1, 1000)),
            text("project", "The project to list (operators whose token names no project)."),
        ],
        request: None,
        responses: responses![200 => Json("DeadLetters"), 400 => ERR],
    },
    Operation {
        method: "POST",
        path: "/api/notifications/dead-letters/{delivery_id}/retry",
        id: "retryDeadLetter",
        summary: "Send a dead letter again: due now, its attempts counted afresh.",
        credentials: &[Operator],
        query: &[text("project", "The dead letter's project (operators whose token names no project).")],
        request: None,
        responses: responses![200 => Json("Delivery"), 400 => ERR, 404 => ERR],
    },
    Operation {
        method: "POST",
        path: "/api/runs/{run_id}/tool-calls/{tool_call_id}/start",
        id: "startExecution",
        summary: "Start an approved call: admits it once against the card and the budget.",
        credentials: &[RunToken],
        query: &[],
        request: Some(Json("Start")),
        responses: responses![200 => Json("ExecutionAnswer"), 400 => ERR, 404 => ERR, 409 => ERR, 413 => ERR, 429 => ERR],
    },
    Operation {
        method: "POST",
        path: "/api/runs/{run_id}/tool-calls/{tool_call_id}/dispatch",
        id: "dispatchExecution",
        summary: "Record that the call is leaving for its transport.",
        credentials: &[RunToken],
        query: &[],
        request: Some(Json("Dispatch")),
        responses: responses![200 => Json("ExecutionAnswer"), 400 => ERR, 404 => ERR, 409 => ERR, 413 => ERR],
    },
    Operation {
        method: "POST",
        path: "/api/runs/{run_id}/tool-calls/{tool_call_id}/settle",
        id: "settleExecution",
        summary: "Settle the call by what happened (confirmed, not_sent, ambiguous).",
        credentials: &[RunToken],
        query: &[],
        request: Some(Json("Settle")),
        responses: responses![200 => Json("ExecutionAnswer"), 400 => ERR, 404 => ERR, 409 => ERR, 413 => ERR],
    },
    Operation {
        method: "GET",
        path: "/api/runs/{run_id}/mutations",
        id: "listMutations",
        summary: "The run's mutation records.",
        credentials: &[Operator, RunToken],
        query: &[MUTATION_LIMIT],
        request: None,
        responses: responses![200 => Json("MutationList"), 400 => ERR, 404 => ERR],
    },
    Operation {
        method: "GET",
        path: "/api/runs/{run_id}/mutations/{tool_call_id}/{approval_id}",
        id: "readMutation",
        summary: "One mutation record.",
        credentials: &[Operator, RunToken],
        query: &[],
        request: None,
        responses: responses![200 => Json("MutationRecord"), 404 => ERR],
    },
    Operation {
        method: "POST",
        path: "/api/runs/{run_id}/mutations/{tool_call_id}/{approval_id}/reconcile",
        id: "reconcileMutation",
        summary: "An operator settles an unknown outcome by what they observed.",
        credentials: &[Operator],
        query: &[],
        request: Some(Json("Reconcile")),
        responses: responses![200 => Json("ExecutionAnswer"), 400 => ERR, 404 => ERR, 409 => ERR, 413 => ERR],
    },
    Operation {
        method: "GET",
        path: "/api/openapi.json",
        id: "openapiDocument",
        summary: "This document (tollgate serve only; not deployed).",
        credentials: &[],
        query: &[],
        request: None,
        responses: &[(200, AnyObject)],
    },
    Operation {
        method: "GET",
        path: "/console",
        id: "console",
        summary: "The operator console (HTML).",
        credentials: &[],
        query: &[],
        request: None,
        responses: &[(200, Html)],
    },
    Operation {
        method: "GET",
        path: "/console.js",
        id: "consoleScript",
        summary: "The console's script.",
        credentials: &[],
        query: &[],
        request: None,
        responses: &[(200, JavaScript)],
    },
    Operation {
        method: "GET",
        path: "/api/console/config",
        id: "consoleConfig",
        summary: "The console's settings for the signed-in operator (sub, project, always-eligible tools).",
        credentials: &[Operator],
        query: &[],
        request: None,
        responses: responses![200 => Json("ConsoleConfig")],
    },
    Operation {
        method: "GET",
        path: "/api/console/sign-in",
        id: "consoleSignIn",
        summary: "How the console signs an operator in (a pasted token; the identity provider's authorization code + PKCE when configured).",
        credentials: &[],
        query: &[],
        request: None,
        responses: responses![200 => Json("ConsoleSignIn")],
    },
];

/// The operation at `method` and `path` (a route template).
pub fn find(method: &str, path: &str) -> Option<&'static Operation> {
    OPERATIONS
        .iter()
        .find(|o| o.method.eq_ignore_ascii_case(method) && o.path == path)
}
