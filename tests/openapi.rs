//! The OpenAPI document is the contract's types and operation list, and nothing else:
//! the committed `openapi.json` is what `tollgate-protocol` generates, it names exactly
//! the routes the server declares, its schemas carry the field names the types put on
//! the wire, its bounds are the server's, and `tollgate serve` serves it.

use std::collections::BTreeSet;

use serde_json::{json, Value};
use tollgate_protocol::operations::OPERATIONS;
use tollgate_protocol::{approvals, execution, limits, runs};

fn committed() -> Value {
    serde_json::from_str(tollgate_api::OPENAPI_JSON).expect("openapi.json is JSON")
}

#[test]
fn the_committed_document_is_the_generated_one() {
    let generated = tollgate_protocol::openapi::document();
    assert!(
        committed() == generated,
        "openapi.json differs from the document tollgate-protocol generates: run `make openapi`"
    );
    assert_eq!(generated["openapi"], "3.1.0");
}

#[test]
fn the_document_names_exactly_the_routes_the_server_declares() {
    let declared = tollgate_tests::routes::code_routes();
    let documented: BTreeSet<String> = OPERATIONS
        .iter()
        .map(|o| format!("{} {}", o.method, o.path))
        .collect();
    assert_eq!(
        declared.difference(&documented).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "routes the server declares that the document leaves out"
    );
    assert_eq!(
        documented.difference(&declared).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "documented routes the server does not serve"
    );
    // And the document holds every operation, once.
    let doc = committed();
    let mut ids = BTreeSet::new();
    for o in OPERATIONS {
        let op = &doc["paths"][o.path][o.method.to_ascii_lowercase()];
        assert_eq!(op["operationId"], o.id, "{} {}", o.method, o.path);
        assert!(ids.insert(o.id), "operationId {} twice", o.id);
        for (status, _) in o.responses {
            assert!(op["responses"][status.to_string()].is_object());
        }
    }
}

/// The keys a value of a type puts on the wire, with every optional field set.
fn wire_keys(value: Value) -> BTreeSet<String> {
    value
        .as_object()
        .expect("an object")
        .keys()
        .cloned()
        .collect()
}

fn schema_keys(doc: &Value, name: &str) -> BTreeSet<String> {
    doc["components"]["schemas"][name]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("{name} has properties"))
        .keys()
        .cloned()
        .collect()
}

/// A field renamed in `tollgate-protocol` renames it in the document: each schema's
/// properties are the keys its type serializes.
#[test]
fn schemas_carry_the_field_names_the_types_serialize() {
    let doc = tollgate_protocol::openapi::document();
    let s = || Some("x".to_string());
    let create = runs::CreateRun {
        run_id: s(),
        kind: s(),
        parent_run_id: s(),
        subtask_id: Some(json!(1)),
        owner: s(),
        project_id: s(),
        channel_id: s(),
        delivery_id: s(),
        budget: Some(json!({})),
        execution_mode: s(),
        agenthost_origin: s(),
    };
    assert_eq!(schema_keys(&doc, "CreateRun"), wire_keys(json!(create)));
    let arm = approvals::ArmApproval {
        request_id: "r".into(),
        tool_name: "t".into(),
        tool_call_id: s(),
        approval_id: s(),
        url: s(),
        intention: s(),
        message: s(),
        arguments_hash: s(),
        timeout_seconds: Some(1),
    };
    assert_eq!(schema_keys(&doc, "ArmApproval"), wire_keys(json!(arm)));
    let settle = execution::Settle {
        approval_id: "a".into(),
        evidence: "confirmed".into(),
        result: Some(json!(1)),
        error: Some(json!(1)),
    };
    assert_eq!(schema_keys(&doc, "Settle"), wire_keys(json!(settle)));
    let receipt = runs::RunReceipt {
        run_id: "r".into(),
        run_token: "t".into(),
        sequence: 1,
        agenthost_credential: s(),
        status: s(),
    };
    assert_eq!(schema_keys(&doc, "RunReceipt"), wire_keys(json!(receipt)));
    // Required is what a client may count on.
    let required: BTreeSet<&str> = doc["components"]["schemas"]["RunReceipt"]["required"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        required,
        BTreeSet::from(["run_id", "run_token", "sequence"])
    );
}

#[test]
fn the_documented_bounds_are_the_servers() {
    assert_eq!(limits::MAX_BATCH_EVENTS, tollgate_domain::MAX_BATCH_EVENTS);
    assert_eq!(
        limits::MAX_BODY_BYTES,
        tollgate_api::request::MAX_BODY_BYTES
    );
    assert_eq!(limits::MAX_PAGE_EVENTS, tollgate_api::replay::MAX_LIMIT);
    let pattern = limits::ID_PATTERN;
    for id in ["run-1", "a.b:c_d", &"x".repeat(limits::MAX_ID_BYTES)] {
        assert!(tollgate_domain::validate_run_id(id), "{id}");
        assert!(pattern.contains("{1,128}"), "{pattern}");
    }
    assert!(!tollgate_domain::validate_run_id(
        &"x".repeat(limits::MAX_ID_BYTES + 1)
    ));
}

#[tokio::test]
async fn tollgate_serve_serves_the_document() {
    let server = tollgate_tests::TestServer::start(tollgate_tests::Backend::Memory).await;
    let answer = reqwest::get(format!("{}/api/openapi.json", server.base))
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let served: Value = answer.json().await.unwrap();
    assert_eq!(served, committed());
}

/// The document's error codes are the server's, each once.
#[test]
fn the_documented_error_codes_are_the_servers() {
    let server: Vec<&str> = tollgate_api::ErrorCode::ALL
        .iter()
        .map(|c| c.as_str())
        .collect();
    assert_eq!(server, tollgate_protocol::errors::CODES);
    let doc = tollgate_protocol::openapi::document();
    let documented: Vec<&str> = doc["components"]["schemas"]["ErrorBody"]["properties"]["code"]
        ["enum"]
        .as_array()
        .expect("code is an enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(documented, tollgate_protocol::errors::CODES);
}
