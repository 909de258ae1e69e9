//! `infra/template.yaml` is the one source of truth: these tests hold the code and the
//! template to each other — table definitions used locally, the function registry
//! (`tollgate_api::functions`: binaries, triggers, the routes each function serves, the
//! Makefile's list), and each function's least-privilege role.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_yaml_ng::Value;
use tollgate_api::functions::{self, Trigger, FUNCTIONS};
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

/// The logical id a `Resource` entry points at: `!GetAtt X.Arn`, `!Sub "${X.Arn}/…"` or
/// `!Ref X` (for resources whose `Ref` is their ARN, such as a secret).
fn referenced(resource: &Value) -> (String, String) {
    match resource {
        Value::Tagged(t) if t.tag == "!Ref" => {
            let target = t.value.as_str().expect("!Ref X");
            (target.to_owned(), target.to_owned())
        }
        Value::Tagged(t) if t.tag == "!GetAtt" => {
            let target = t.value.as_str().expect("!GetAtt X.Arn");
            (
                target.split('.').next().unwrap().to_owned(),
                target.to_owned(),
            )
        }
        // An API's `@connections` (execute-api:ManageConnections): its own ARN.
        Value::Tagged(t)
            if t.tag == "!Sub"
                && t.value.as_str().is_some_and(|s| {
                    s.starts_with(
                        "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${",
                    )
                }) =>
        {
            let s = t.value.as_str().unwrap();
            let api = s
                .rsplit_once(":${")
                .and_then(|(_, r)| r.split_once('}'))
                .expect("…:${Api}/stage/…");
            (
                api.0.to_owned(),
                format!("${{{}}}/{}", api.0, api.1.trim_start_matches('/')),
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
                ("SigningSecret", &["secretsmanager:GetSecretValue"]),
                (
                    "RunsTable",
                    &[
                        "dynamodb:BatchGetItem",
                        "dynamodb:GetItem",
                        "dynamodb:PutItem",
                        "dynamodb:UpdateItem",
                    ],
                ),
                (
                    "EventsTable",
                    &[
                        "dynamodb:BatchGetItem",
                        "dynamodb:PutItem",
                        "dynamodb:Query",
                    ],
                ),
                (
                    "ApprovalsTable",
                    &[
                        "dynamodb:BatchGetItem",
                        "dynamodb:GetItem",
                        "dynamodb:PutItem",
                        "dynamodb:Query",
                        "dynamodb:UpdateItem",
                    ],
                ),
                (
                    "PoliciesTable",
                    &[
                        "dynamodb:BatchGetItem",
                        "dynamodb:ConditionCheckItem",
                        "dynamodb:UpdateItem",
                    ],
                ),
                ("MutationsTable", &["dynamodb:Query", "dynamodb:UpdateItem"]),
                ("TimerQueue", &["sqs:SendMessage"]),
            ]),
        ),
        (
            "ApprovalsFunction",
            grant(&[
                (
                    "ApprovalsLogGroup",
                    &["logs:CreateLogStream", "logs:PutLogEvents"],
                ),
                ("SigningSecret", &["secretsmanager:GetSecretValue"]),
                // Slack's secrets (only when both ARNs are given: `HasSlack`).
                ("SlackBotTokenSecretArn", &["secretsmanager:GetSecretValue"]),
                ("SlackSigningSecretArn", &["secretsmanager:GetSecretValue"]),
                (
                    "RunsTable",
                    &[
                        "dynamodb:BatchGetItem",
                        "dynamodb:GetItem",
                        "dynamodb:UpdateItem",
                    ],
                ),
                (
                    "EventsTable",
                    &[
                        "dynamodb:BatchGetItem",
                        "dynamodb:GetItem",
                        "dynamodb:PutItem",
                    ],
                ),
                (
                    "ApprovalsTable",
                    &[
                        "dynamodb:BatchGetItem",
                        "dynamodb:GetItem",
                        "dynamodb:PutItem",
                        "dynamodb:Query",
                        "dynamodb:UpdateItem",
                    ],
                ),
                (
                    "ApprovalsTable/index/pending_by_expiry",
                    &["dynamodb:Query"],
                ),
                ("ApprovalsTable/index/pending_due", &["dynamodb:Query"]),
                (
                    "PoliciesTable",
                    &["dynamodb:GetItem", "dynamodb:Scan", "dynamodb:UpdateItem"],
                ),
                (
                    "PoliciesTable/index/policies_by_project",
                    &["dynamodb:Query"],
                ),
                ("RunsTable/index/runs_by_project", &["dynamodb:Query"]),
                ("TimerQueue", &["sqs:SendMessage"]),
                ("DeliveriesTable", &["dynamodb:GetItem", "dynamodb:PutItem"]),
                ("DeliveriesTable/index/dead_by_project", &["dynamodb:Query"]),
            ]),
        ),
        (
            "SettlementFunction",
            grant(&[
                (
                    "SettlementLogGroup",
                    &["logs:CreateLogStream", "logs:PutLogEvents"],
                ),
                ("SigningSecret", &["secretsmanager:GetSecretValue"]),
                (
                    "RunsTable",
                    &[
                        "dynamodb:ConditionCheckItem",
                        "dynamodb:GetItem",
                        "dynamodb:UpdateItem",
                    ],
                ),
                ("EventsTable", &["dynamodb:PutItem"]),
                ("ApprovalsTable", &["dynamodb:GetItem"]),
                (
                    "MutationsTable",
                    &[
                        "dynamodb:GetItem",
                        "dynamodb:PutItem",
                        "dynamodb:Query",
                        "dynamodb:UpdateItem",
                    ],
                ),
                ("TimerQueue", &["sqs:SendMessage"]),
            ]),
        ),
        (
            "TimersFunction",
            grant(&[
                (
                    "TimersLogGroup",
                    &["logs:CreateLogStream", "logs:PutLogEvents"],
                ),
                ("SigningSecret", &["secretsmanager:GetSecretValue"]),
                (
                    "RunsTable",
                    &[
                        "dynamodb:BatchGetItem",
                        "dynamodb:GetItem",
                        "dynamodb:UpdateItem",
                    ],
                ),
                (
                    "EventsTable",
                    &[
                        "dynamodb:BatchGetItem",
                        "dynamodb:GetItem",
                        "dynamodb:PutItem",
                    ],
                ),
                ("PoliciesTable", &["dynamodb:GetItem"]),
                (
                    "ApprovalsTable",
                    &[
                        "dynamodb:BatchGetItem",
                        "dynamodb:GetItem",
                        "dynamodb:PutItem",
                        "dynamodb:UpdateItem",
                    ],
                ),
                (
                    "MutationsTable",
                    &["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query"],
                ),
                (
                    "TimerQueue",
                    &[
                        "sqs:DeleteMessage",
                        "sqs:GetQueueAttributes",
                        "sqs:ReceiveMessage",
                        "sqs:SendMessage",
                    ],
                ),
            ]),
        ),
        (
            "StallWatchFunction",
            grant(&[
                (
                    "StallWatchLogGroup",
                    &["logs:CreateLogStream", "logs:PutLogEvents"],
                ),
                ("SigningSecret", &["secretsmanager:GetSecretValue"]),
                (
                    "RunsTable",
                    &[
                        "dynamodb:BatchGetItem",
                        "dynamodb:GetItem",
                        "dynamodb:UpdateItem",
                    ],
                ),
                ("EventsTable", &["dynamodb:PutItem"]),
                (
                    "ApprovalsTable",
                    &[
                        "dynamodb:BatchGetItem",
                        "dynamodb:GetItem",
                        "dynamodb:PutItem",
                        "dynamodb:UpdateItem",
                    ],
                ),
                (
                    "ApprovalsTable/index/pending_by_expiry",
                    &["dynamodb:Query"],
                ),
                ("ApprovalsTable/index/pending_due", &["dynamodb:Query"]),
                ("RunsTable/index/running_children", &["dynamodb:Query"]),
                (
                    "MutationsTable",
                    &[
                        "dynamodb:GetItem",
                        "dynamodb:PutItem",
                        "dynamodb:Query",
                        "dynamodb:UpdateItem",
                    ],
                ),
                (
                    "MutationsTable/index/unsettled_by_deadline",
                    &["dynamodb:Query"],
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
                ("SigningSecret", &["secretsmanager:GetSecretValue"]),
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
                ("SigningSecret", &["secretsmanager:GetSecretValue"]),
                ("RunsTable", &["dynamodb:GetItem"]),
                ("EventsTable/index/by_sequence", &["dynamodb:Query"]),
            ]),
        ),
        (
            "OperatorStreamFunction",
            grant(&[
                (
                    "OperatorStreamLogGroup",
                    &["logs:CreateLogStream", "logs:PutLogEvents"],
                ),
                ("SigningSecret", &["secretsmanager:GetSecretValue"]),
                ("RunsTable", &["dynamodb:GetItem"]),
                ("EventsTable/index/by_sequence", &["dynamodb:Query"]),
            ]),
        ),
        (
            "WebSocketFunction",
            grant(&[
                (
                    "WebSocketLogGroup",
                    &["logs:CreateLogStream", "logs:PutLogEvents"],
                ),
                ("SigningSecret", &["secretsmanager:GetSecretValue"]),
                ("RunsTable", &["dynamodb:GetItem"]),
                ("EventsTable/index/by_sequence", &["dynamodb:Query"]),
                (
                    "ConnectionsTable",
                    &[
                        "dynamodb:BatchWriteItem",
                        "dynamodb:DeleteItem",
                        "dynamodb:GetItem",
                        "dynamodb:PutItem",
                        "dynamodb:UpdateItem",
                    ],
                ),
                ("ConnectionsTable/index/by_holder", &["dynamodb:Query"]),
                ("ConnectionsTable/index/by_tenant", &["dynamodb:Query"]),
                (
                    "WebSocketApi/live/POST/@connections/*",
                    &["execute-api:ManageConnections"],
                ),
            ]),
        ),
        (
            "FanoutFunction",
            grant(&[
                (
                    "FanoutLogGroup",
                    &["logs:CreateLogStream", "logs:PutLogEvents"],
                ),
                (
                    "EventsTable.StreamArn",
                    &[
                        "dynamodb:DescribeStream",
                        "dynamodb:GetRecords",
                        "dynamodb:GetShardIterator",
                        "dynamodb:ListStreams",
                    ],
                ),
                (
                    "ConnectionsTable",
                    &[
                        "dynamodb:BatchWriteItem",
                        "dynamodb:DeleteItem",
                        "dynamodb:Query",
                        "dynamodb:UpdateItem",
                    ],
                ),
                ("ConnectionsTable/index/by_holder", &["dynamodb:Query"]),
                ("FanoutDeadLetterQueue", &["sqs:SendMessage"]),
                (
                    "WebSocketApi/live/POST/@connections/*",
                    &["execute-api:ManageConnections"],
                ),
                (
                    "WebSocketApi/live/DELETE/@connections/*",
                    &["execute-api:ManageConnections"],
                ),
            ]),
        ),
        (
            "NotifierFunction",
            grant(&[
                (
                    "NotifierLogGroup",
                    &["logs:CreateLogStream", "logs:PutLogEvents"],
                ),
                (
                    "EventsTable.StreamArn",
                    &[
                        "dynamodb:DescribeStream",
                        "dynamodb:GetRecords",
                        "dynamodb:GetShardIterator",
                        "dynamodb:ListStreams",
                    ],
                ),
                ("RunsTable", &["dynamodb:GetItem"]),
                ("ApprovalsTable", &["dynamodb:GetItem"]),
                ("DeliveriesTable", &["dynamodb:GetItem", "dynamodb:PutItem"]),
                ("DeliveriesTable/index/deliveries_due", &["dynamodb:Query"]),
                ("WebhookSecret", &["secretsmanager:GetSecretValue"]),
                // Slack's bot token (only when both ARNs are given: `HasSlack`).
                ("SlackBotTokenSecretArn", &["secretsmanager:GetSecretValue"]),
                ("NotifierDeadLetterQueue", &["sqs:SendMessage"]),
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
                // A statement only under a condition: `!If [Cond, statement, !Ref AWS::NoValue]`.
                let stmt = conditional_statement(&doc, stmt);
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
                        resources_contains(&doc, &target) || secret_arn_parameter(&doc, &target),
                        "{name}: {target} is not in the template"
                    );
                    let key = match text.split_once("}/") {
                        Some((_, suffix)) => format!("{target}/{suffix}"),
                        // `!GetAtt X.StreamArn`: the table's stream, not the table.
                        None if text.ends_with(".StreamArn") => text,
                        None => target,
                    };
                    // The one wildcard allowed: any connection of one API's stage (posted
                    // to, or closed).
                    assert!(
                        !key.contains('*')
                            || key.ends_with("/live/POST/@connections/*")
                            || key.ends_with("/live/DELETE/@connections/*"),
                        "{name}: wildcard in {key}"
                    );
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

/// A secret given to the stack by its ARN (a parameter `…SecretArn`), which a role may name
/// as a resource.
fn secret_arn_parameter(doc: &Value, id: &str) -> bool {
    id.ends_with("SecretArn") && doc["Parameters"].get(id).is_some()
}

/// The statement of `!If [Cond, statement, !Ref AWS::NoValue]` (the condition one of the
/// template's), or `stmt` itself.
fn conditional_statement<'a>(doc: &Value, stmt: &'a Value) -> &'a Value {
    match stmt {
        Value::Tagged(t) if t.tag == "!If" => {
            let parts = t.value.as_sequence().expect("!If [Cond, then, else]");
            let condition = parts[0].as_str().expect("a condition's name");
            assert!(
                doc["Conditions"].get(condition).is_some(),
                "{condition} is not a condition of the template"
            );
            assert!(
                matches!(&parts[2], Value::Tagged(e) if e.tag == "!Ref" && e.value.as_str() == Some("AWS::NoValue")),
                "a conditional statement's other branch is no statement"
            );
            &parts[1]
        }
        other => other,
    }
}

fn resources_contains(doc: &Value, id: &str) -> bool {
    resources(doc).contains_key(id)
}

/// Dynamic references that CloudFormation resolves to a secret's value at deploy time;
/// in a function's environment that value is readable by anyone allowed
/// `lambda:GetFunctionConfiguration`.
const SECRET_DYNAMIC_REFERENCES: [&str; 2] = ["{{resolve:secretsmanager", "{{resolve:ssm-secure"];

/// Parts of a variable name that say it holds a secret itself (an `_ARN` names one).
const SECRET_NAME_PARTS: [&str; 4] = ["SECRET", "PASSWORD", "PRIVATE_KEY", "ACCESS_KEY"];

/// The string leaves of an environment value (not the logical ids of `!Ref`/`!GetAtt`
/// nor an `!If`'s condition name), with a `!Sub`'s literal variables substituted into
/// its template.
fn leaves(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Sequence(seq) => seq.iter().for_each(|x| leaves(x, out)),
        Value::Mapping(m) => m.values().for_each(|x| leaves(x, out)),
        Value::Tagged(t) if t.tag == "!Ref" || t.tag == "!GetAtt" => {}
        Value::Tagged(t) if t.tag == "!If" => match t.value.as_sequence() {
            Some(branches) => branches.iter().skip(1).for_each(|x| leaves(x, out)),
            None => leaves(&t.value, out),
        },
        Value::Tagged(t) if t.tag == "!Sub" => match t.value.as_sequence() {
            Some(parts) if parts.len() == 2 => {
                let mut template = parts[0].as_str().unwrap_or_default().to_owned();
                if let Some(vars) = parts[1].as_mapping() {
                    for (k, v) in vars {
                        if let (Some(k), Some(v)) = (k.as_str(), v.as_str()) {
                            template = template.replace(&format!("${{{k}}}"), v);
                        }
                    }
                    vars.values().for_each(|x| leaves(x, out));
                }
                out.push(template);
            }
            _ => leaves(&t.value, out),
        },
        Value::Tagged(t) => leaves(&t.value, out),
        Value::Number(_) | Value::Bool(_) | Value::Null => {}
    }
}

/// A literal that reads as a credential or key rather than a setting: a PEM block, a
/// JWT, an AWS access key id, or a long unbroken token of key characters mixing letters
/// and digits (hex, base64, base64url).
fn looks_like_key_material(s: &str) -> bool {
    let key_chars = s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | '_' | '-'));
    let access_key_id = s.len() == 20
        && (s.starts_with("AKIA") || s.starts_with("ASIA"))
        && s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit());
    s.contains("-----BEGIN")
        || (s.starts_with("eyJ") && s.matches('.').count() == 2)
        || access_key_id
        || (s.len() >= 32
            && key_chars
            && s.chars().any(|c| c.is_ascii_digit())
            && s.chars().any(|c| c.is_ascii_alphabetic()))
}

/// Why an environment variable would put secret material into a function's
/// configuration, if it would.
fn secret_material(name: &str, value: &Value) -> Option<String> {
    let upper = name.to_ascii_uppercase();
    if !upper.ends_with("_ARN") && SECRET_NAME_PARTS.iter().any(|p| upper.contains(p)) {
        return Some(format!(
            "{name}: the name says it holds a secret (pass its ARN)"
        ));
    }
    let mut parts = Vec::new();
    leaves(value, &mut parts);
    // All parts joined too: a dynamic reference split over `!Join` pieces shows whole.
    for text in parts.iter().chain([&parts.concat()]) {
        let lower = text.to_ascii_lowercase();
        if let Some(r) = SECRET_DYNAMIC_REFERENCES
            .iter()
            .find(|r| lower.contains(*r))
        {
            return Some(format!(
                "{name}: {r}…}} puts the secret's value in the environment"
            ));
        }
    }
    parts
        .iter()
        .find(|t| looks_like_key_material(t))
        .map(|_| format!("{name}: the value looks like key material"))
}

/// The environment variables of every function: `Globals` (which SAM copies into each
/// function) and each function's own.
fn function_environments(doc: &Value) -> Vec<(String, String, Value)> {
    let mut scopes = vec![("Globals.Function".to_owned(), &doc["Globals"]["Function"])];
    for (name, f) in of_type(doc, "AWS::Serverless::Function") {
        scopes.push((name, &f["Properties"]));
    }
    for (name, f) in of_type(doc, "AWS::Lambda::Function") {
        scopes.push((name, &f["Properties"]));
    }
    let mut vars = Vec::new();
    for (scope, props) in scopes {
        if let Some(m) = props["Environment"]["Variables"].as_mapping() {
            for (k, v) in m {
                vars.push((scope.clone(), k.as_str().unwrap().to_owned(), v.clone()));
            }
        }
    }
    vars
}

#[test]
fn no_function_environment_holds_secret_material() {
    let doc = template();
    let vars = function_environments(&doc);
    assert!(
        vars.iter().any(|(_, k, _)| k == "TOLLGATE_SECRET_ARN"),
        "the functions are told where the secret is"
    );
    let found: Vec<String> = vars
        .iter()
        .filter_map(|(scope, k, v)| secret_material(k, v).map(|why| format!("{scope}: {why}")))
        .collect();
    assert!(
        found.is_empty(),
        "secret material in environments: {found:#?}"
    );
    let (target, _) =
        referenced(&doc["Globals"]["Function"]["Environment"]["Variables"]["TOLLGATE_SECRET_ARN"]);
    assert_eq!(
        resources(&doc)[target.as_str()]["Type"].as_str(),
        Some("AWS::SecretsManager::Secret")
    );
}

/// The check above would catch the ways secret material gets into an environment.
#[test]
fn secret_material_check_catches_dynamic_references_names_and_keys() {
    let var = |yaml: &str| -> Value { serde_yaml_ng::from_str(yaml).unwrap() };
    let caught = [
        (
            "TOLLGATE_SECRET",
            r#"!Sub "{{resolve:secretsmanager:${SigningSecret}:SecretString}}""#,
        ),
        (
            "SIGNING",
            r#"!Sub "{{resolve:secretsmanager:${SigningSecret}:SecretString}}""#,
        ),
        ("SIGNING", r#""{{resolve:ssm-secure:/tollgate/key:1}}""#),
        (
            "SIGNING",
            r#"!Join ["", ["{{resolve:", "secretsmanager:", !Ref S, "}}"]]"#,
        ),
        (
            "SIGNING",
            r#"!Sub ["{{resolve:${k}:${S}}}", {k: secretsmanager}]"#,
        ),
        ("SIGNING", r#"!If [C, "{{resolve:ssm-secure:/k}}", "x"]"#),
        ("DB_PASSWORD", r#""hunter2""#),
        ("KEY", r#""4f1c2a9be0d37c5e8a6b1f0d2c3e4a5b""#),
        ("KEY", r#""dGhpcyBpcyBhIHRlc3Qga2V5IG9mIDMyIGJ5dGVz""#),
        ("KEY", r#""AKIAIOSFODNN7EXAMPLE""#),
        ("TOKEN", r#""eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln""#),
        ("KEY", r#"!Sub "-----BEGIN PRIVATE KEY-----\nMII""#),
    ];
    for (name, yaml) in caught {
        assert!(
            secret_material(name, &var(yaml)).is_some(),
            "{name}: {yaml}"
        );
    }
    let fine = [
        ("TOLLGATE_SECRET_ARN", "!Ref SigningSecret"),
        ("TOLLGATE_BACKEND", "aws"),
        (
            "TOLLGATE_TRUST_GATEWAY_CLAIMS",
            r#"!If [UseJwtAuthorizer, "1", "0"]"#,
        ),
        ("TOLLGATE_RUNS_TABLE", "!Ref RunsTable"),
        ("RUST_LOG", "info,tollgate_api=debug"),
        (
            "TOLLGATE_URL",
            "https://k7x2m9q4ab.execute-api.us-east-1.amazonaws.com",
        ),
        ("TOLLGATE_TABLE_PREFIX", r#"!Sub "${AWS::StackName}-""#),
    ];
    for (name, yaml) in fine {
        assert_eq!(secret_material(name, &var(yaml)), None, "{name}: {yaml}");
    }
}

/// Each function may reserve (and be capped at) its own concurrency, set by a parameter
/// that `-1` turns off; none reserves anything unless `ReserveConcurrency` is `true`
/// (the default, `false`, deploys on an account with Lambda's smallest concurrency limit).
#[test]
fn every_function_reserves_concurrency_through_a_parameter_only_when_asked() {
    let doc = template();
    let tag = |v: &Value, name: &str| match v {
        Value::Tagged(t) if t.tag == name => Some(t.value.clone()),
        _ => None,
    };
    let ref_of = |v: &Value| tag(v, "!Ref").and_then(|t| t.as_str().map(str::to_owned));
    let switch = &doc["Parameters"]["ReserveConcurrency"];
    assert_eq!(switch["Default"].as_str(), Some("false"), "off by default");
    assert_eq!(strings(&switch["AllowedValues"]), ["true", "false"]);
    // ReservingConcurrency: !Equals [!Ref ReserveConcurrency, "true"]
    let reserving = tag(&doc["Conditions"]["ReservingConcurrency"], "!Equals")
        .and_then(|v| v.as_sequence().cloned())
        .expect("ReservingConcurrency: !Equals [!Ref ReserveConcurrency, \"true\"]");
    assert_eq!(ref_of(&reserving[0]).as_deref(), Some("ReserveConcurrency"));
    assert_eq!(reserving[1].as_str(), Some("true"));
    let mut total = 0;
    for (name, f) in of_type(&doc, "AWS::Serverless::Function") {
        let reserved = &f["Properties"]["ReservedConcurrentExecutions"];
        let branches = tag(reserved, "!If")
            .and_then(|v| v.as_sequence().cloned())
            .unwrap_or_else(|| {
                panic!("{name}: ReservedConcurrentExecutions: !If [C, !Ref P, !Ref AWS::NoValue]")
            });
        assert_eq!(branches.len(), 3, "{name}");
        let condition = branches[0].as_str().expect("condition name");
        let param = ref_of(&branches[1]).unwrap_or_else(|| panic!("{name}: !Ref of a parameter"));
        assert_eq!(
            ref_of(&branches[2]).as_deref(),
            Some("AWS::NoValue"),
            "{name}"
        );
        let p = &doc["Parameters"][param.as_str()];
        assert_eq!(p["Type"].as_str(), Some("Number"), "{name}: {param}");
        let default = p["Default"]
            .as_i64()
            .unwrap_or_else(|| panic!("{param}: Default"));
        assert!(default >= 1, "{param}: a value to reserve ({default})");
        total += default;
        assert_eq!(p["MinValue"].as_i64(), Some(-1), "{param}: -1 turns it off");
        // The condition is
        // `!And [!Condition ReservingConcurrency, !Not [!Equals [!Ref P, "-1"]]]`.
        let shape = format!(
            "{condition}: !And [!Condition ReservingConcurrency, !Not [!Equals [!Ref {param}, \"-1\"]]]"
        );
        let and = tag(&doc["Conditions"][condition], "!And")
            .and_then(|v| v.as_sequence().cloned())
            .unwrap_or_else(|| panic!("{shape}"));
        assert_eq!(and.len(), 2, "{shape}");
        assert_eq!(
            tag(&and[0], "!Condition").and_then(|v| v.as_str().map(str::to_owned)),
            Some("ReservingConcurrency".to_owned()),
            "{shape}"
        );
        let equals = tag(&and[1], "!Not")
            .and_then(|v| v.as_sequence().and_then(|s| s.first().cloned()))
            .and_then(|v| tag(&v, "!Equals"))
            .and_then(|v| v.as_sequence().cloned())
            .unwrap_or_else(|| panic!("{shape}"));
        assert_eq!(
            ref_of(&equals[0]).as_deref(),
            Some(param.as_str()),
            "{condition}"
        );
        assert_eq!(equals[1].as_str(), Some("-1"), "{condition}");
    }
    // The switch's description tells the account limit the defaults need (Lambda keeps
    // 100 unreserved).
    let needs = format!("at least {}", total + 100);
    assert!(
        switch["Description"]
            .as_str()
            .is_some_and(|d| d.contains(&needs) && d.contains(&format!("{total} in all"))),
        "ReserveConcurrency's Description: {total} in all, a limit of {needs}"
    );
}

/// The value of a `NAME := value` line of the Makefile.
fn makefile_var(name: &str) -> &'static str {
    let makefile = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../Makefile"));
    makefile
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim_start().strip_prefix(":="))
        .unwrap_or_else(|| panic!("a `{name} :=` line in the Makefile"))
        .trim()
}

/// Where `doc`'s functions' code differs from what `make build` writes: each function's
/// `CodeUri` must be the zip `make build` writes for its binary (relative to infra/), and
/// none may have a `BuildMethod` (which has `sam build` compile its own binary, with
/// other settings).
fn code_mismatches(doc: &Value, lambda_dir: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    for (name, f) in of_type(doc, "AWS::Serverless::Function") {
        if !f["Metadata"]["BuildMethod"].is_null() {
            wrong.push(format!(
                "{name}: a BuildMethod (`sam build` would build it)"
            ));
        }
        let Some(registered) = functions::by_logical_id(&name) else {
            wrong.push(format!("{name} is not in the registry"));
            continue;
        };
        let zip = format!("../{lambda_dir}/{}/bootstrap.zip", registered.name);
        if f["Properties"]["CodeUri"].as_str() != Some(zip.as_str()) {
            wrong.push(format!(
                "{name}: CodeUri {:?}, not {zip}",
                f["Properties"]["CodeUri"]
            ));
        }
    }
    wrong
}

/// A function's `main` starts from its own registry constant (`functions::APPROVALS` for
/// `approvals`): it decides which routes the binary serves and links, so a `main`
/// naming another function's constant would deploy that function's routes under this
/// name.
fn main_names_its_own_function(code: &str, name: &str) -> Result<(), String> {
    let own = format!("functions::{}", name.to_uppercase().replace('-', "_"));
    let named: Vec<String> = FUNCTIONS
        .iter()
        .map(|f| format!("functions::{}", f.name.to_uppercase().replace('-', "_")))
        .filter(|c| {
            code.match_indices(c.as_str()).any(|(i, _)| {
                !code[i + c.len()..].starts_with(|ch: char| ch == '_' || ch.is_ascii_alphanumeric())
            })
        })
        .collect();
    match named.as_slice() {
        [one] if *one == own => Ok(()),
        _ => Err(format!(
            "names {named:?}; it must name {own} and no other function"
        )),
    }
}

#[test]
fn a_main_naming_another_function_is_refused() {
    let approvals = "serve_function(&tollgate_api::functions::APPROVALS).await";
    assert!(main_names_its_own_function(approvals, "approvals").is_ok());
    assert!(main_names_its_own_function(approvals, "ingress").is_err());
    let replay_stream = "serve_function(&tollgate_api::functions::REPLAY_STREAM).await";
    assert!(main_names_its_own_function(replay_stream, "replay-stream").is_ok());
    // REPLAY is a prefix of REPLAY_STREAM, not a mention of it.
    assert!(main_names_its_own_function(replay_stream, "replay").is_err());
    assert!(main_names_its_own_function("start(\"timers\")", "timers").is_err());
}

/// `make deploy` ships exactly what `make build` built and the tests tested.
#[test]
fn every_function_deploys_the_zip_make_build_writes() {
    let doc = template();
    let wrong = code_mismatches(&doc, makefile_var("LAMBDA_DIR"));
    assert!(wrong.is_empty(), "template vs `make build`: {wrong:#?}");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    for f in FUNCTIONS {
        let main = format!("{root}/functions/{}/src/main.rs", f.name);
        let code = std::fs::read_to_string(&main).unwrap_or_else(|e| panic!("{main}: {e}"));
        if let Err(why) = main_names_its_own_function(&code, f.name) {
            panic!("{main}: {why}");
        }
    }
    let globals = &doc["Globals"]["Function"];
    assert_eq!(globals["Runtime"].as_str(), Some("provided.al2023"));
    assert_eq!(globals["Handler"].as_str(), Some("bootstrap"));
    // `make build`'s default architecture is the template's.
    let makefile = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../Makefile"));
    let arch = doc["Parameters"]["Architecture"]["Default"].as_str();
    assert_eq!(arch, Some("arm64"));
    assert!(makefile.lines().any(|l| l == "ARCH ?= arm64"));
}

/// `[profile.NAME]` tables of a Cargo manifest: each key and its raw value.
fn cargo_profiles(manifest: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut profiles = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in manifest.lines().map(str::trim) {
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = section.strip_prefix("profile.").map(str::to_owned);
            if let Some(p) = &current {
                profiles.insert(p.clone(), BTreeMap::new());
            }
            continue;
        }
        if let (Some(p), Some((key, value))) = (&current, line.split_once('=')) {
            if !line.starts_with('#') {
                let value = value.split('#').next().unwrap_or_default();
                profiles
                    .get_mut(p)
                    .unwrap()
                    .insert(key.trim().to_owned(), value.trim().to_owned());
            }
        }
    }
    profiles
}

/// Every profile a deployed or measured binary is built with (`make build`'s, and
/// `release` for `make bench` / `make cold-init` and what it inherits) says
/// `panic = "unwind"` itself: a handler that panics answers an error and the instance
/// keeps serving; with `abort` (cargo-lambda's `--release` default) the process dies.
#[test]
fn every_profile_a_lambda_is_built_with_unwinds() {
    let cargo = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml"));
    let makefile = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../Makefile"));
    check_profiles_unwind(cargo, makefile, makefile_var("LAMBDA_PROFILE")).unwrap();
}

fn check_profiles_unwind(cargo: &str, makefile: &str, lambda_profile: &str) -> Result<(), String> {
    if !makefile.contains("cargo lambda build --profile $(LAMBDA_PROFILE) ")
        || makefile.contains("cargo lambda build --release")
    {
        return Err("`make build` must build with `--profile $(LAMBDA_PROFILE)`".into());
    }
    let profiles = cargo_profiles(cargo);
    let mut used = vec![lambda_profile.to_owned(), "release".to_owned()];
    let mut i = 0;
    while i < used.len() {
        let name = used[i].clone();
        let profile = profiles
            .get(&name)
            .ok_or_else(|| format!("[profile.{name}] missing from Cargo.toml"))?;
        if profile.get("panic").map(String::as_str) != Some("\"unwind\"") {
            return Err(format!(
                "[profile.{name}] must say panic = \"unwind\" (has {:?})",
                profile.get("panic")
            ));
        }
        if let Some(parent) = profile.get("inherits") {
            let parent = parent.trim_matches('"').to_owned();
            if !used.contains(&parent) && parent != "dev" {
                used.push(parent);
            }
        }
        i += 1;
    }
    Ok(())
}

/// What the two tests above refuse: a function pointed at another binary, a profile
/// without unwind, `sam build`-style metadata.
#[test]
fn the_build_checks_refuse_what_they_guard_against() {
    let cargo = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml"));
    let makefile = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../Makefile"));
    let profile = makefile_var("LAMBDA_PROFILE");
    assert_eq!(check_profiles_unwind(cargo, makefile, profile), Ok(()));
    let abort = cargo.replace("panic = \"unwind\"", "panic = \"abort\"");
    assert!(check_profiles_unwind(&abort, makefile, profile).is_err());
    let unsaid = cargo.replace("panic = \"unwind\"\n", "");
    assert!(check_profiles_unwind(&unsaid, makefile, profile).is_err());
    let release = makefile.replace("--profile $(LAMBDA_PROFILE) ", "--release ");
    assert!(check_profiles_unwind(cargo, &release, profile).is_err());

    // The template check, on a template whose ingress ships the approvals binary, and
    // on one that `sam build` would build.
    let lambda_dir = makefile_var("LAMBDA_DIR");
    let swapped = TEMPLATE.replace(
        "CodeUri: ../target/lambda/ingress/bootstrap.zip",
        "CodeUri: ../target/lambda/approvals/bootstrap.zip",
    );
    assert_ne!(swapped, TEMPLATE);
    let doc: Value = serde_yaml_ng::from_str(&swapped).unwrap();
    assert_eq!(code_mismatches(&doc, lambda_dir).len(), 1);
    let built = TEMPLATE.replace(
        "    Properties:\n      FunctionName: !Sub \"${AWS::StackName}-ingress\"",
        "    Metadata:\n      BuildMethod: rust-cargolambda\n    Properties:\n      FunctionName: !Sub \"${AWS::StackName}-ingress\"",
    );
    assert_ne!(built, TEMPLATE);
    let doc: Value = serde_yaml_ng::from_str(&built).unwrap();
    assert_eq!(code_mismatches(&doc, lambda_dir).len(), 1);
}

/// The `AWS::Serverless::Function` an HTTP API route's integration invokes.
fn route_function(doc: &Value, route: &Value) -> String {
    let target = match &route["Properties"]["Target"] {
        Value::Tagged(t) if t.tag == "!Sub" => t.value.as_str().unwrap_or_default().to_owned(),
        other => panic!("route Target must be !Sub \"integrations/${{X}}\", got {other:?}"),
    };
    let integration = target
        .strip_prefix("integrations/${")
        .and_then(|t| t.strip_suffix('}'))
        .unwrap_or_else(|| panic!("route Target {target}"));
    let integration = &resources(doc)[integration];
    assert_eq!(
        integration["Properties"]["IntegrationType"].as_str(),
        Some("AWS_PROXY")
    );
    referenced(&integration["Properties"]["IntegrationUri"]).0
}

/// `(RouteKey, function logical id)` of every HTTP API route (the WebSocket API's routes
/// are `the_template_deploys_exactly_the_registry`'s).
fn api_routes(doc: &Value) -> Vec<(String, String)> {
    of_type(doc, "AWS::ApiGatewayV2::Route")
        .into_iter()
        .filter(|(_, r)| {
            !matches!(&r["Properties"]["ApiId"], Value::Tagged(t) if t.value.as_str() == Some("WebSocketApi"))
        })
        .map(|(name, r)| {
            let key = r["Properties"]["RouteKey"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: RouteKey"))
                .to_owned();
            (key, route_function(doc, r))
        })
        .collect()
}

/// The function's `Events` of SAM type `ty`.
fn events_of_type<'a>(function: &'a Value, ty: &str) -> Vec<&'a Value> {
    function["Properties"]["Events"]
        .as_mapping()
        .map(|events| {
            events
                .values()
                .filter(|e| e["Type"].as_str() == Some(ty))
                .collect()
        })
        .unwrap_or_default()
}

/// The registry (`tollgate_api::functions::FUNCTIONS`) and the template name the same
/// functions, each with its binary and the trigger its code expects.
#[test]
fn the_template_deploys_exactly_the_registry() {
    let doc = template();
    let in_template: BTreeSet<String> = of_type(&doc, "AWS::Serverless::Function")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let in_registry: BTreeSet<String> = FUNCTIONS.iter().map(|f| f.logical_id.into()).collect();
    assert_eq!(in_template, in_registry, "functions: template vs registry");
    let routes = api_routes(&doc);
    for f in FUNCTIONS {
        let res = &resources(&doc)[f.logical_id];
        assert_eq!(
            res["Properties"]["CodeUri"].as_str(),
            Some(format!("../target/lambda/{}/bootstrap.zip", f.name).as_str()),
            "{}: CodeUri",
            f.logical_id
        );
        let routed = routes.iter().any(|(_, target)| target == f.logical_id);
        let url = &res["Properties"]["FunctionUrlConfig"];
        let sqs = events_of_type(res, "SQS");
        let schedules = events_of_type(res, "Schedule");
        match f.trigger {
            Trigger::Http { streaming } => {
                assert!(
                    routed || !url.is_null(),
                    "{}: HTTP API routes or a Function URL",
                    f.name
                );
                assert_eq!(
                    url["InvokeMode"].as_str() == Some("RESPONSE_STREAM"),
                    streaming,
                    "{}: a streaming function (and only one) has a RESPONSE_STREAM Function URL",
                    f.name
                );
                assert!(sqs.is_empty() && schedules.is_empty(), "{}", f.name);
            }
            Trigger::Sqs => {
                assert_eq!(sqs.len(), 1, "{}: one SQS event", f.name);
                let props = &sqs[0]["Properties"];
                assert_eq!(
                    strings(&props["FunctionResponseTypes"]),
                    ["ReportBatchItemFailures"],
                    "{}: partial batch responses",
                    f.name
                );
                assert!(
                    !routed && url.is_null() && schedules.is_empty(),
                    "{}",
                    f.name
                );
            }
            Trigger::WebSocket => {
                // Every route of the WebSocket API invokes it, through its one integration.
                let integrations = of_type(&doc, "AWS::ApiGatewayV2::Integration");
                let (integration, _) = integrations
                    .iter()
                    .find(|(_, i)| {
                        format!("{:?}", i["Properties"]["IntegrationUri"])
                            .contains(&format!("{}.Arn", f.logical_id))
                    })
                    .unwrap_or_else(|| panic!("{}: an integration", f.name));
                let mut keys: Vec<String> = of_type(&doc, "AWS::ApiGatewayV2::Route")
                    .into_iter()
                    .filter(|(_, r)| {
                        format!("{:?}", r["Properties"]["Target"]).contains(integration.as_str())
                    })
                    .map(|(_, r)| r["Properties"]["RouteKey"].as_str().unwrap().to_owned())
                    .collect();
                keys.sort();
                assert_eq!(
                    keys,
                    [
                        "$connect",
                        "$default",
                        "$disconnect",
                        "ping",
                        "subscribe",
                        "unsubscribe"
                    ],
                    "{}: its routes",
                    f.name
                );
                assert!(!routed && url.is_null() && sqs.is_empty() && schedules.is_empty());
            }
            Trigger::Stream => {
                // One event source mapping on the events table's stream, bounded retries,
                // partial batch responses, an on-failure destination.
                let mappings: Vec<_> = of_type(&doc, "AWS::Lambda::EventSourceMapping")
                    .into_iter()
                    .filter(|(_, m)| {
                        format!("{:?}", m["Properties"]["FunctionName"]).contains(f.logical_id)
                    })
                    .collect();
                assert_eq!(mappings.len(), 1, "{}: one event source mapping", f.name);
                let p = &mappings[0].1["Properties"];
                assert_eq!(
                    referenced(&p["EventSourceArn"]).1,
                    "EventsTable.StreamArn",
                    "{}",
                    f.name
                );
                assert_eq!(
                    strings(&p["FunctionResponseTypes"]),
                    ["ReportBatchItemFailures"]
                );
                assert_eq!(p["BisectBatchOnFunctionError"].as_bool(), Some(true));
                assert!(p["MaximumRetryAttempts"]
                    .as_i64()
                    .is_some_and(|n| (0..=10).contains(&n)));
                assert!(!p["DestinationConfig"]["OnFailure"]["Destination"].is_null());
                let events = &resources(&doc)["EventsTable"]["Properties"];
                assert_eq!(
                    events["StreamSpecification"]["StreamViewType"].as_str(),
                    Some("NEW_IMAGE")
                );
                // The notifier's retry pass runs on a schedule of its own too.
                let retry_schedules = usize::from(f.name == "notifier");
                assert_eq!(schedules.len(), retry_schedules, "{}: schedules", f.name);
                assert!(!routed && url.is_null() && sqs.is_empty());
            }
            Trigger::Schedule => {
                assert_eq!(schedules.len(), 1, "{}: one Schedule event", f.name);
                assert!(
                    schedules[0]["Properties"]["Schedule"].as_str().is_some(),
                    "{}: a schedule expression",
                    f.name
                );
                assert!(!routed && url.is_null() && sqs.is_empty(), "{}", f.name);
            }
        }
    }
}

/// The Makefile's `FUNCTIONS :=` (what `make build` packages) and the workspace members
/// are the registry's functions.
#[test]
fn the_makefile_and_the_workspace_build_exactly_the_registry() {
    let makefile = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../Makefile"));
    let listed: Vec<&str> = makefile
        .lines()
        .find_map(|l| l.strip_prefix("FUNCTIONS :="))
        .expect("a FUNCTIONS := line in the Makefile")
        .split_whitespace()
        .collect();
    let names: Vec<&str> = FUNCTIONS.iter().map(|f| f.name).collect();
    assert_eq!(listed, names, "Makefile FUNCTIONS vs the registry");

    let cargo = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml"));
    let members: BTreeSet<&str> = cargo
        .lines()
        .filter_map(|l| l.trim().strip_prefix("\"functions/"))
        .filter_map(|l| l.strip_suffix("\","))
        .collect();
    assert_eq!(
        members,
        names.iter().copied().collect(),
        "workspace members under functions/ vs the registry"
    );
}

/// Sends `method path` to the server at `base`: `Err` when its router does not serve it
/// (the JSON 404 "no such route" fallback, or 405 for a path served with another
/// method), else the status the handler answered.
async fn served(
    http: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
) -> Result<u16, String> {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let answer = http
        .request(method, format!("{base}{path}"))
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    let body: serde_json::Value = answer.json().await.unwrap_or_default();
    match status {
        404 if body["error"] == "no such route" => Err("404 no such route".into()),
        405 => Err("405 method not allowed".into()),
        _ => Ok(status),
    }
}

/// Every HTTP API route reaches a function whose router serves it: the function's own
/// router (from the registry, on the embedded store) is asked for that method and path.
#[tokio::test]
async fn every_api_route_is_served_by_the_function_it_invokes() {
    let doc = template();
    let routes = api_routes(&doc);
    assert!(!routes.is_empty());
    let http = reqwest::Client::new();
    let mut missing = Vec::new();
    for f in FUNCTIONS.iter().filter(|f| f.routes.is_some()) {
        let store = Arc::new(tollgate_store::memory::MemoryStore::new());
        let deps = tollgate_api::Deps::embedded(
            store,
            tollgate_api::GateConfig::default(),
            tollgate_api::Auth::new(b"template-test-secret-0123456789abcdef"),
        );
        let router = f.router(deps).expect("an HTTP function has a router");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, router).await });
        for (key, _) in routes.iter().filter(|(_, target)| target == f.logical_id) {
            let (method, template) = key.split_once(' ').expect("RouteKey is METHOD /path");
            // `{run_id}` → a well-formed id, so the request reaches the handler.
            let path = template
                .split('/')
                .map(|seg| match seg.starts_with('{') {
                    true => "probe-1",
                    false => seg,
                })
                .collect::<Vec<_>>()
                .join("/");
            if let Err(why) = served(&http, &base, method, &path).await {
                missing.push(format!("{key} → {} ({}): {why}", f.logical_id, f.name));
            }
        }
        server.abort();
    }
    assert!(missing.is_empty(), "routes not served: {missing:#?}");
    // (and every route targets a function of the registry)
    for (key, target) in &routes {
        let f = functions::by_logical_id(target)
            .unwrap_or_else(|| panic!("{key} → {target}, not in the registry"));
        assert!(f.routes.is_some(), "{key} → {target}, not an HTTP function");
    }
}

/// AWS advises a source queue's visibility timeout of at least six times the consuming
/// function's timeout, so a batch still being handled is not delivered again.
#[test]
fn sqs_event_sources_outlast_their_function() {
    let doc = template();
    let global_timeout = doc["Globals"]["Function"]["Timeout"].as_i64();
    for f in FUNCTIONS.iter().filter(|f| f.trigger == Trigger::Sqs) {
        let res = &resources(&doc)[f.logical_id];
        let timeout = res["Properties"]["Timeout"]
            .as_i64()
            .or(global_timeout)
            .expect("a timeout");
        for event in events_of_type(res, "SQS") {
            let (queue, _) = referenced(&event["Properties"]["Queue"]);
            let visibility = resources(&doc)[queue.as_str()]["Properties"]["VisibilityTimeout"]
                .as_i64()
                .unwrap_or(30);
            assert!(
                visibility >= 6 * timeout,
                "{queue}: VisibilityTimeout {visibility} < 6 × {}'s timeout {timeout}",
                f.name
            );
        }
    }
}

/// Tables whose items no retention may remove: scope grants (`PoliciesTable`) outlive
/// the runs that made them and end only by revocation.
const DURABLE_TABLES: [&str; 1] = ["PoliciesTable"];

/// Every table is on-demand, encrypted and recoverable; every table of run data expires
/// with the stack's retention (TTL).
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
        if DURABLE_TABLES.contains(&name.as_str()) {
            continue;
        }
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

/// Routes the code serves only through a streaming Function URL (API Gateway buffers
/// answers, so a live stream is never routed through the HTTP API).
const FUNCTION_URL_ONLY: &[&str] = &["GET /api/runs/{run_id}/stream"];

/// Routes only `tollgate serve` answers (not deployed): the contract's document, and the
/// WebSocket endpoint (deployed, the API Gateway WebSocket API speaks its protocol).
const SERVE_ONLY: &[&str] = &["GET /api/openapi.json", "GET /api/ws"];

/// The other direction of `every_api_route_is_served_by_the_function_it_invokes`: every
/// route the code declares is deployed — on the HTTP API, or (a live stream) through a
/// streaming Function URL — so a route added to a router but not to the template fails
/// here, as does a template route no router declares.
#[test]
fn every_route_the_code_declares_is_in_the_template() {
    let declared = tollgate_tests::routes::code_routes();
    assert!(declared.len() >= 20, "{declared:?}");
    let deployed: BTreeSet<String> = api_routes(&template())
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let expected: BTreeSet<String> = declared
        .iter()
        .filter(|r| !FUNCTION_URL_ONLY.contains(&r.as_str()) && !SERVE_ONLY.contains(&r.as_str()))
        .cloned()
        .collect();
    assert_eq!(
        expected.difference(&deployed).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "routes the code declares that the template does not deploy"
    );
    assert_eq!(
        deployed.difference(&expected).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "template routes no router declares"
    );
    for only in FUNCTION_URL_ONLY.iter().chain(SERVE_ONLY) {
        assert!(declared.contains(*only), "{only} is declared");
    }
}

/// The README's deploy parameter table names exactly the template's parameters.
#[test]
fn the_readme_documents_every_template_parameter() {
    let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"));
    let section = readme
        .split_once("\n### Parameters\n")
        .expect("a ### Parameters section in the README")
        .1;
    let section = section.split("\n#").next().unwrap();
    let documented: BTreeSet<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(" | ").next())
        .flat_map(|cell| cell.split(", "))
        .filter_map(|name| name.strip_prefix('`')?.strip_suffix('`'))
        .map(str::to_owned)
        .collect();
    let doc = template();
    let parameters: BTreeSet<String> = doc["Parameters"]
        .as_mapping()
        .expect("Parameters")
        .keys()
        .map(|k| k.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(documented, parameters, "README parameter table vs template");
}
