//! The Slack sink of the notifier (docs/architecture.md §11): an armed card on a run
//! with a `channel_id` is posted there (`chat.postMessage`), its memo `channel|ts`; the
//! card's resolution rewrites that message (`chat.update`) — approved or denied by whom,
//! or expired — without buttons.

use crate::notify::{CardNotice, DeliveryError, NoticeKind, Sink};

use super::client::{Posted, SlackError};
use super::{blocks, SlackClient};

/// Delivers card notices to Slack.
pub struct SlackSink {
    client: SlackClient,
}

impl SlackSink {
    /// A sink posting with `client` (the bot token only: the signing secret and the user
    /// mapping belong to the interactivity endpoint).
    pub fn new(client: SlackClient) -> Self {
        Self { client }
    }
}

impl From<SlackError> for DeliveryError {
    fn from(e: SlackError) -> Self {
        match e {
            SlackError::Retry {
                why,
                after: Some(after),
            } => DeliveryError::RetryAfter(why, after),
            SlackError::Retry { why, after: None } => DeliveryError::Retry(why),
            SlackError::RateLimited { why, after } => {
                DeliveryError::Throttled(why, after.unwrap_or(crate::notify::THROTTLE_PAUSE))
            }
            SlackError::Permanent(why) => DeliveryError::Permanent(why),
        }
    }
}

/// The memo of a posted message: `channel|ts`.
fn memo(posted: &Posted) -> String {
    format!("{}|{}", posted.channel, posted.ts)
}

fn posted(memo: &str) -> Option<Posted> {
    let (channel, ts) = memo.split_once('|')?;
    (!channel.is_empty() && !ts.is_empty()).then(|| Posted {
        channel: channel.to_owned(),
        ts: ts.to_owned(),
    })
}

/// The project a card's buttons name (none for a run of no project: the notifier names
/// it `-`).
fn project(notice: &CardNotice) -> Option<&str> {
    Some(notice.project.as_str()).filter(|p| !p.is_empty() && *p != crate::notify::NO_PROJECT)
}

#[async_trait::async_trait]
impl Sink for SlackSink {
    fn name(&self) -> &'static str {
        "slack"
    }

    fn wants(&self, notice: &CardNotice) -> bool {
        notice
            .channel_id
            .as_deref()
            .is_some_and(|c| !c.trim().is_empty())
    }

    async fn deliver(
        &self,
        notice: &CardNotice,
        memo_in: Option<&str>,
    ) -> Result<Option<String>, DeliveryError> {
        let Some(channel) = notice.channel_id.as_deref() else {
            return Ok(None);
        };
        let client = &self.client;
        match notice.kind {
            NoticeKind::Armed => {
                // A card already resolved (or past its deadline) by the time its notice
                // is delivered is posted as it stands, without buttons.
                let (text, blocks) = if notice.open {
                    blocks::pending(&notice.card, project(notice), notice.owner.as_deref())
                } else {
                    blocks::resolved(&notice.card, project(notice))
                };
                let posted = client.post_message(channel, &text, &blocks).await?;
                Ok(Some(memo(&posted)))
            }
            NoticeKind::Resolved => {
                let (text, blocks) = blocks::resolved(&notice.card, project(notice));
                match memo_in.and_then(posted) {
                    Some(at) => {
                        client.update(&at, &text, &blocks).await?;
                        Ok(None)
                    }
                    // No message to update (the armed notice was never posted, e.g. dead
                    // lettered): the resolution is posted as a message of its own.
                    None => {
                        let posted = client.post_message(channel, &text, &blocks).await?;
                        Ok(Some(memo(&posted)))
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memos_round_trip() {
        let p = Posted {
            channel: "C1".into(),
            ts: "1700000000.000100".into(),
        };
        assert_eq!(posted(&memo(&p)), Some(p));
        assert_eq!(posted("C1"), None);
        assert_eq!(posted("|1"), None);
    }
}
