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
        arguments_preview: Some(serde_json::Map::new()),
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
    use tollgate_domain::approval as card;
    assert_eq!(limits::MAX_ID_BYTES, card::MAX_REQUEST_ID);
    assert_eq!(limits::MAX_TOOL_NAME, card::MAX_TOOL_NAME);
    assert_eq!(limits::MAX_URL, card::MAX_URL);
    assert_eq!(limits::MAX_TEXT, card::MAX_TEXT);
    assert_eq!(limits::MAX_HASH, card::MAX_HASH);
    assert_eq!(limits::MAX_TIMEOUT_SECONDS, card::MAX_TIMEOUT_SECONDS);
    assert_eq!(limits::MAX_HEAD_TEXT, tollgate_app::runs::MAX_HEAD_TEXT);
    assert_eq!(limits::MAX_ORIGIN, tollgate_app::runs::MAX_ORIGIN);
    assert_eq!(
        limits::MAX_BUDGET_TOOLS,
        tollgate_domain::execution::MAX_BUDGET_TOOLS
    );
    // The producer type pattern and event id bound, at and past their edges.
    assert_eq!(limits::EVENT_TYPE_PATTERN, "^[a-z][a-z0-9_.]{0,63}$");
    let event = |t: &str, id: &str| json!({"type": t, "event_id": id});
    for (ok, t, id) in [
        (
            true,
            format!("a{}", "b".repeat(63)),
            "x".repeat(limits::MAX_EVENT_ID),
        ),
        (false, format!("a{}", "b".repeat(64)), "x".into()),
        (false, "A".into(), "x".into()),
        (false, "a".into(), "x".repeat(limits::MAX_EVENT_ID + 1)),
    ] {
        assert_eq!(
            tollgate_domain::validate_producer_event(event(&t, &id)).is_ok(),
            ok,
            "{t} {id}"
        );
    }
    assert_eq!(
        limits::MAX_LISTED_CARDS,
        tollgate_api::approvals::MAX_OPEN_CARDS
    );
    assert_eq!(
        limits::MAX_LISTED_POLICIES,
        tollgate_api::approvals::MAX_POLICIES
    );
    assert_eq!(
        limits::MAX_LISTED_MUTATIONS,
        tollgate_store::MAX_MUTATIONS_LISTED
    );
    assert_eq!(limits::MAX_LISTED_RUNS, tollgate_api::approvals::MAX_RUNS);
    assert_eq!(limits::MAX_RUNS_EXAMINED, tollgate_store::MAX_RUNS_EXAMINED);
}

/// The bounds the document states on an arm's fields are where the server draws the
/// line: a value at the bound is armed, one past it is a 400 that writes nothing.
#[tokio::test]
async fn an_arm_at_its_documented_bounds_is_taken_and_past_them_refused() {
    let doc = committed();
    let props = &doc["components"]["schemas"]["ArmApproval"]["properties"];
    let server = tollgate_tests::TestServer::start(tollgate_tests::Backend::Memory).await;
    let (run_id, token) = server.create_run(json!({})).await;
    let path = format!("/api/runs/{run_id}/approval-requests");
    let n = std::cell::Cell::new(0);
    let arm = |field: &str, value: Value| {
        n.set(n.get() + 1);
        let mut body =
            json!({"request_id": format!("bounds-{}", n.get()), "tool_name": "web_fetch"});
        body[field] = value;
        body
    };
    for field in ["tool_name", "url", "intention", "message", "arguments_hash"] {
        let max = props[field]["maxLength"]
            .as_u64()
            .unwrap_or_else(|| panic!("{field} has a documented maxLength"))
            as usize;
        assert_eq!(props[field]["minLength"], 1, "{field}");
        let (status, answer) = server
            .post(&path, &token, &arm(field, json!("a".repeat(max))))
            .await;
        assert_eq!(status, 201, "{field} at {max}: {answer}");
        for past in [json!("a".repeat(max + 1)), json!("")] {
            let (status, answer) = server.post(&path, &token, &arm(field, past)).await;
            assert_eq!(status, 400, "{field} past its bound: {answer}");
        }
    }
    for field in ["request_id", "tool_call_id", "approval_id"] {
        assert_eq!(props[field]["pattern"], limits::ID_PATTERN, "{field}");
        let (status, answer) = server
            .post(
                &path,
                &token,
                &arm(
                    field,
                    json!(format!(
                        "{:03}{}",
                        n.get(),
                        "i".repeat(limits::MAX_ID_BYTES - 3)
                    )),
                ),
            )
            .await;
        assert_eq!(status, 201, "{field} at its bound: {answer}");
        for past in [
            "x".repeat(limits::MAX_ID_BYTES + 1),
            "a b".into(),
            String::new(),
        ] {
            let (status, answer) = server.post(&path, &token, &arm(field, json!(past))).await;
            assert_eq!(status, 400, "{field} {past:?}: {answer}");
        }
    }
    let timeout = &props["timeout_seconds"];
    assert_eq!(timeout["minimum"], 1);
    assert_eq!(timeout["maximum"], limits::MAX_TIMEOUT_SECONDS);
    let (status, answer) = server
        .post(&path, &token, &arm("timeout_seconds", json!(0)))
        .await;
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = server
        .post(
            &path,
            &token,
            &arm("timeout_seconds", json!(limits::MAX_TIMEOUT_SECONDS + 1)),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    // Only the armed cards were written: every refusal left nothing.
    let (status, page) = server
        .get(
            &format!("/api/runs/{run_id}/approvals?state=pending"),
            &server.operator_token,
        )
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["approvals"].as_array().unwrap().len(), 5 + 3);
}

/// A decision's `reason` is bounded where the document says: at `maxLength` characters
/// it is recorded, one past it (or a control character, or not a string) is a 400 that
/// decides nothing. An argument preview past its documented size is refused likewise.
#[tokio::test]
async fn a_decision_reason_and_a_preview_at_their_documented_bounds() {
    let doc = committed();
    let reason = &doc["components"]["schemas"]["Decide"]["properties"]["reason"];
    let max = reason["maxLength"]
        .as_u64()
        .expect("reason has a maxLength") as usize;
    assert_eq!(max, limits::MAX_REASON);
    assert_eq!(reason["pattern"], limits::REASON_PATTERN);
    let server = tollgate_tests::TestServer::start(tollgate_tests::Backend::Memory).await;
    let (run_id, token) = server.create_run(json!({})).await;
    let arm_path = format!("/api/runs/{run_id}/approval-requests");
    for rid in ["at", "past"] {
        let (status, v) = server
            .post(
                &arm_path,
                &token,
                &json!({"request_id": rid, "tool_name": "t"}),
            )
            .await;
        assert_eq!(status, 201, "{v}");
    }
    let decide = format!("/api/runs/{run_id}/tool-denials");
    for past in [
        json!("é".repeat(max + 1)),
        json!("tab\there"),
        json!(1),
        json!(null),
    ] {
        let (status, v) = server
            .post(
                &decide,
                &server.operator_token,
                &json!({"request_id": "past", "reason": past}),
            )
            .await;
        // (`null` is no reason at all: the decision stands without one.)
        if past.is_null() {
            assert_eq!(status, 200, "{v}");
            assert!(v.get("decision_reason").is_none(), "{v}");
            continue;
        }
        assert_eq!(status, 400, "{past}: {v}");
        let (_, card) = server.get(&format!("{arm_path}/past"), &token).await;
        assert_eq!(card["state"], "pending", "{card}");
    }
    let (status, v) = server
        .post(
            &decide,
            &server.operator_token,
            &json!({"request_id": "at", "reason": "é".repeat(max)}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["decision_reason"], json!("é".repeat(max)));
    // The preview's bound is on its serialized size after redaction: just under it is
    // stored, just over it refused.
    // `{"k":["v…","v…",…]}` of exactly `bytes` bytes, no string over the cut.
    let long_strings = |bytes: usize| {
        let mut items = Vec::new();
        let mut left = bytes - r#"{"k":[]}"#.len();
        while left > 0 {
            let overhead = 2 + usize::from(!items.is_empty());
            let len = (left - overhead).min(limits::MAX_PREVIEW_STRING);
            items.push(json!("v".repeat(len)));
            left -= overhead + len;
        }
        json!({ "k": items })
    };
    let at = long_strings(limits::MAX_PREVIEW_BYTES);
    assert_eq!(
        serde_json::to_string(&at).unwrap().len(),
        limits::MAX_PREVIEW_BYTES
    );
    let (status, v) = server
        .post(
            &arm_path,
            &token,
            &json!({"request_id": "preview-at", "tool_name": "t", "arguments_preview": at}),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let past = long_strings(limits::MAX_PREVIEW_BYTES + 1);
    let (status, v) = server
        .post(
            &arm_path,
            &token,
            &json!({"request_id": "preview-past", "tool_name": "t", "arguments_preview": past}),
        )
        .await;
    assert_eq!(status, 400, "{v}");
}

/// Every link of the document leads somewhere real: from a status its operation answers,
/// to an operation of the document, naming only that operation's parameters and (for a
/// body) properties of its request body.
#[test]
fn the_documents_links_lead_to_real_operations() {
    let doc = committed();
    let ops: Vec<(&str, &Value)> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .map(|op| (op["operationId"].as_str().unwrap(), op))
        .collect();
    let find = |id: &str| ops.iter().find(|(i, _)| *i == id).map(|(_, op)| *op);
    let mut seen = 0;
    for (id, op) in &ops {
        for (status, response) in op["responses"].as_object().unwrap() {
            let Some(links) = response.get("links").and_then(Value::as_object) else {
                continue;
            };
            assert!(
                status.starts_with('2'),
                "{id} {status}: links follow a success"
            );
            for (name, link) in links {
                seen += 1;
                let to = link["operationId"].as_str().unwrap();
                let target = find(to).unwrap_or_else(|| panic!("{id}.{name}: no operation {to}"));
                let params: BTreeSet<&str> = target["parameters"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p["name"].as_str().unwrap())
                    .collect();
                let required: BTreeSet<&str> = target["parameters"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|p| p["in"] == "path")
                    .map(|p| p["name"].as_str().unwrap())
                    .collect();
                let given: BTreeSet<&str> = link["parameters"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .map(String::as_str)
                    .collect();
                assert!(
                    given.is_subset(&params),
                    "{id}.{name}: {given:?} ⊄ {params:?}"
                );
                assert!(
                    required.is_subset(&given),
                    "{id}.{name}: path {required:?} not all given"
                );
                if let Some(body) = link.get("requestBody").and_then(Value::as_object) {
                    let schema = target["requestBody"]["content"]["application/json"]["schema"]
                        ["$ref"]
                        .as_str()
                        .and_then(|r| r.strip_prefix("#/components/schemas/"))
                        .unwrap_or_else(|| panic!("{id}.{name}: {to} takes no typed body"));
                    let props = &doc["components"]["schemas"][schema]["properties"];
                    for k in body.keys() {
                        assert!(props.get(k).is_some(), "{id}.{name}: {schema} has no {k}");
                    }
                }
            }
        }
    }
    assert_eq!(seen, tollgate_protocol::openapi::LINKS.len());
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

/// The document's error codes are the server's (one type: the server answers with
/// `tollgate_protocol::errors::ErrorCode`), each once, each read back by its name.
#[test]
fn the_documented_error_codes_are_the_servers() {
    let server: Vec<&str> = tollgate_api::ErrorCode::ALL
        .iter()
        .map(|c| c.as_str())
        .collect();
    let unique: BTreeSet<&str> = server.iter().copied().collect();
    assert_eq!(unique.len(), server.len());
    for code in tollgate_api::ErrorCode::ALL {
        assert_eq!(
            tollgate_protocol::errors::ErrorCode::parse(code.as_str()),
            Some(code)
        );
    }
    let doc = tollgate_protocol::openapi::document();
    let documented: Vec<&str> = doc["components"]["schemas"]["ErrorBody"]["properties"]["code"]
        ["enum"]
        .as_array()
        .expect("code is an enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(documented, server);
}

/// Every example the document shows is a value of its type: it reads into the type and
/// writes back the same (so an example cannot drift from the contract), and every schema
/// that shows one is checked here.
#[test]
fn every_example_is_a_value_of_its_type() {
    fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) -> Value {
        let typed: T = serde_json::from_value(v.clone())
            .unwrap_or_else(|e| panic!("{v} is not a {}: {e}", std::any::type_name::<T>()));
        serde_json::to_value(typed).unwrap()
    }
    type Check = fn(&Value) -> Value;
    let checks: Vec<(&str, Check)> = vec![
        ("CreateRun", round_trip::<runs::CreateRun>),
        ("AppendEvents", round_trip::<runs::AppendEvents>),
        ("RunReceipt", round_trip::<runs::RunReceipt>),
        ("Appended", round_trip::<runs::Appended>),
        ("RunEnded", round_trip::<runs::RunEnded>),
        ("RunSummary", round_trip::<runs::RunSummary>),
        ("RunList", round_trip::<runs::RunList>),
        ("ArmApproval", round_trip::<approvals::ArmApproval>),
        ("Armed", round_trip::<approvals::Armed>),
        ("Decide", round_trip::<approvals::Decide>),
        ("Decided", round_trip::<approvals::Decided>),
        (
            "SlackAnswer",
            round_trip::<tollgate_protocol::slack::SlackAnswer>,
        ),
        ("Start", round_trip::<execution::Start>),
        ("Dispatch", round_trip::<execution::Dispatch>),
        ("Settle", round_trip::<execution::Settle>),
        ("Reconcile", round_trip::<execution::Reconcile>),
        ("ExecutionAnswer", round_trip::<execution::ExecutionAnswer>),
        ("MutationRecord", round_trip::<execution::MutationRecord>),
        ("ErrorBody", round_trip::<tollgate_protocol::ErrorBody>),
        ("Event", round_trip::<tollgate_protocol::Event>),
    ];
    let doc = committed();
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let mut checked = BTreeSet::new();
    for (name, schema) in schemas {
        let Some(examples) = schema.get("examples").and_then(Value::as_array) else {
            continue;
        };
        let check = checks
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{name} shows an example this test does not check"))
            .1;
        assert!(!examples.is_empty(), "{name}");
        for example in examples {
            assert_eq!(&check(example), example, "{name}'s example");
        }
        checked.insert(name.as_str());
    }
    let all: BTreeSet<&str> = checks.iter().map(|(n, _)| *n).collect();
    assert_eq!(checked, all, "every type listed here shows an example");
}
