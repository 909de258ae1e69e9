//! The consumer side of the SQS timer queue outside Lambda: [`SqsConsumer`], a loop in
//! this process that long-polls the queue and hands each message to a [`TimerHandler`]
//! (`tollgate serve --backend aws`). Deployed, Lambda's event source mapping does the
//! receiving and [`crate::lambda::handle_sqs_batch`] the handling; both use the same
//! per-record step, [`handle_record`].
//!
//! Delivery stays at least once: a message is deleted only after its handler answered
//! `Ok`; one that fails, panics or does not parse stays in the queue and comes back after
//! the queue's visibility timeout (or goes to its dead-letter queue, if it has one).

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName};
use aws_sdk_sqs::Client;
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::sqs::{sqs_client, unavailable};
use crate::{TimerError, TimerHandler, TimerMessage};

/// Records of one batch handled at once (a batch has up to 10 records, or more with a
/// batching window on Lambda).
pub const MAX_CONCURRENT_RECORDS: usize = 8;

/// The longest `WaitTimeSeconds` SQS accepts.
pub const MAX_WAIT: Duration = Duration::from_secs(20);

/// Why a record was not done (it stays in the queue).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotDone {
    /// The body is not a [`TimerMessage`]; redelivery will not help (dead-letter queue).
    Malformed,
    /// The handler answered `Err` or panicked; redelivery retries it.
    Failed,
}

/// One queue record: its body parsed as a [`TimerMessage`] and given to `handler`.
/// `message_id` and `receive_count` are only logged. A body that does not parse is
/// logged and reported [`NotDone::Malformed`]; a handler that fails or panics is logged
/// and reported [`NotDone::Failed`]. Never panics.
pub(crate) async fn handle_record(
    handler: &dyn TimerHandler,
    message_id: &str,
    receive_count: &str,
    body: &str,
) -> Result<(), NotDone> {
    let message = match serde_json::from_str::<TimerMessage>(body) {
        Ok(message) => message,
        Err(err) => {
            tracing::error!(
                message_id,
                receive_count,
                error = %err,
                "malformed timer message; left for the dead-letter queue"
            );
            return Err(NotDone::Malformed);
        }
    };
    let (kind, run_id, request_id) = (
        message.kind(),
        message.run_id().to_owned(),
        message.request_id().to_owned(),
    );
    let outcome = AssertUnwindSafe(handler.handle(message))
        .catch_unwind()
        .await;
    let error = match outcome {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(err)) => err.to_string(),
        Err(_) => "the handler panicked".to_owned(),
    };
    tracing::warn!(
        message_id,
        receive_count,
        kind,
        run_id,
        request_id,
        %error,
        "timer failed; SQS redelivers it"
    );
    Err(NotDone::Failed)
}

/// How an [`SqsConsumer`] polls and backs off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerOptions {
    /// `WaitTimeSeconds` of each `ReceiveMessage` (whole seconds, at most [`MAX_WAIT`]).
    pub wait: Duration,
    /// The pause after a failed `ReceiveMessage`, doubling on each failure in a row up to
    /// `max_backoff`; a successful receive starts again from here.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// How long [`SqsConsumer::shutdown`] waits for the batch in hand before aborting it.
    pub shutdown_grace: Duration,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        Self {
            wait: MAX_WAIT,
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl ConsumerOptions {
    fn wait_seconds(&self) -> i32 {
        i32::try_from(self.wait.min(MAX_WAIT).as_secs()).unwrap_or(20)
    }

    /// The pause after `failures` failed receives in a row (1-based).
    fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(20);
        self.first_backoff
            .saturating_mul(1 << doublings)
            .min(self.max_backoff)
            .max(Duration::from_millis(10))
    }
}

/// An SQS client for long polls: Tollgate's connect timeout, and attempt and operation
/// timeouts that outlast a `ReceiveMessage` waiting `wait` ([`sqs_client`]'s 3 s would cut
/// every long poll short).
pub fn sqs_poll_client(sdk: &aws_config::SdkConfig, wait: Duration) -> Client {
    let wait = wait.min(MAX_WAIT);
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(1))
        .operation_attempt_timeout(wait + Duration::from_secs(5))
        .operation_timeout(wait + Duration::from_secs(10))
        .build();
    Client::from_conf(
        aws_sdk_sqs::config::Builder::from(sdk)
            .timeout_config(timeouts)
            .build(),
    )
}

/// A running consumer of one SQS timer queue in this process. Dropping it (or
/// [`shutdown`](Self::shutdown)) stops the loop; a drop lets the batch in hand finish in
/// the background.
pub struct SqsConsumer {
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
    queue_url: String,
    grace: Duration,
}

impl std::fmt::Debug for SqsConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsConsumer")
            .field("queue_url", &self.queue_url)
            .finish_non_exhaustive()
    }
}

impl SqsConsumer {
    /// Consumes `queue_url` with clients from `sdk` (a long-poll client for receiving,
    /// [`sqs_client`] for deleting) and the default [`ConsumerOptions`].
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(
        sdk: &aws_config::SdkConfig,
        queue_url: String,
        handler: Arc<dyn TimerHandler>,
    ) -> Self {
        let options = ConsumerOptions::default();
        Self::spawn_with(
            sqs_poll_client(sdk, options.wait),
            sqs_client(sdk),
            queue_url,
            handler,
            options,
        )
    }

    /// Consumes `queue_url`: `ReceiveMessage` on `poller` (its timeouts must outlast
    /// `options.wait`), `DeleteMessageBatch` on `client`. Each message goes to `handler`
    /// (up to [`MAX_CONCURRENT_RECORDS`] at once) and is deleted once handled; a failed
    /// receive (SQS unreachable, no such queue) is logged and retried after a backoff.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_with(
        poller: Client,
        client: Client,
        queue_url: String,
        handler: Arc<dyn TimerHandler>,
        options: ConsumerOptions,
    ) -> Self {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(
            Queue {
                poller,
                client,
                url: queue_url.clone(),
            },
            handler,
            options,
            stopped,
        ));
        Self {
            stop,
            task: Mutex::new(Some(task)),
            queue_url,
            grace: options.shutdown_grace,
        }
    }

    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }

    /// Stops the loop: a long poll in progress is abandoned (what it would have received
    /// comes back after the visibility timeout), a batch being handled gets up to the
    /// shutdown grace to finish and delete its messages. Returns once the loop has ended
    /// and released the handler. Later calls return at once.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        let task = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(mut task) = task else { return };
        match tokio::time::timeout(self.grace, &mut task).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::error!(error = %err, "timer consumer ended abnormally"),
            Err(_) => {
                tracing::warn!("timer consumer still handling a batch at shutdown; aborted");
                task.abort();
            }
        }
    }
}

impl Drop for SqsConsumer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

struct Queue {
    poller: Client,
    client: Client,
    url: String,
}

impl Queue {
    async fn receive(&self, wait_seconds: i32) -> Result<Vec<Message>, TimerError> {
        let out = self
            .poller
            .receive_message()
            .queue_url(&self.url)
            .wait_time_seconds(wait_seconds)
            .max_number_of_messages(10)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send()
            .await
            .map_err(|err| unavailable("ReceiveMessage", &self.url, err))?;
        Ok(out.messages.unwrap_or_default())
    }

    /// Deletes the handled messages (`(index, receipt handle)`). A failed delete is only
    /// logged: the message comes back and is handled again, which handlers allow.
    async fn delete(&self, handled: Vec<(usize, String)>) {
        if handled.is_empty() {
            return;
        }
        let entries: Vec<_> = handled
            .into_iter()
            .filter_map(|(index, receipt)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(index.to_string())
                    .receipt_handle(receipt)
                    .build()
                    .ok()
            })
            .collect();
        match self
            .client
            .delete_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries))
            .send()
            .await
        {
            Ok(out) => {
                for failed in out.failed() {
                    tracing::warn!(
                        entry = failed.id(),
                        code = failed.code(),
                        "timer handled but not deleted; SQS redelivers it"
                    );
                }
            }
            Err(err) => {
                let err = unavailable("DeleteMessageBatch", &self.url, err);
                tracing::warn!(error = %err, "timers handled but not deleted; SQS redelivers them");
            }
        }
    }
}

async fn run(
    queue: Queue,
    handler: Arc<dyn TimerHandler>,
    options: ConsumerOptions,
    mut stopped: watch::Receiver<bool>,
) {
    let wait_seconds = options.wait_seconds();
    let mut failures = 0u32;
    tracing::info!(queue = queue.url, "timer consumer started");
    loop {
        if *stopped.borrow() {
            break;
        }
        let started = Instant::now();
        let received = tokio::select! {
            biased;
            // Also when the consumer is gone (the sender dropped).
            _ = stopped.wait_for(|stop| *stop) => break,
            received = queue.receive(wait_seconds) => received,
        };
        let pause = match received {
            Err(err) => {
                failures = failures.saturating_add(1);
                let pause = options.backoff(failures);
                tracing::warn!(
                    error = %err,
                    failures,
                    retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
                    "cannot receive from the timer queue; receiving again after a pause"
                );
                Some(pause)
            }
            Ok(messages) if messages.is_empty() => {
                failures = 0;
                // A long poll answers empty only after its wait; one that answers at once
                // (an endpoint that ignores WaitTimeSeconds) must not spin.
                let floor = options.first_backoff.min(options.wait);
                (started.elapsed() < floor).then_some(floor)
            }
            Ok(messages) => {
                failures = 0;
                handle_batch(&queue, handler.as_ref(), messages).await;
                None
            }
        };
        if let Some(pause) = pause {
            tokio::select! {
                biased;
                _ = stopped.wait_for(|stop| *stop) => break,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
    tracing::info!(queue = queue.url, "timer consumer stopped");
}

/// Handles the messages of one receive and deletes those that were handled.
async fn handle_batch(queue: &Queue, handler: &dyn TimerHandler, messages: Vec<Message>) {
    let handled: Vec<(usize, String)> = futures::stream::iter(messages.into_iter().enumerate())
        .map(|(index, message)| async move {
            let message_id = message.message_id().unwrap_or_default();
            let receive_count = message
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                .map(String::as_str)
                .unwrap_or("");
            let body = message.body().unwrap_or("");
            handle_record(handler, message_id, receive_count, body)
                .await
                .ok()?;
            match message.receipt_handle() {
                Some(receipt) => Some((index, receipt.to_owned())),
                None => {
                    tracing::warn!(message_id, "timer handled but has no receipt handle");
                    None
                }
            }
        })
        .buffered(MAX_CONCURRENT_RECORDS)
        .filter_map(|handled| async move { handled })
        .collect()
        .await;
    queue.delete(handled).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpListener;

    /// Answers `AmazonSQS.*` JSON calls: `ReceiveMessage` hands out the queued messages
    /// (then answers empty at once), `DeleteMessageBatch` records the receipt handles.
    #[derive(Default)]
    struct FakeSqs {
        queued: Mutex<Vec<serde_json::Value>>,
        deleted: Mutex<Vec<String>>,
        receives: AtomicUsize,
    }

    impl FakeSqs {
        fn answer(&self, target: &str, body: &serde_json::Value) -> serde_json::Value {
            match target {
                "AmazonSQS.ReceiveMessage" => {
                    self.receives.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(body["MaxNumberOfMessages"], 10, "{body}");
                    let messages: Vec<_> = std::mem::take(&mut *self.queued.lock().unwrap());
                    serde_json::json!({ "Messages": messages })
                }
                "AmazonSQS.DeleteMessageBatch" => {
                    let entries = body["Entries"].as_array().unwrap();
                    let mut deleted = self.deleted.lock().unwrap();
                    let mut ok = Vec::new();
                    for e in entries {
                        deleted.push(e["ReceiptHandle"].as_str().unwrap().to_owned());
                        ok.push(serde_json::json!({ "Id": e["Id"] }));
                    }
                    serde_json::json!({ "Successful": ok, "Failed": [] })
                }
                other => panic!("unexpected call {other}"),
            }
        }
    }

    /// A loopback HTTP/1.1 server speaking just enough for the SDK's JSON protocol.
    async fn serve(fake: Arc<FakeSqs>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let fake = Arc::clone(&fake);
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut read = BufReader::new(read);
                    loop {
                        let mut headers = HashMap::new();
                        let mut line = String::new();
                        loop {
                            line.clear();
                            if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                                return;
                            }
                            let trimmed = line.trim_end();
                            if trimmed.is_empty() {
                                break;
                            }
                            if let Some((k, v)) = trimmed.split_once(':') {
                                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
                            }
                        }
                        let len: usize = headers
                            .get("content-length")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        let mut body = vec![0; len];
                        read.read_exact(&mut body).await.unwrap();
                        let body: serde_json::Value =
                            serde_json::from_slice(&body).unwrap_or_default();
                        let target = headers.get("x-amz-target").cloned().unwrap_or_default();
                        let answer = fake.answer(&target, &body).to_string();
                        let response = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.0\r\n\
                             content-length: {}\r\n\r\n{answer}",
                            answer.len()
                        );
                        if write.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        endpoint
    }

    fn client(endpoint: &str) -> Client {
        let conf = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_sqs::config::Credentials::new(
                "test", "test", None, None, "test",
            ))
            .retry_config(aws_sdk_sqs::config::retry::RetryConfig::disabled())
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .operation_timeout(Duration::from_secs(5))
                    .build(),
            )
            .endpoint_url(endpoint)
            .build();
        Client::from_conf(conf)
    }

    fn options() -> ConsumerOptions {
        ConsumerOptions {
            wait: Duration::from_secs(1),
            first_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_millis(400),
            shutdown_grace: Duration::from_secs(5),
        }
    }

    /// Records what it handles; fails the messages of one `request_id`.
    #[derive(Default)]
    struct Handler {
        seen: Mutex<Vec<TimerMessage>>,
        fail_request: Option<&'static str>,
    }

    #[async_trait::async_trait]
    impl TimerHandler for Handler {
        async fn handle(&self, message: TimerMessage) -> Result<(), TimerError> {
            self.seen.lock().unwrap().push(message.clone());
            if self.fail_request == Some(message.request_id()) {
                return Err(TimerError::Unavailable("store is down".into()));
            }
            Ok(())
        }
    }

    fn sqs_message(id: &str, body: &str) -> serde_json::Value {
        serde_json::json!({
            "MessageId": id,
            "ReceiptHandle": format!("receipt-{id}"),
            "Body": body,
            "Attributes": {"ApproximateReceiveCount": "1"},
        })
    }

    fn beat(request_id: &str) -> String {
        serde_json::to_string(&TimerMessage::ApprovalHeartbeat {
            run_id: "run-consumer".into(),
            request_id: request_id.into(),
            beat: 1,
        })
        .unwrap()
    }

    #[tokio::test]
    async fn only_handled_messages_are_deleted() {
        // GIVEN a queue with a good message, a malformed one and one whose handling fails
        let fake = Arc::new(FakeSqs::default());
        fake.queued.lock().unwrap().extend([
            sqs_message("m-ok", &beat("ok")),
            sqs_message("m-bad", "{\"kind\":\"approval_expiry\""),
            sqs_message("m-fail", &beat("fails")),
        ]);
        let endpoint = serve(Arc::clone(&fake)).await;
        let handler = Arc::new(Handler {
            fail_request: Some("fails"),
            ..Handler::default()
        });

        // WHEN a consumer runs until it has received twice
        let consumer = SqsConsumer::spawn_with(
            client(&endpoint),
            client(&endpoint),
            format!("{endpoint}/000000000000/timers"),
            Arc::clone(&handler) as Arc<dyn TimerHandler>,
            options(),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while fake.receives.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        consumer.shutdown().await;

        // THEN both parsed messages reached the handler, and only the handled one is deleted
        let mut seen: Vec<_> = handler
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|m| m.request_id().to_owned())
            .collect();
        seen.sort();
        assert_eq!(seen, ["fails", "ok"]);
        assert_eq!(*fake.deleted.lock().unwrap(), ["receipt-m-ok"]);
        // AND the consumer let go of the handler
        assert_eq!(Arc::strong_count(&handler), 1);
    }

    #[tokio::test]
    async fn an_endpoint_answering_empty_at_once_is_not_polled_in_a_busy_loop() {
        let fake = Arc::new(FakeSqs::default());
        let endpoint = serve(Arc::clone(&fake)).await;
        let consumer = SqsConsumer::spawn_with(
            client(&endpoint),
            client(&endpoint),
            format!("{endpoint}/000000000000/timers"),
            Arc::new(Handler::default()),
            options(),
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        consumer.shutdown().await;
        let receives = fake.receives.load(Ordering::SeqCst);
        // one receive per 200 ms floor at most
        assert!((1..=7).contains(&receives), "{receives} receives in 1 s");
    }

    #[tokio::test]
    async fn an_unreachable_queue_is_retried_with_backoff_and_the_loop_still_stops() {
        // GIVEN an endpoint that accepts connections and closes them at once
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        let handler = Arc::new(Handler::default());
        let consumer = SqsConsumer::spawn_with(
            client(&endpoint),
            client(&endpoint),
            format!("{endpoint}/000000000000/timers"),
            Arc::clone(&handler) as Arc<dyn TimerHandler>,
            options(),
        );

        // WHEN it runs for 1.5 s THEN it tried a few times, pausing 200, 400, 400 ms...
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let started = Instant::now();
        consumer.shutdown().await;
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "a stop ends the pause at once"
        );
        let attempts = accepted.load(Ordering::SeqCst);
        assert!((2..=8).contains(&attempts), "{attempts} attempts in 1.5 s");
        assert!(handler.seen.lock().unwrap().is_empty());
        assert_eq!(Arc::strong_count(&handler), 1);
    }

    #[tokio::test]
    async fn dropping_the_consumer_stops_a_long_poll() {
        // GIVEN an endpoint that never answers
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let handler = Arc::new(Handler::default());
        let consumer = SqsConsumer::spawn_with(
            client(&endpoint),
            client(&endpoint),
            format!("{endpoint}/000000000000/timers"),
            Arc::clone(&handler) as Arc<dyn TimerHandler>,
            options(),
        );
        tokio::time::sleep(Duration::from_millis(300)).await;

        // WHEN it is dropped mid-poll THEN the loop ends and releases the handler
        drop(consumer);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Arc::strong_count(&handler) > 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(Arc::strong_count(&handler), 1);
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_and_the_wait_stays_within_sqs_limits() {
        let options = ConsumerOptions::default();
        let secs: Vec<u64> = (1..=7).map(|n| options.backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(options.backoff(u32::MAX), Duration::from_secs(30));
        assert_eq!(options.wait_seconds(), 20);
        let long = ConsumerOptions {
            wait: Duration::from_secs(60),
            ..options
        };
        assert_eq!(long.wait_seconds(), 20);
    }
}
