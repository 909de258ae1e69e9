//! The server's answers in `fixtures/wire/` read through the client's types: the fields
//! the client relies on, and the raw JSON a type keeps equal to the fixture.

use axum::response::IntoResponse;
use serde_json::Value;
use tollgate_client::operator::{CardPage, DecisionAnswer};
use tollgate_client::sse::{SseFrame, SseItem, SseParser};
use tollgate_client::{protocol, Client, RunSpec};

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
    let wire: protocol::approvals::CardPage = serde_json::from_value(body.clone()).unwrap();
    // The contract's type holds every field the server sent: it writes the fixture back.
    assert_eq!(serde_json::to_value(&wire).unwrap(), body);
    let page = CardPage::from(wire);
    assert!(page.has_more);
    assert_eq!(page.next_after.as_deref(), body["next_after"].as_str());
    assert_eq!(page.cards.len(), 2);
    let [web, pod] = &page.cards[..] else {
        unreachable!()
    };
    assert_eq!(web.run_id, "run-5f0c7a2e");
    assert_eq!(web.display_id, "5f0c7a2e");
    assert_eq!(web.tool_name, "web_fetch");
    assert_eq!(web.url.as_deref(), Some("https://example.com/docs"));
    assert_eq!(web.message, None, "null reads as absent");
    assert_eq!(web.held_by, None);
    assert_eq!(web.expires_at, "2026-11-30T12:05:00.000Z");
    assert_eq!(pod.held_by.as_deref(), Some("pod"));
    assert_eq!(pod.url, None);
    assert_eq!(pod.intention.as_deref(), Some("list files"));
}

#[test]
fn decision_answers() {
    let raw = json(fixture!("decision_approved.json"));
    let answer: DecisionAnswer = serde_json::from_value(raw.clone()).unwrap();
    assert_eq!(answer.state, "approved");
    assert!(!answer.expired);
    assert_eq!(answer.decided_by.as_deref(), Some("alice"));
    assert_eq!(answer.reason, None);
    assert_eq!(serde_json::to_value(&answer).unwrap(), raw);

    let raw = json(fixture!("decision_expired_run_ended.json"));
    let answer: DecisionAnswer = serde_json::from_value(raw.clone()).unwrap();
    assert_eq!(answer.state, "expired");
    assert!(answer.expired);
    assert_eq!(answer.decided_by, None);
    assert_eq!(answer.reason.as_deref(), Some("run_ended"));
    assert_eq!(serde_json::to_value(&answer).unwrap(), raw);
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
    let end: protocol::events::StreamEnd = serde_json::from_str(&done.data).unwrap();
    assert_eq!(end.terminal_sequence, events.len() as u64);
    for (i, frame) in events.iter().enumerate() {
        let event: protocol::Event = serde_json::from_str(&frame.data).unwrap();
        assert!(!frame.is_done());
        assert_eq!(frame.sequence(), Some(i as u64 + 1));
        assert_eq!(event.sequence, i as u64 + 1);
        assert_eq!(event.event_type, frame.event);
        assert_eq!(serde_json::to_value(&event).unwrap(), json(&frame.data));
    }
    let required: protocol::events::Event = serde_json::from_str(&events[1].data).unwrap();
    let required: protocol::events::ApprovalRequired = required.payload_as().unwrap();
    let resolved: protocol::Event = serde_json::from_str(&events[2].data).unwrap();
    assert_eq!(events[2].event, tollgate_client::gate::APPROVAL_RESOLVED);
    let resolved: protocol::events::ApprovalResolved = resolved.payload_as().unwrap();
    assert_eq!(resolved.request_id, required.request_id);
}
