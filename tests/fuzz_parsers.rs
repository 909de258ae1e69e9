//! Property tests (proptest) of everything that parses what a client or a server sends:
//! every request body of every POST route, bearer tokens (JWTs and run tokens), `after`
//! and `Last-Event-ID`, `agenthost_origin`, the JWT decoder, and the client's SSE parser.
//! Each property is checked on `PROPTEST_CASES` generated inputs (proptest's default, 256,
//! in `make test`; `make fuzz` runs many more). The HTTP ones go to an in-process server on
//! the embedded store: no input may get a 5xx, an error is JSON with its `code`, and a 4xx
//! writes nothing.

use std::sync::OnceLock;

use proptest::prelude::*;
use reqwest::StatusCode;
use serde_json::{json, Map, Value};
use tollgate_api::auth::Claims;
use tollgate_api::jwt::{decode, Hs256Key};
use tollgate_api::{Auth, Role};
use tollgate_client::sse::{SseItem, SseParser};
use tollgate_tests::{Backend, TestServer, TEST_SECRET};

/// One server for the whole binary, on a runtime of its own.
struct Fixture {
    rt: tokio::runtime::Runtime,
    srv: TestServer,
    /// A running run with an approved card, and a completed run.
    run_id: String,
    run_token: String,
    done_run: String,
    done_token: String,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (srv, run_id, run_token, done_run, done_token) = rt.block_on(async {
            let srv = TestServer::start(Backend::Memory).await;
            let (run_id, run_token) = srv
                .create_run(json!({"owner": "alice",
                    "budget": {"tools": {"web_fetch": 5}, "call_ceiling": 5}}))
                .await;
            // The id the generated bodies also use, so that some decisions find the card.
            let request_id = "3f2b3c1e-1111-4222-8333-944445555666";
            let (status, v) = srv
                .post(
                    &format!("/api/runs/{run_id}/approval-requests"),
                    &run_token,
                    &json!({"request_id": request_id, "tool_name": "web_fetch",
                            "tool_call_id": "call-1", "approval_id": "approval-1"}),
                )
                .await;
            assert_eq!(status, StatusCode::CREATED, "{v}");
            let (done_run, done_token) = srv.create_run(json!({})).await;
            let (status, v) = srv
                .post(
                    &format!("/api/runs/{done_run}/complete"),
                    &done_token,
                    &json!({}),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{v}");
            (srv, run_id, run_token, done_run, done_token)
        });
        Fixture {
            rt,
            srv,
            run_id,
            run_token,
            done_run,
            done_token,
        }
    })
}

/// Field names the routes read, and some they do not.
const KEYS: &[&str] = &[
    "events",
    "type",
    "event_id",
    "request_id",
    "tool_name",
    "tool_call_id",
    "approval_id",
    "url",
    "intention",
    "message",
    "arguments_hash",
    "timeout_seconds",
    "scope",
    "evidence",
    "result",
    "error",
    "observed",
    "run_id",
    "kind",
    "parent_run_id",
    "subtask_id",
    "owner",
    "project_id",
    "channel_id",
    "delivery_id",
    "budget",
    "tools",
    "call_ceiling",
    "execution_mode",
    "agenthost_origin",
    "sequence",
    "protocol_version",
    "requestId",
    "expired",
    "x",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        prop_oneof![
            "[a-z_.]{0,12}",
            ".{0,24}",
            Just("web_fetch".to_owned()),
            Just("once".to_owned()),
            Just("always".to_owned()),
            Just("confirmed".to_owned()),
            Just("applied".to_owned()),
            Just("https://example.com".to_owned()),
            Just("3f2b3c1e-1111-4222-8333-944445555666".to_owned()),
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..8).prop_map(|kv| {
                Value::Object(
                    kv.into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect::<Map<_, _>>(),
                )
            }),
        ]
    })
}

/// A body: generated JSON, or raw bytes (often not JSON at all).
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}

/// How many events the run has (read as an operator).
async fn event_count(f: &Fixture, run_id: &str) -> usize {
    let (status, page) = f
        .srv
        .get(
            &format!("/api/runs/{run_id}/events?after=0&limit=1000"),
            &f.srv.operator_token,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["events"].as_array().unwrap().len()
}

/// Sends raw `body` to `path` with `token`: the status, and the body as JSON (asserting
/// that it is JSON and that an error carries its code).
async fn post_raw(f: &Fixture, path: &str, token: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let resp = f
        .srv
        .http
        .post(f.srv.url(path))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("the server answers");
    let status = resp.status();
    let text = resp.text().await.unwrap();
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("every answer is JSON: {status} {text:?}"));
    if !status.is_success() {
        assert!(v["code"].is_string(), "{status} {v}");
    }
    (status, v)
}

proptest! {
    // Cases from `PROPTEST_CASES`; what a failure found becomes a named test below, not a
    // file of seeds.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// Every POST route, any body: never a 5xx, and a 4xx writes nothing on the run.
    #[test]
    fn request_bodies(route in 0usize..11, body in body()) {
        let f = fixture();
        let (run, call) = (&f.run_id, "call-1");
        let (path, token) = match route {
            0 => ("/api/runs".to_owned(), f.srv.agent_token.clone()),
            1 => (format!("/api/runs/{run}/events"), f.run_token.clone()),
            2 => (format!("/api/runs/{run}/approval-requests"), f.run_token.clone()),
            3 => (format!("/api/runs/{run}/tool-approvals"), f.srv.operator_token.clone()),
            4 => (format!("/api/runs/{run}/tool-denials"), f.srv.operator_token.clone()),
            5 => (format!("/api/runs/{run}/tool-calls/{call}/start"), f.run_token.clone()),
            6 => (format!("/api/runs/{run}/tool-calls/{call}/dispatch"), f.run_token.clone()),
            7 => (format!("/api/runs/{run}/tool-calls/{call}/settle"), f.run_token.clone()),
            8 => (format!("/api/runs/{run}/mutations/{call}/approval-1/reconcile"),
                  f.srv.operator_token.clone()),
            9 => (format!("/api/runs/{}/complete", f.done_run), f.done_token.clone()),
            _ => (format!("/api/runs/{run}/fail"), f.run_token.clone()),
        };
        // Ending the shared run would end every later case's run: only malformed ends.
        let body = if route == 10
            && (body.iter().all(u8::is_ascii_whitespace) || serde_json::from_slice::<Value>(&body).is_ok())
        {
            b"{".to_vec()
        } else {
            body
        };
        f.rt.block_on(async {
            let before = event_count(f, run).await;
            let (status, v) = post_raw(f, &path, &token, body).await;
            prop_assert!(!status.is_server_error(), "{path}: {status} {v}");
            if status.is_client_error() {
                prop_assert_eq!(event_count(f, run).await, before, "{} {}: {} wrote", path, status, v);
            }
            Ok(())
        })?;
    }

    /// `after` of any text: 200 or 400, never more.
    #[test]
    fn after_query(after in prop_oneof![".{0,24}", "[0-9]{0,30}", "-?[0-9]{1,5}", Just("18446744073709551616".to_owned())]) {
        let f = fixture();
        f.rt.block_on(async {
            let url = reqwest::Url::parse_with_params(
                &f.srv.url(&format!("/api/runs/{}/events", f.run_id)),
                &[("after", after.as_str())],
            ).unwrap();
            let resp = f.srv.http.get(url).bearer_auth(&f.run_token).send().await.unwrap();
            let status = resp.status();
            prop_assert!(status == StatusCode::OK || status == StatusCode::BAD_REQUEST, "{after:?}: {status}");
            Ok(())
        })?;
    }

    /// `Last-Event-ID` of any text on an ended run's stream: 200 (a stream that ends) or
    /// 400.
    #[test]
    fn last_event_id(id in prop_oneof!["[ -~]{0,24}", "[0-9]{0,25}", Just(" 1".to_owned()), Just("+1".to_owned())]) {
        let f = fixture();
        f.rt.block_on(async {
            let resp = f.srv.http
                .get(f.srv.url(&format!("/api/runs/{}/stream", f.done_run)))
                .bearer_auth(&f.done_token)
                .header("last-event-id", id.as_str())
                .send().await.unwrap();
            let status = resp.status();
            prop_assert!(status == StatusCode::OK || status == StatusCode::BAD_REQUEST, "{id:?}: {status}");
            let text = tokio::time::timeout(std::time::Duration::from_secs(10), resp.text())
                .await.expect("an ended run's stream ends").unwrap();
            if status == StatusCode::OK {
                prop_assert!(text.contains("event: done"), "{id:?}: {text}");
            }
            Ok(())
        })?;
    }

    /// Any bearer, or the run's token changed in one place: never let in — unless the
    /// change is only the case of a hex digit (the same token: see
    /// `a_run_token_in_upper_case_hex_is_the_same_token`).
    #[test]
    fn bearer_tokens(raw in "[ -~]{0,80}", at in any::<prop::sample::Index>(), c in "[0-9a-zA-Z._-]") {
        let f = fixture();
        let mut forged = f.run_token.clone().into_bytes();
        let i = at.index(forged.len());
        forged[i] = c.as_bytes()[0];
        let forged = String::from_utf8(forged).unwrap();
        f.rt.block_on(async {
            for token in [raw.as_str(), forged.as_str()] {
                if token.to_ascii_lowercase() == f.run_token {
                    continue;
                }
                let path = format!("/api/runs/{}/events", f.run_id);
                let (status, v) = post_raw(f, &path, token, br#"{"events":[{"type":"x.y"}]}"#.to_vec()).await;
                prop_assert!(status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN,
                    "{token:?}: {status} {v}");
            }
            Ok(())
        })?;
    }

    /// The client's SSE parser: any bytes, split anywhere, give the same items as
    /// whole.
    #[test]
    fn sse_parser(parts in prop::collection::vec(prop_oneof![
        Just("id: 1\n".to_owned()), Just("event: x\n".to_owned()), Just("data: {}\n".to_owned()),
        Just("data:\n".to_owned()), Just("retry: 3000\n".to_owned()), Just(": keep-alive\n".to_owned()),
        Just("\n".to_owned()), Just("\r\n".to_owned()), Just("\r".to_owned()), Just("event: done\n\n".to_owned()),
        "[ -~]{0,12}",
    ], 0..40), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8)) {
        let bytes = parts.concat().into_bytes();
        let whole = SseParser::new().feed(&bytes);
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        at.sort_unstable();
        let mut parser = SseParser::new();
        let mut pieces: Vec<SseItem> = Vec::new();
        let mut from = 0;
        for to in at.into_iter().chain([bytes.len()]) {
            pieces.extend(parser.feed(&bytes[from..to]));
            from = to;
        }
        prop_assert_eq!(whole, pieces);
    }
}

/// Found by `bearer_tokens`: the MAC part of a run token (after its 16-digit incarnation)
/// is hex read case-insensitively, so that part in upper case is the same credential (the
/// same bytes; nothing is forged). Kept as a test so that a change of that reading is a
/// decision.
#[test]
fn a_run_token_in_upper_case_hex_is_the_same_token() {
    let f = fixture();
    f.rt.block_on(async {
        let path = format!("/api/runs/{}/events?after=0&limit=1", f.run_id);
        let (incarnation, mac) = f.run_token.split_at(16);
        let upper = format!("{incarnation}{}", mac.to_ascii_uppercase());
        assert_ne!(upper, f.run_token);
        let (status, _) = f.srv.get(&path, &upper).await;
        assert_eq!(status, StatusCode::OK);
        // The incarnation is not hex-decoded: in upper case it names another incarnation.
        let upper = format!("{}{mac}", incarnation.to_ascii_uppercase());
        if upper != f.run_token {
            let (status, _) = f.srv.get(&path, &upper).await;
            assert!(
                status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN,
                "{status}"
            );
        }
        let mut other = f.run_token.clone().into_bytes();
        let last = other.len() - 1;
        other[last] = if other[last] == b'0' { b'1' } else { b'0' };
        let (status, _) = f.srv.get(&path, std::str::from_utf8(&other).unwrap()).await;
        assert!(
            status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN,
            "{status}"
        );
    });
}

/// Runs `strategy` through `check` on `PROPTEST_CASES` cases (proptest's config); `check`
/// answers whether the case reached the property (not only the no-panic part). Fails when
/// none did: a property no generated case reaches proves nothing.
fn reaching<S: Strategy>(
    name: &str,
    strategy: S,
    check: impl Fn(S::Value) -> Result<bool, TestCaseError>,
) {
    let config = ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let cases = config.cases;
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let reached = std::sync::atomic::AtomicU32::new(0);
    runner
        .run(&strategy, |v| {
            if check(v)? {
                reached.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let reached = reached.into_inner();
    eprintln!("{name}: {reached} of {cases} cases reached the property");
    assert!(
        reached > 0,
        "{name}: no case of {cases} reached the property"
    );
}

/// The JWT decoder on any text never panics; a valid token changed in one place never
/// verifies to other claims. Half the changes hit the signature's last character, whose
/// low bits the encoding does not use; the raw texts are JWT-shaped half the time.
#[test]
fn jwt_decoder() {
    let key = Hs256Key::new(TEST_SECRET.as_bytes());
    let auth = Auth::new(TEST_SECRET.as_bytes());
    let token = auth.mint_jwt("op", Role::Operator, 3600, Some("p1".into()));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let good: Claims = decode(&key, &token, now, Some(86_400)).expect("a minted token verifies");
    let last = token.len() - 1;
    let strategy = (
        prop_oneof![
            "[ -~]{0,200}",
            "[A-Za-z0-9_-]{0,40}\\.[A-Za-z0-9_-]{0,60}\\.[A-Za-z0-9_-]{0,44}"
        ],
        prop_oneof![Just(None), any::<prop::sample::Index>().prop_map(Some)],
        "[0-9a-zA-Z_-]",
    );
    reaching("jwt_decoder", strategy, |(raw, at, c)| {
        let _ = decode::<Claims>(&key, &raw, 1_800_000_000, Some(86_400));
        let mut bytes = token.clone().into_bytes();
        let i = at.map_or(last, |at| at.index(bytes.len()));
        bytes[i] = c.as_bytes()[0];
        let changed = String::from_utf8(bytes).unwrap();
        if changed == token {
            return Ok(false);
        }
        // Reached: a forged token was put to the verifier (refused, or — a change the
        // decoding ignores — the same claims).
        if let Ok(claims) = decode::<Claims>(&key, &changed, now, Some(86_400)) {
            prop_assert_eq!(claims, good.clone(), "{} verified", changed);
        }
        Ok(true)
    });
}

/// `agenthost_origin`: never a panic; an accepted origin is https, or http to loopback
/// only where allowed (some generated origins are accepted: the property is reached).
#[test]
fn origins() {
    let strategy = (
        prop_oneof![
            "[ -~]{0,40}",
            "(https?|ftp|file)://[a-z0-9.:@\\[\\]%-]{0,30}(/[ -~]{0,8})?",
            "https?://(127\\.0\\.0\\.1|localhost|\\[::1\\]|10\\.0\\.0\\.1|169\\.254\\.169\\.254|0x7f000001|2130706433)(:[0-9]{1,5})?/?",
            "https://[a-z]{1,12}\\.example\\.com(:[0-9]{1,4})?",
        ],
        any::<bool>(),
    );
    reaching("origins", strategy, |(origin, allow)| {
        if tollgate_api::forward::check_origin(&origin, allow).is_err() {
            return Ok(false);
        }
        let url = reqwest::Url::parse(&origin).unwrap();
        prop_assert!(
            url.scheme() == "https" || (allow && url.scheme() == "http"),
            "{} accepted",
            origin
        );
        prop_assert!(
            url.username().is_empty() && url.password().is_none(),
            "{}",
            origin
        );
        Ok(true)
    });
}
