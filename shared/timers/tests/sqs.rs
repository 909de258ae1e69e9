//! `SqsTimers` against SQS: LocalStack started by `make test`
//! (`tests/harness/emulators.sh with ...`), any endpoint in `AWS_ENDPOINT_URL` /
//! `AWS_ENDPOINT_URL_SQS`, or real AWS with `TOLLGATE_TEST_REAL_AWS=1`. Without one, each
//! test says so and passes, so a plain `cargo nextest run` needs no emulator. The binary
//! is `timers_sqs`, which the Makefile's `AWS_TESTS` filter selects.
//!
//! Each test works on its own fresh queue (deleted at the end), so tests never receive
//! each other's messages.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_sqs::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_sqs::error::BoxError;
use aws_sdk_sqs::types::MessageSystemAttributeName;
use aws_sdk_sqs::Client;
use tollgate_timers::{ensure_queue, sqs_client, SqsTimers, TimerError, TimerMessage, TimerQueue};

fn sqs_endpoint_configured() -> bool {
    [
        "AWS_ENDPOINT_URL_SQS",
        "AWS_ENDPOINT_URL",
        "TOLLGATE_TEST_REAL_AWS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// The JSON bodies of the requests a client sends: what SQS was asked, whatever an
/// emulator then accepts (LocalStack 3.8.1 takes a `DelaySeconds` above 900; SQS refuses it).
#[derive(Debug, Clone, Default)]
struct SentRequests(Arc<Mutex<Vec<serde_json::Value>>>);

impl Intercept for SentRequests {
    fn name(&self) -> &'static str {
        "SentRequests"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(body) = context.request().body().bytes() {
            if let Ok(json) = serde_json::from_slice(body) {
                self.0.lock().unwrap().push(json);
            }
        }
        Ok(())
    }
}

impl SentRequests {
    /// `DelaySeconds` of the last request that had one.
    fn last_delay_seconds(&self) -> Option<i64> {
        let sent = self.0.lock().unwrap();
        sent.iter().rev().find_map(|r| r["DelaySeconds"].as_i64())
    }
}

/// A fresh queue; `None` (and a note on stderr) when no SQS endpoint is configured.
struct Fixture {
    /// The client with Tollgate's timeouts, as production uses it (plus a recorder).
    client: Client,
    sent: SentRequests,
    /// A client without the 2 s attempt timeout, for long polls.
    poller: Client,
    queue_url: String,
}

impl Fixture {
    async fn new(test: &str) -> Option<Self> {
        if !sqs_endpoint_configured() {
            eprintln!("{test}: skipped, no SQS endpoint (AWS_ENDPOINT_URL_SQS / AWS_ENDPOINT_URL)");
            return None;
        }
        let config = aws_config::load_from_env().await;
        let sent = SentRequests::default();
        let client = sqs_client(&config);
        let client = Client::from_conf(
            client
                .config()
                .to_builder()
                .interceptor(sent.clone())
                .build(),
        );
        let name = format!("tollgate-test-timers-{}", uuid::Uuid::new_v4().simple());
        let queue_url = ensure_queue(&client, &name)
            .await
            .expect("create the queue");
        Some(Self {
            client,
            sent,
            poller: Client::new(&config),
            queue_url,
        })
    }

    fn timers(&self) -> SqsTimers {
        SqsTimers::new(self.client.clone(), self.queue_url.clone())
    }

    /// Receives up to 10 messages, waiting up to `wait_seconds` for the first.
    async fn receive(&self, wait_seconds: i32) -> Vec<aws_sdk_sqs::types::Message> {
        self.poller
            .receive_message()
            .queue_url(&self.queue_url)
            .wait_time_seconds(wait_seconds)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .expect("ReceiveMessage")
            .messages
            .unwrap_or_default()
    }

    async fn delete(self) {
        let _ = self
            .poller
            .delete_queue()
            .queue_url(&self.queue_url)
            .send()
            .await;
    }
}

fn expiry(run_id: &str) -> TimerMessage {
    TimerMessage::ApprovalExpiry {
        run_id: run_id.into(),
        request_id: "req-1".into(),
        due_at_millis: 1_795_989_600_000,
    }
}

#[tokio::test]
async fn ensure_queue_is_idempotent() {
    let Some(fx) = Fixture::new("ensure_queue_is_idempotent").await else {
        return;
    };
    let name = fx.queue_url.rsplit('/').next().unwrap().to_owned();
    let again = ensure_queue(&fx.client, &name).await.unwrap();
    assert_eq!(again, fx.queue_url);
    fx.delete().await;
}

#[tokio::test]
async fn a_timer_arrives_after_its_delay_with_the_same_message() {
    // GIVEN a fresh queue
    let Some(fx) = Fixture::new("a_timer_arrives_after_its_delay_with_the_same_message").await
    else {
        return;
    };
    let run_id = format!("run-{}", uuid::Uuid::new_v4().simple());
    let message = expiry(&run_id);

    // WHEN a timer is scheduled with a 1 s delay
    let sent = Instant::now();
    fx.timers()
        .schedule(&message, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(fx.sent.last_delay_seconds(), Some(1));

    // THEN it is not visible at once
    assert!(fx.receive(0).await.is_empty(), "visible before its delay");

    // AND a long poll gets it after about 1 s, with the same message and its kind
    let mut received = Vec::new();
    while received.is_empty() && sent.elapsed() < Duration::from_secs(10) {
        received = fx.receive(5).await;
    }
    let elapsed = sent.elapsed();
    assert_eq!(received.len(), 1, "{received:?}");
    assert!(
        elapsed >= Duration::from_millis(900),
        "arrived after {elapsed:?}"
    );
    let got = &received[0];
    let body = got.body().unwrap();
    assert_eq!(serde_json::from_str::<TimerMessage>(body).unwrap(), message);
    let kind = got.message_attributes().unwrap()["timer_kind"].string_value();
    assert_eq!(kind, Some("approval_expiry"));
    fx.delete().await;
}

#[tokio::test]
async fn a_delay_past_fifteen_minutes_is_sent_with_the_maximum() {
    // GIVEN a fresh queue
    let Some(fx) = Fixture::new("a_delay_past_fifteen_minutes_is_sent_with_the_maximum").await
    else {
        return;
    };
    let message = TimerMessage::ApprovalHeartbeat {
        run_id: format!("run-{}", uuid::Uuid::new_v4().simple()),
        request_id: "req-1".into(),
        beat: 1,
    };

    // WHEN a timer is scheduled 2 hours ahead THEN it is sent with DelaySeconds 900,
    // which SQS accepts (it refuses more), and it is not visible yet
    fx.timers()
        .schedule(&message, Duration::from_secs(2 * 3600))
        .await
        .unwrap();
    assert_eq!(fx.sent.last_delay_seconds(), Some(900));
    assert!(fx.receive(1).await.is_empty());
    fx.delete().await;
}

#[tokio::test]
async fn a_missing_queue_is_unavailable_without_its_url_in_the_error() {
    let Some(fx) =
        Fixture::new("a_missing_queue_is_unavailable_without_its_url_in_the_error").await
    else {
        return;
    };
    let missing = format!("{}-missing", fx.queue_url);
    let timers = SqsTimers::new(fx.client.clone(), missing.clone());
    let err = timers
        .schedule(&expiry("run-missing"), Duration::ZERO)
        .await
        .unwrap_err();
    let TimerError::Unavailable(detail) = &err;
    assert!(detail.starts_with("SendMessage: "), "{detail}");
    let name = missing.rsplit('/').next().unwrap();
    assert!(!err.to_string().contains(name), "{err} leaks the queue");
    fx.delete().await;
}
