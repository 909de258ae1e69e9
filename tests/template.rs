//! `infra/template.yaml` is the one source of truth: these tests hold the code and the
//! template to each other — table definitions used locally, function binaries, and each
//! function's least-privilege role.

use std::collections::{BTreeMap, BTreeSet};

use serde_yaml_ng::Value;
use tollgate_store::schema::{table_defs, TEMPLATE};

fn template() -> Value {
    serde_yaml_ng::from_str(TEMPLATE).expect("template parses")
}

fn resources(doc: &Value) -> &serde_yaml_ng::Mapping {
    doc.get("Resources")
        .and_then(Value::as_mapping)
        .expect("Resources")
}

fn of_type<'a>(doc: &'a Value, ty: &str) -> Vec<(String, &'a Value)> {
    resources(doc)
        .iter()
        .filter(|(_, r)| r.get("Type").and_then(Value::as_str) == Some(ty))
        .map(|(k, r)| (k.as_str().unwrap().to_owned(), r))
        .collect()
}

/// The logical id a `Resource` entry points at: `!GetAtt X.Arn` or `!Sub "${X.Arn}/…"`.
fn referenced(resource: &Value) -> (String, String) {
    match resource {
        Value::Tagged(t) if t.tag == "!GetAtt" => {
            let target = t.value.as_str().expect("!GetAtt X.Arn");
            (
                target.split('.').next().unwrap().to_owned(),
                target.to_owned(),
            )
        }
        Value::Tagged(t) if t.tag == "!Sub" => {
            let s = t.value.as_str().expect("!Sub string");
            let inner = s
                .strip_prefix("${")
                .and_then(|r| r.split_once('}'))
                .expect("${X.Arn}…");
            (inner.0.split('.').next().unwrap().to_owned(), s.to_owned())
        }
        other => panic!("IAM resource must reference a template resource, got {other:?}"),
    }
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Sequence(seq) => seq.iter().map(|x| x.as_str().unwrap().to_owned()).collect(),
        other => panic!("expected string or list, got {other:?}"),
    }
}

/// What each function may do, by template resource. Changing a function's storage
/// access means changing this table and the template together.
fn expected_access() -> BTreeMap<&'static str, BTreeMap<String, BTreeSet<String>>> {
    let grant = |pairs: &[(&str, &[&str])]| {
        pairs
            .iter()
            .map(|(res, actions)| {
                (
                    res.to_string(),
                    actions.iter().map(|a| a.to_string()).collect(),
                )
            })
            .collect::<BTreeMap<_, _>>()
    };
    BTreeMap::from([
        (
            "IngressFunction",
            grant(&[
                (
                    "IngressLogGroup",
                    &["logs:CreateLogStream", "logs:PutLogEvents"],
                ),
                (
                    "RunsTable",
                    &[
                        "dynamodb:GetItem",
                        "dynamodb:PutItem",
                        "dynamodb:UpdateItem",
                    ],
                ),
                (
                    "EventsTable",
                    &["dynamodb:BatchGetItem", "dynamodb:PutItem"],
                ),
            ]),
        ),
        (
            "ReplayFunction",
            grant(&[
                (
                    "ReplayLogGroup",
                    &["logs:CreateLogStream", "logs:PutLogEvents"],
                ),
                ("RunsTable", &["dynamodb:GetItem"]),
                ("EventsTable/index/by_sequence", &["dynamodb:Query"]),
            ]),
        ),
        (
            "ReplayStreamFunction",
            grant(&[
                (
                    "ReplayStreamLogGroup",
                    &["logs:CreateLogStream", "logs:PutLogEvents"],
                ),
                ("RunsTable", &["dynamodb:GetItem"]),
                ("EventsTable/index/by_sequence", &["dynamodb:Query"]),
            ]),
        ),
    ])
}

#[test]
fn every_function_has_its_own_least_privilege_role() {
    let doc = template();
    let functions = of_type(&doc, "AWS::Serverless::Function");
    let expected = expected_access();
    let names: BTreeSet<_> = functions.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        expected.keys().copied().collect(),
        "functions in the template"
    );
    let mut roles_seen = BTreeSet::new();
    for (name, function) in &functions {
        let role = function["Properties"]["Role"].clone();
        let (role_id, _) = referenced(&role);
        assert!(
            roles_seen.insert(role_id.clone()),
            "{name} shares role {role_id}"
        );
        let role_res = &resources(&doc)[role_id.as_str()];
        assert_eq!(role_res["Type"].as_str(), Some("AWS::IAM::Role"));
        assert!(
            role_res["Properties"].get("ManagedPolicyArns").is_none(),
            "{name}: no managed policies"
        );
        let mut granted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for policy in role_res["Properties"]["Policies"].as_sequence().unwrap() {
            for stmt in policy["PolicyDocument"]["Statement"].as_sequence().unwrap() {
                assert_eq!(stmt["Effect"].as_str(), Some("Allow"));
                let actions = strings(&stmt["Action"]);
                for a in &actions {
                    assert!(!a.contains('*'), "{name}: wildcard action {a}");
                }
                let resources = match &stmt["Resource"] {
                    Value::Sequence(seq) => seq.clone(),
                    one => vec![one.clone()],
                };
                for r in resources {
                    assert_ne!(r.as_str(), Some("*"), "{name}: wildcard resource");
                    let (target, text) = referenced(&r);
                    assert!(
                        resources_contains(&doc, &target),
                        "{name}: {target} is not in the template"
                    );
                    let key = match text.split_once("}/") {
                        Some((_, suffix)) => format!("{target}/{suffix}"),
                        None => target,
                    };
                    assert!(!key.contains('*'), "{name}: wildcard in {key}");
                    granted
                        .entry(key)
                        .or_default()
                        .extend(actions.iter().cloned());
                }
            }
        }
        assert_eq!(
            granted,
            expected[name.as_str()],
            "{name}'s role grants exactly its needs"
        );
    }
}

fn resources_contains(doc: &Value, id: &str) -> bool {
    resources(doc).contains_key(id)
}

#[test]
fn every_function_builds_a_workspace_binary_for_the_chosen_architecture() {
    let doc = template();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    for (name, f) in of_type(&doc, "AWS::Serverless::Function") {
        assert_eq!(
            f["Metadata"]["BuildMethod"].as_str(),
            Some("rust-cargolambda"),
            "{name}"
        );
        let binary = f["Metadata"]["BuildProperties"]["Binary"]
            .as_str()
            .expect("Binary");
        let main = format!("{root}/functions/{binary}/src/main.rs");
        assert!(
            std::path::Path::new(&main).exists(),
            "{name}: {main} missing"
        );
    }
    let globals = &doc["Globals"]["Function"];
    assert_eq!(globals["Runtime"].as_str(), Some("provided.al2023"));
    let arch = &doc["Parameters"]["Architecture"];
    assert_eq!(arch["Default"].as_str(), Some("arm64"));
}

#[test]
fn tables_are_on_demand_encrypted_recoverable_and_expiring() {
    let doc = template();
    let tables = of_type(&doc, "AWS::DynamoDB::Table");
    assert!(tables.len() >= 2);
    for (name, t) in tables {
        let p = &t["Properties"];
        assert_eq!(p["BillingMode"].as_str(), Some("PAY_PER_REQUEST"), "{name}");
        assert_eq!(
            p["SSESpecification"]["SSEEnabled"].as_bool(),
            Some(true),
            "{name}"
        );
        assert_eq!(
            p["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"].as_bool(),
            Some(true),
            "{name}"
        );
        assert_eq!(
            p["TimeToLiveSpecification"]["Enabled"].as_bool(),
            Some(true),
            "{name}"
        );
    }
}

#[test]
fn timer_queue_redrives_to_a_dead_letter_queue_with_an_alarm() {
    let doc = template();
    let queue = &resources(&doc)["TimerQueue"]["Properties"];
    let (dlq, _) = referenced(&queue["RedrivePolicy"]["deadLetterTargetArn"]);
    assert_eq!(dlq, "TimerDeadLetterQueue");
    let alarms = of_type(&doc, "AWS::CloudWatch::Alarm");
    assert!(alarms
        .iter()
        .any(|(_, a)| a["Properties"]["Namespace"].as_str() == Some("AWS/SQS")));
    for (name, _) in of_type(&doc, "AWS::Serverless::Function") {
        assert!(
            alarms.iter().any(|(_, a)| {
                a["Properties"]["Dimensions"][0]["Value"]
                    == Value::Tagged(Box::new(serde_yaml_ng::value::TaggedValue {
                        tag: serde_yaml_ng::value::Tag::new("!Ref"),
                        value: Value::String(name.clone()),
                    }))
            }),
            "{name} has an errors alarm"
        );
    }
}

mod dynamo {
    use super::*;

    /// Tables created locally (by `serve --create-tables`, the tests, the bench) equal the
    /// template's definitions: keys, attribute types, indexes, TTL.
    #[tokio::test]
    async fn local_tables_equal_the_template() {
        assert!(
            tollgate_tests::aws_endpoint_configured(),
            "needs DynamoDB (make test)"
        );
        let config = aws_config::load_from_env().await;
        let client = aws_sdk_dynamodb::Client::new(&config);
        let prefix = format!("schema-{}-", uuid::Uuid::new_v4().simple());
        let tables = tollgate_store::dynamo::Tables::with_prefix(&prefix);
        tollgate_store::schema::ensure_tables(&client, &tables)
            .await
            .unwrap();
        let defs = table_defs(TEMPLATE).unwrap();
        assert!(defs.len() >= 2);
        for mut def in defs {
            let name = tollgate_store::schema::physical_name(&tables, &def.logical_id)
                .unwrap_or_else(|| panic!("{} has no local name", def.logical_id));
            let live = tollgate_store::schema::describe(&client, &name, &def.logical_id)
                .await
                .unwrap();
            def.attributes.sort();
            assert_eq!(live, def, "{name} drifted from the template");
            client
                .delete_table()
                .table_name(&name)
                .send()
                .await
                .unwrap();
        }
    }
}
