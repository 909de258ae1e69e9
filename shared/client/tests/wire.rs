//! The server's answers in `fixtures/wire/` read through the client's types: the fields
//! the client relies on, and the raw JSON a type keeps equal to the fixture.

use axum::response::IntoResponse;
use serde_json::Value;
use tollgate_client::operator::{CardPage, DecisionAnswer};
use tollgate_client::sse::{SseFrame, SseItem, SseParser};
use tollgate_client::{Client, RunSpec};

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/wire/",
            $name
        ))
    };
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).expect("a fixture is JSON")
}

/// `POST /api/runs` answered with `receipt` by a loopback server: the run the client
/// makes of it.
async fn created_from(receipt: &'static str) -> tollgate_client::Run {
    let app = axum::Router::new().route(
        "/api/runs",
        axum::routing::post(move || async move {
            (
                axum::http::StatusCode::CREATED,
                [("content-type", "application/json")],
                receipt,
            )
                .into_response()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = Client::new(&base, "agent-jwt").unwrap();
    client.create_run(RunSpec::default()).await.unwrap()
}

#[tokio::test]
async fn run_receipts() {
    let want = json(fixture!("run_receipt.json"));
    let run = created_from(fixture!("run_receipt.json")).await;
    assert!(run.created());
    assert_eq!(run.id(), want["run_id"]);
    assert_eq!(run.token(), want["run_token"]);
    assert_eq!(run.agenthost_credential(), None);

    let want = json(fixture!("run_receipt_pod.json"));
    let run = created_from(fixture!("run_receipt_pod.json")).await;
    assert_eq!(run.id(), want["run_id"]);
    assert_eq!(
        run.agenthost_credential(),
        want["agenthost_credential"].as_str()
    );
}

#[test]
fn a_card_listing() {
    let body = json(fixture!("approvals_page.json"));
    let page = CardPage::from_json(&body);
    assert!(page.has_more);
    assert_eq!(page.next_after.as_deref(), body["next_after"].as_str());
    assert_eq!(page.cards.len(), 2);
    let [web, pod] = &page.cards[..] else {
        unreachable!()
    };
    assert_eq!(web.run_id.as_deref(), Some("run-5f0c7a2e"));
    assert_eq!(web.display_id.as_deref(), Some("5f0c7a2e"));
    assert_eq!(web.tool_name.as_deref(), Some("web_fetch"));
    assert_eq!(web.url.as_deref(), Some("https://example.com/docs"));
    assert_eq!(web.message, None, "null reads as absent");
    assert_eq!(web.held_by, None);
    assert_eq!(web.expires_at.as_deref(), Some("2026-11-30T12:05:00.000Z"));
    assert_eq!(pod.held_by.as_deref(), Some("pod"));
    assert_eq!(pod.url, None);
    assert_eq!(pod.intention.as_deref(), Some("list files"));
    // Each card keeps the server's JSON as it came.
    for (card, raw) in page.cards.iter().zip(body["approvals"].as_array().unwrap()) {
        assert_eq!(&card.raw, raw);
        assert_eq!(card.request_id.as_deref(), raw["request_id"].as_str());
    }
}

#[test]
fn decision_answers() {
    let raw = json(fixture!("decision_approved.json"));
    let answer = DecisionAnswer::from_json(raw.clone());
    assert_eq!(answer.state.as_deref(), Some("approved"));
    assert!(!answer.expired);
    assert_eq!(answer.decided_by.as_deref(), Some("alice"));
    assert_eq!((answer.scope, answer.reason), (None, None));
    assert_eq!(answer.raw, raw);

    let raw = json(fixture!("decision_expired_run_ended.json"));
    let answer = DecisionAnswer::from_json(raw.clone());
    assert_eq!(answer.state.as_deref(), Some("expired"));
    assert!(answer.expired);
    assert_eq!(answer.decided_by, None);
    assert_eq!(answer.reason.as_deref(), Some("run_ended"));
    assert_eq!(answer.raw, raw);
}

#[test]
fn a_live_stream_response() {
    let text = fixture!("live_stream.sse");
    let items = SseParser::new().feed(text.as_bytes());
    let SseItem::Retry(1000) = items[0] else {
        panic!("{:?}", items[0])
    };
    let frames: Vec<&SseFrame> = items[1..]
        .iter()
        .map(|i| match i {
            SseItem::Frame(f) => f,
            other => panic!("{other:?}"),
        })
        .collect();
    let (done, events) = frames.split_last().unwrap();
    assert!(done.is_done());
    assert_eq!(json(&done.data)["terminal_sequence"], events.len() as u64);
    for (i, frame) in events.iter().enumerate() {
        let event = json(&frame.data);
        assert!(!frame.is_done());
        assert_eq!(frame.sequence(), Some(i as u64 + 1));
        assert_eq!(event["sequence"], i as u64 + 1);
        assert_eq!(event["type"], frame.event.as_str());
    }
    let resolved = json(&events[2].data);
    assert_eq!(events[2].event, tollgate_client::gate::APPROVAL_RESOLVED);
    assert_eq!(resolved["requestId"], json(&events[1].data)["requestId"]);
}
