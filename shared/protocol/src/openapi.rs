//! The OpenAPI 3.1 document, generated from [`crate::operations::OPERATIONS`] and the
//! JSON Schemas of this crate's types (JSON Schema 2020-12, which OpenAPI 3.1 uses).
//! `openapi.json` at the repository's root is this document; `tests/openapi.rs` fails
//! when they differ.

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{json, Map, Value};

use crate::operations::{Body, Credential, Operation, OPERATIONS};
use crate::{approvals, console, errors, events, execution, runs};

/// The grammar of the live stream, for the stream operations' descriptions.
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
        ("ArmApproval", of::<approvals::ArmApproval>(generator)),
        ("Armed", of::<approvals::Armed>(generator)),
        ("Decide", of::<approvals::Decide>(generator)),
        ("Decided", of::<approvals::Decided>(generator)),
        ("Card", of::<approvals::Card>(generator)),
        ("CardPage", of::<approvals::CardPage>(generator)),
        ("RunCards", of::<approvals::RunCards>(generator)),
        ("Policy", of::<approvals::Policy>(generator)),
        ("PolicyPage", of::<approvals::PolicyPage>(generator)),
        ("Start", of::<execution::Start>(generator)),
        ("Dispatch", of::<execution::Dispatch>(generator)),
        ("Settle", of::<execution::Settle>(generator)),
        ("Reconcile", of::<execution::Reconcile>(generator)),
        ("MutationRecord", of::<execution::MutationRecord>(generator)),
        ("MutationList", of::<execution::MutationList>(generator)),
        ("ExecutionAnswer", of::<execution::ExecutionAnswer>(generator)),
        ("StreamEnd", of::<events::StreamEnd>(generator)),
        ("ApprovalRequired", of::<events::ApprovalRequired>(generator)),
        ("ApprovalResolved", of::<events::ApprovalResolved>(generator)),
        ("ConsoleConfig", of::<console::ConsoleConfig>(generator)),
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
        Body::JavaScript => json!({"text/javascript": {"schema": {"type": "string"}}}),
    }
}

fn status_text(status: u16) -> &'static str {
    match status {
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
        let schema = match q.kind {
            "integer" => json!({"type": "integer", "minimum": 0}),
            _ => json!({"type": "string"}),
        };
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
    if let Some(body) = op.request {
        o["requestBody"] =
            json!({"required": matches!(body, Body::Json(_)), "content": content(body)});
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
