//! Timers as SQS delayed messages.
//!
//! A message becomes visible after `DelaySeconds`, at most 900 (15 minutes). A timer
//! further away is sent with the maximum delay and arrives early; the handler sees that
//! with [`TimerMessage::remaining_delay`] and schedules the same message again for the
//! rest (docs/architecture.md §6: "re-sent until due"), so timeouts past 15 minutes work.

use std::time::Duration;

use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::MessageAttributeValue;
use aws_sdk_sqs::Client;

use crate::{TimerError, TimerMessage, TimerQueue};

/// SQS's longest message delay.
pub const MAX_SQS_DELAY: Duration = Duration::from_secs(900);

/// SDK timeouts for every SQS call: a hung connection or answer becomes an error within
/// seconds instead of holding the function until its timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
const OPERATION_TIMEOUT: Duration = Duration::from_secs(3);

/// An SQS client from the shared SDK configuration, with Tollgate's timeouts.
///
/// Not for long polls (`ReceiveMessage` with a wait time past 2 s): Lambda's event source
/// mapping does the receiving in production, [`sqs_poll_client`](crate::sqs_poll_client)
/// is the client for an in-process [`SqsConsumer`](crate::SqsConsumer).
pub fn sqs_client(sdk: &aws_config::SdkConfig) -> Client {
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_attempt_timeout(ATTEMPT_TIMEOUT)
        .operation_timeout(OPERATION_TIMEOUT)
        .build();
    Client::from_conf(
        aws_sdk_sqs::config::Builder::from(sdk)
            .timeout_config(timeouts)
            .build(),
    )
}

/// `DelaySeconds` for a delay: whole seconds rounded up (never early), at most 900.
pub fn delay_seconds(delay: Duration) -> i32 {
    let clamped = delay.min(MAX_SQS_DELAY);
    let secs = clamped.as_secs() + u64::from(clamped.subsec_nanos() > 0);
    // At most 900 after the clamp.
    i32::try_from(secs).unwrap_or(900)
}

/// The [`TimerQueue`] on one SQS queue (standard; the timer handler is idempotent).
#[derive(Debug, Clone)]
pub struct SqsTimers {
    client: Client,
    queue_url: String,
}

impl SqsTimers {
    pub fn new(client: Client, queue_url: String) -> Self {
        Self { client, queue_url }
    }

    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }
}

#[async_trait::async_trait]
impl TimerQueue for SqsTimers {
    /// `SendMessage` with the JSON body, `DelaySeconds = min(ceil(delay), 900)` and the
    /// kind as the `timer_kind` attribute (visible in the console and the dead-letter queue
    /// without parsing bodies).
    async fn schedule(&self, message: &TimerMessage, delay: Duration) -> Result<(), TimerError> {
        let body = serde_json::to_string(message)
            .map_err(|err| TimerError::Unavailable(format!("SendMessage: body: {err}")))?;
        let kind = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(message.kind())
            .build()
            .map_err(|err| TimerError::Unavailable(format!("SendMessage: attribute: {err}")))?;
        let delay_seconds = delay_seconds(delay);
        self.client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .delay_seconds(delay_seconds)
            .message_attributes("timer_kind", kind)
            .send()
            .await
            .map_err(|err| unavailable("SendMessage", &self.queue_url, err))?;
        tracing::debug!(
            kind = message.kind(),
            run_id = message.run_id(),
            request_id = message.request_id(),
            delay_seconds,
            "timer scheduled"
        );
        Ok(())
    }
}

/// The URL of the queue `name`, created when missing with a dead-letter queue
/// (`<name>-dlq`) as the template deploys it; for `tollgate serve --create-tables` and
/// tests. Idempotent: an existing queue, whatever its attributes, answers its URL.
pub async fn ensure_queue(client: &Client, name: &str) -> Result<String, TimerError> {
    use aws_sdk_sqs::types::QueueAttributeName;
    // As the template deploys it: a dead-letter queue after 5 receives, and a visibility
    // timeout well past one batch's handling, so a slow batch is not handed out twice.
    let dlq_name = format!("{name}-dlq");
    let dlq_url = create_or_get(
        client,
        &dlq_name,
        &[(QueueAttributeName::MessageRetentionPeriod, "1209600".into())],
    )
    .await?;
    let dlq_arn = client
        .get_queue_attributes()
        .queue_url(&dlq_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|err| unavailable("GetQueueAttributes", &dlq_name, err))?
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .ok_or_else(|| TimerError::Unavailable("GetQueueAttributes: no QueueArn".into()))?;
    let redrive = format!(r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"5"}}"#);
    create_or_get(
        client,
        name,
        &[
            (QueueAttributeName::VisibilityTimeout, "150".into()),
            (QueueAttributeName::RedrivePolicy, redrive),
        ],
    )
    .await
}

/// Creates the queue `name` with `attributes`, or — when it exists, with whatever
/// attributes (e.g. deployed from the template) — answers its URL as it is.
async fn create_or_get(
    client: &Client,
    name: &str,
    attributes: &[(aws_sdk_sqs::types::QueueAttributeName, String)],
) -> Result<String, TimerError> {
    let mut create = client.create_queue().queue_name(name);
    for (attribute, value) in attributes {
        create = create.attributes(attribute.clone(), value);
    }
    let url = match create.send().await {
        Ok(out) => out.queue_url().map(str::to_owned),
        Err(err)
            if err
                .as_service_error()
                .is_some_and(|e| e.is_queue_name_exists()) =>
        {
            client
                .get_queue_url()
                .queue_name(name)
                .send()
                .await
                .map_err(|err| unavailable("GetQueueUrl", name, err))?
                .queue_url()
                .map(str::to_owned)
        }
        Err(err) => return Err(unavailable("CreateQueue", name, err)),
    };
    url.ok_or_else(|| TimerError::Unavailable("CreateQueue: no queue URL in the answer".into()))
}

/// An SDK error as [`TimerError::Unavailable`] naming the operation and the error code
/// (or its kind) only: service messages and connection errors can carry the queue URL
/// (and with it the account id), which must not reach clients. The whole error is logged.
pub(crate) fn unavailable<E, R>(
    operation: &'static str,
    queue: &str,
    err: SdkError<E, R>,
) -> TimerError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    tracing::warn!(
        operation,
        queue,
        error = %DisplayErrorContext(&err),
        "SQS call failed"
    );
    let why = match &err {
        SdkError::ServiceError(ctx) => ctx.err().code().unwrap_or("service error").to_owned(),
        SdkError::TimeoutError(_) => "timed out".to_owned(),
        SdkError::DispatchFailure(_) => "could not reach SQS".to_owned(),
        SdkError::ResponseError(_) => "unreadable response".to_owned(),
        SdkError::ConstructionFailure(_) => "request could not be built".to_owned(),
        _ => "error".to_owned(),
    };
    TimerError::Unavailable(format!("{operation}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_seconds_round_up_and_stop_at_fifteen_minutes() {
        let cases = [
            (Duration::ZERO, 0),
            (Duration::from_millis(1), 1),
            (Duration::from_millis(1_200), 2),
            (Duration::from_secs(20), 20),
            (Duration::from_millis(899_001), 900),
            (Duration::from_secs(900), 900),
            (Duration::from_millis(900_500), 900),
            (Duration::from_secs(2 * 3600), 900),
            (Duration::MAX, 900),
        ];
        for (delay, expected) in cases {
            assert_eq!(delay_seconds(delay), expected, "{delay:?}");
        }
    }

    #[tokio::test]
    async fn an_unreachable_queue_is_unavailable_without_its_url_in_the_error() {
        // GIVEN an endpoint where nothing listens, and a queue URL with an account id
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let endpoint = format!("http://127.0.0.1:{port}");
        let conf = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_sqs::config::Credentials::new(
                "test", "test", None, None, "test",
            ))
            .retry_config(aws_sdk_sqs::config::retry::RetryConfig::disabled())
            .endpoint_url(&endpoint)
            .build();
        let url = format!("{endpoint}/123456789012/secret-timer-queue");
        let timers = SqsTimers::new(Client::from_conf(conf), url);
        let message = TimerMessage::ApprovalHeartbeat {
            run_id: "r".into(),
            request_id: "q".into(),
            beat: 1,
        };

        // WHEN a timer is scheduled THEN the error says what failed, not where
        let err = timers
            .schedule(&message, Duration::from_secs(1))
            .await
            .unwrap_err();
        let TimerError::Unavailable(detail) = &err;
        assert!(detail.starts_with("SendMessage: "), "{detail}");
        let text = err.to_string();
        for secret in ["123456789012", "secret-timer-queue", &port.to_string()] {
            assert!(!text.contains(secret), "{text} leaks {secret}");
        }
    }
}
