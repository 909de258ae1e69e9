//! The OpenAPI 3.1 document, generated from [`crate::operations::OPERATIONS`] and the
//! JSON Schemas of this crate's types (JSON Schema 2020-12, which OpenAPI 3.1 uses).
//! `openapi.json` at the repository's root is this document; `tests/openapi.rs` fails
//! when they differ.

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{json, Map, Value};

use crate::operations::{Body, Credential, Operation, OPERATIONS};
use crate::{approvals, console, errors, events, execution, payloads, runs, slack, ws};

/// The grammar of the live stream, for the stream operations' descriptions.
/// The WebSocket protocol, for the upgrade's description.
const WS_GRAMMAR: &str = "WebSocket (subprotocol `tollgate.v1`; the credential as a second \
subprotocol `bearer.<token>`, or `?access_token=`; a run token also names its run with \
`?run_id=`). The client sends `WsClientMessage`s (`{\"action\":\"subscribe\",\"run_id\",\"after\"}`, \
`unsubscribe`, `ping`); the server sends `WsFrame`s: per subscription a `subscribed` frame, \
every event after `after` (`id` = sequence, `data` = the event as replay serves it), live \
events as they commit, and `done` after the terminal event; `error` frames carry an \
`ErrorBody`. A client keeps the last sequence it delivered per run, drops frames at or \
below it, and resubscribes with `after` on a gap or a reconnect.";

const SSE_GRAMMAR: &str = "Server-Sent Events. The stream opens with `retry: 1000`; each \
event is a frame `id: <sequence>`, `event: <type>`, `data: <the event's JSON envelope>` \
and a blank line; `: keep-alive` comment lines come while nothing happens; when the run \
has ended the stream sends `event: done` with `data: <StreamEnd>` \
(`{\"run_id\", \"terminal_sequence\"}`) and closes. A client that drops resumes with `Last-Event-ID: <last id>` (or `?after=`) and \
gets every later event exactly once, in order. A stream also ends after its time window; \
resume the same way.";

/// Every named body: its name in `components/schemas` and how to describe it.
fn named(generator: &mut SchemaGenerator) -> Vec<(&'static str, Value)> {
    fn of<T: JsonSchema>(g: &mut SchemaGenerator) -> Value {
        g.root_schema_for::<T>().to_value()
    }
    vec![
        ("ErrorBody", of::<errors::ErrorBody>(generator)),
        ("Event", of::<events::Event>(generator)),
        ("EventPage", of::<events::EventPage>(generator)),
        ("CreateRun", of::<runs::CreateRun>(generator)),
        ("RunReceipt", of::<runs::RunReceipt>(generator)),
        ("AppendEvents", of::<runs::AppendEvents>(generator)),
        ("Appended", of::<runs::Appended>(generator)),
        ("RunEnded", of::<runs::RunEnded>(generator)),
        ("RunSummary", of::<runs::RunSummary>(generator)),
        ("RunList", of::<runs::RunList>(generator)),
        ("ArmApproval", of::<approvals::ArmApproval>(generator)),
        ("Armed", of::<approvals::Armed>(generator)),
        ("Decide", of::<approvals::Decide>(generator)),
        ("Decided", of::<approvals::Decided>(generator)),
        ("SlackAnswer", of::<slack::SlackAnswer>(generator)),
        ("Card", of::<approvals::Card>(generator)),
        ("CardPage", of::<approvals::CardPage>(generator)),
        ("RunCards", of::<approvals::RunCards>(generator)),
        ("Policy", of::<approvals::Policy>(generator)),
        ("PolicyPage", of::<approvals::PolicyPage>(generator)),
        ("Delivery", of::<crate::notifications::Delivery>(generator)),
        (
            "DeadLetters",
            of::<crate::notifications::DeadLetters>(generator),
        ),
        ("Start", of::<execution::Start>(generator)),
        ("Dispatch", of::<execution::Dispatch>(generator)),
        ("Settle", of::<execution::Settle>(generator)),
        ("Reconcile", of::<execution::Reconcile>(generator)),
        ("MutationRecord", of::<execution::MutationRecord>(generator)),
        ("MutationList", of::<execution::MutationList>(generator)),
        (
            "ExecutionAnswer",
            of::<execution::ExecutionAnswer>(generator),
        ),
        ("StreamEnd", of::<events::StreamEnd>(generator)),
        ("LiveEndpoints", of::<ws::LiveEndpoints>(generator)),
        ("WsClientMessage", of::<ws::ClientMessage>(generator)),
        ("WsFrame", of::<ws::Frame>(generator)),
        ("ConsoleConfig", of::<console::ConsoleConfig>(generator)),
        ("ConsoleSignIn", of::<console::ConsoleSignIn>(generator)),
        ("ConsoleOidc", of::<console::ConsoleOidc>(generator)),
        ("RunStarted", of::<payloads::RunStarted>(generator)),
        (
            "ApprovalRequired",
            of::<payloads::ApprovalRequired>(generator),
        ),
        (
            "ApprovalPending",
            of::<payloads::ApprovalPending>(generator),
        ),
        (
            "ApprovalResolved",
            of::<payloads::ApprovalResolved>(generator),
        ),
        ("AutoApproved", of::<payloads::AutoApproved>(generator)),
        ("PolicyRevoked", of::<payloads::PolicyRevoked>(generator)),
        (
            "ChildApprovalRequired",
            of::<payloads::ChildApprovalRequired>(generator),
        ),
        (
            "ChildApprovalResolved",
            of::<payloads::ChildApprovalResolved>(generator),
        ),
        (
            "ChildStallDetected",
            of::<payloads::ChildStallDetected>(generator),
        ),
        ("ExecutionIds", of::<payloads::ExecutionIds>(generator)),
        ("ToolExecution", of::<payloads::ToolExecution>(generator)),
        (
            "ExecutionReconciled",
            of::<payloads::ExecutionReconciled>(generator),
        ),
        (
            "ExecutionUpdated",
            of::<payloads::ExecutionUpdated>(generator),
        ),
    ]
}

/// A type's schema as a component: `$schema` dropped, its own `$defs` lifted into the
/// components (references rewritten to `#/components/schemas/…`).
fn component(mut schema: Value, defs: &mut Map<String, Value>) -> Value {
    if let Value::Object(m) = &mut schema {
        m.remove("$schema");
        m.remove("title");
        if let Some(Value::Object(inner)) = m.remove("$defs") {
            for (k, v) in inner {
                let v = component(v, defs);
                defs.insert(k, v);
            }
        }
    }
    rewrite_refs(&mut schema);
    schema
}

fn rewrite_refs(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get_mut("$ref") {
                if let Some(name) = r.strip_prefix("#/$defs/") {
                    *r = format!("#/components/schemas/{name}");
                }
            }
            m.values_mut().for_each(rewrite_refs);
        }
        Value::Array(a) => a.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}

fn content(body: Body) -> Value {
    match body {
        Body::Json(name) => {
            json!({"application/json": {"schema": {"$ref": format!("#/components/schemas/{name}")}}})
        }
        Body::AnyObject => json!({"application/json": {"schema": {"type": "object"}}}),
        // Each event of the stream as an SSE reader parses it (its fields as strings;
        // `data` is the event's JSON envelope, `Event`).
        Body::EventStream => json!({"text/event-stream": {"schema": {
            "type": "object",
            "description": SSE_GRAMMAR,
            "properties": {
                "id": {"type": "string"},
                "event": {"type": "string"},
                "data": {"type": "string", "contentMediaType": "application/json"},
                "retry": {"type": ["string", "integer"]},
            },
        }}}),
        Body::Html => json!({"text/html": {"schema": {"type": "string"}}}),
        Body::SlackForm => json!({"application/x-www-form-urlencoded": {"schema": {
            "type": "object",
            "description": "As Slack sends an interaction: `payload`, the interaction's JSON. \
                Signed by Slack (`X-Slack-Request-Timestamp`, `X-Slack-Signature: v0=<hex \
                HMAC-SHA256 of v0:<timestamp>:<raw body> under the app's signing secret>`); \
                a missing, wrong or stale (more than 300 s away) signature is 401.",
            "properties": {"payload": {"type": "string", "contentMediaType": "application/json"}},
            "required": ["payload"],
        }}}),
        Body::JavaScript => json!({"text/javascript": {"schema": {"type": "string"}}}),
        Body::WebSocket => json!({}),
    }
}

/// The links of the document: how one answer's values feed the next operation (a
/// run's life: create → append / arm / replay / end; arm → decide / read the card;
/// start → dispatch → settle). Each: the operation and status it follows, its name,
/// the operation it leads to, that operation's parameters and (a JSON object's fields)
/// body, as runtime expressions.
pub const LINKS: &[Link] = &[
    link(
        "createRun",
        201,
        "AppendEvents",
        "appendEvents",
        RUN_FROM_BODY,
        &[],
    ),
    link(
        "createRun",
        201,
        "ArmApproval",
        "armApproval",
        RUN_FROM_BODY,
        &[],
    ),
    link(
        "createRun",
        201,
        "ReplayEvents",
        "replayEvents",
        RUN_FROM_BODY,
        &[],
    ),
    link(
        "createRun",
        201,
        "StreamEvents",
        "streamEvents",
        RUN_FROM_BODY,
        &[],
    ),
    link(
        "createRun",
        201,
        "CompleteRun",
        "completeRun",
        RUN_FROM_BODY,
        &[],
    ),
    link(
        "appendEvents",
        200,
        "ArmApproval",
        "armApproval",
        RUN_FROM_PATH,
        &[],
    ),
    link(
        "appendEvents",
        200,
        "ReplayEvents",
        "replayEvents",
        RUN_FROM_PATH,
        &[],
    ),
    link(
        "armApproval",
        201,
        "Approve",
        "approve",
        RUN_FROM_PATH,
        &[
            ("request_id", "$response.body#/request_id"),
            ("scope", "once"),
        ],
    ),
    link(
        "armApproval",
        201,
        "Deny",
        "deny",
        RUN_FROM_PATH,
        &[("request_id", "$response.body#/request_id")],
    ),
    link(
        "armApproval",
        201,
        "ReadCard",
        "readCard",
        &[
            ("run_id", "$request.path.run_id"),
            ("request_id", "$response.body#/request_id"),
        ],
        &[],
    ),
    link(
        "approve",
        200,
        "ReadCard",
        "readCard",
        &[
            ("run_id", "$response.body#/run_id"),
            ("request_id", "$response.body#/request_id"),
        ],
        &[],
    ),
    link(
        "approve",
        200,
        "ReplayEvents",
        "replayEvents",
        &[("run_id", "$response.body#/run_id")],
        &[],
    ),
    link(
        "approve",
        200,
        "ListRunApprovals",
        "listRunApprovals",
        RUN_FROM_PATH,
        &[],
    ),
    link(
        "deny",
        200,
        "ReadCard",
        "readCard",
        &[
            ("run_id", "$response.body#/run_id"),
            ("request_id", "$response.body#/request_id"),
        ],
        &[],
    ),
    link(
        "startExecution",
        200,
        "Dispatch",
        "dispatchExecution",
        CALL_FROM_PATH,
        &[("approval_id", "$request.body#/approval_id")],
    ),
    link(
        "startExecution",
        200,
        "NotSent",
        "settleExecution",
        CALL_FROM_PATH,
        &[
            ("approval_id", "$request.body#/approval_id"),
            ("evidence", "not_sent"),
        ],
    ),
    link(
        "dispatchExecution",
        200,
        "Settle",
        "settleExecution",
        CALL_FROM_PATH,
        &[
            ("approval_id", "$request.body#/approval_id"),
            ("evidence", "confirmed"),
        ],
    ),
    link(
        "settleExecution",
        200,
        "ReadMutation",
        "readMutation",
        &[
            ("run_id", "$request.path.run_id"),
            ("tool_call_id", "$request.path.tool_call_id"),
            ("approval_id", "$request.body#/approval_id"),
        ],
        &[],
    ),
];

/// One link: from operation `from`'s answer `status`, named `name`, to operation `to`
/// with `parameters` and (a JSON object's fields) `body`, as runtime expressions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub from: &'static str,
    pub status: u16,
    pub name: &'static str,
    pub to: &'static str,
    pub parameters: &'static [(&'static str, &'static str)],
    pub body: &'static [(&'static str, &'static str)],
}

const fn link(
    from: &'static str,
    status: u16,
    name: &'static str,
    to: &'static str,
    parameters: &'static [(&'static str, &'static str)],
    body: &'static [(&'static str, &'static str)],
) -> Link {
    Link {
        from,
        status,
        name,
        to,
        parameters,
        body,
    }
}

const RUN_FROM_BODY: &[(&str, &str)] = &[("run_id", "$response.body#/run_id")];
const RUN_FROM_PATH: &[(&str, &str)] = &[("run_id", "$request.path.run_id")];
const CALL_FROM_PATH: &[(&str, &str)] = &[
    ("run_id", "$request.path.run_id"),
    ("tool_call_id", "$request.path.tool_call_id"),
];

/// The links that follow `op`'s answer `status`, as the document's `links` object.
fn links(op: &Operation, status: u16) -> Option<Value> {
    let mut out = Map::new();
    for Link {
        from,
        status: at,
        name,
        to,
        parameters,
        body,
    } in LINKS
    {
        if *from != op.id || *at != status {
            continue;
        }
        let parameters: Map<String, Value> = parameters
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
            .collect();
        let mut link = json!({"operationId": to, "parameters": parameters});
        if !body.is_empty() {
            let body: Map<String, Value> = body
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
                .collect();
            link["requestBody"] = Value::Object(body);
        }
        out.insert((*name).to_owned(), link);
    }
    (!out.is_empty()).then_some(Value::Object(out))
}

fn status_text(status: u16) -> &'static str {
    match status {
        101 => "Switching Protocols: the WebSocket is open",
        200 => "OK",
        201 => "Created",
        400 => "Invalid request: the body, a parameter or an id (nothing written)",
        401 => "No credential, or one that does not verify",
        403 => "The credential may not do this",
        404 => "No such run, card, record or route (or not the caller's to see)",
        409 => "Conflict: the run has ended, the card is not pending, an id is taken",
        413 => "The body is over 256 KiB",
        429 => "A tenant's cap or a stream limit is reached; retry after Retry-After",
        503 => "Storage or a pod is unavailable; retry after Retry-After (nothing written)",
        _ => "Answer",
    }
}

fn operation(op: &Operation) -> Value {
    let mut parameters: Vec<Value> = op
        .path
        .split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .map(|name| {
            json!({
                "name": name,
                "in": "path",
                "required": true,
                "schema": {"type": "string", "pattern": crate::limits::ID_PATTERN},
            })
        })
        .collect();
    for q in op.query {
        let mut schema = match q.kind {
            "integer" => json!({"type": "integer", "minimum": 0}),
            _ => json!({"type": "string"}),
        };
        if let Some((min, max)) = q.range {
            schema["minimum"] = min.into();
            schema["maximum"] = max.into();
        }
        if !q.values.is_empty() {
            schema["enum"] = json!(q.values);
        }
        parameters.push(json!({
            "name": q.name, "in": "query", "required": false,
            "description": q.description, "schema": schema,
        }));
    }
    let mut responses = Map::new();
    for (status, body) in op.responses {
        let mut r = json!({"description": status_text(*status), "content": content(*body)});
        let mut headers = json!({"x-request-id": {"schema": {"type": "string"}, "description": "The request's id (the caller's x-request-id when it is 1-64 of [A-Za-z0-9._-]); error bodies carry it as request_id."}});
        if *status == 429 || *status == 503 {
            headers["Retry-After"] = json!({"schema": {"type": "integer"}, "description": "Seconds to wait before retrying."});
        }
        r["headers"] = headers;
        if let Some(links) = links(op, *status) {
            r["links"] = links;
        }
        responses.insert(status.to_string(), r);
    }
    let mut o = json!({
        "operationId": op.id,
        "summary": op.summary,
        "parameters": parameters,
        "responses": responses,
    });
    if op.responses.iter().any(|(_, b)| *b == Body::EventStream) {
        o["description"] = SSE_GRAMMAR.into();
    }
    if op.responses.iter().any(|(_, b)| *b == Body::WebSocket) {
        o["description"] = WS_GRAMMAR.into();
    }
    if let Some(body) = op.request {
        o["requestBody"] = json!({"required": matches!(body, Body::Json(_) | Body::SlackForm), "content": content(body)});
    }
    o["security"] = if op.credentials.is_empty() {
        json!([])
    } else {
        Value::Array(
            op.credentials
                .iter()
                .map(|c| json!({ c.scheme(): [] }))
                .collect(),
        )
    };
    o
}

/// The whole document.
pub fn document() -> Value {
    let mut generator = SchemaSettings::draft2020_12().into_generator();
    let mut schemas = Map::new();
    let mut defs = Map::new();
    for (name, schema) in named(&mut generator) {
        schemas.insert(name.into(), component(schema, &mut defs));
    }
    for (k, v) in defs {
        schemas.entry(k).or_insert(v);
    }
    // Which schema each server-written event's payload is.
    let by_type: Vec<String> = crate::payloads::PAYLOADS
        .iter()
        .map(|(t, schema)| format!("`{t}`: `{schema}`"))
        .collect();
    if let Some(event) = schemas.get_mut("Event") {
        let said = event["description"].as_str().unwrap_or_default().to_owned();
        event["description"] = format!(
            "{said}\n\nThe payload of each event type Tollgate writes (its keys beside the envelope's): {}. A terminal event (`run_completed`, `run_failed`, `run_cancelled`) carries what the agent sent; a producer event, what its producer appended.",
            by_type.join(", ")
        )
        .into();
    }
    let mut paths = Map::new();
    for op in OPERATIONS {
        let entry = paths
            .entry(op.path.to_string())
            .or_insert_with(|| json!({}));
        entry[op.method.to_ascii_lowercase()] = operation(op);
    }
    let bearer =
        |description: &str| json!({"type": "http", "scheme": "bearer", "description": description});
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Tollgate",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Human approval for AI-agent tool calls, with every run a durable, sequenced, replayable event stream. Errors are JSON ErrorBody objects; every response carries x-request-id.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                Credential::Agent.scheme(): bearer("An agent JWT (HS256 with the deployment's secret, or from its identity provider): role agent, sub, project_id."),
                Credential::Operator.scheme(): bearer("An operator JWT: role operator, sub, project_id."),
                Credential::RunToken.scheme(): bearer("The run token POST /api/runs answered (rt.…): acts on that run only."),
                Credential::PodCredential.scheme(): bearer("A pod-per-run run's AgentHost credential (pc.…)."),
            },
        },
    })
}
