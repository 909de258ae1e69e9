//! Announcing a held card through its run: `tool.approval_required`, heartbeats while it
//! is pending, `tool.approval_resolved` `{expired: true}` when it expires in the pod.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;
use tollgate_protocol::runs::Appended;

use crate::Run;

use super::*;

/// Puts one card on its run's stream and keeps it there: `tool.approval_required`, then a
/// heartbeat every `every` while it is pending, then `tool.approval_resolved`
/// `{expired: true}` if it expires in the pod. Stops when the card ends, the gate is
/// dropped, or Tollgate refuses the announcement (the card is still held and decidable).
pub(super) async fn announce(
    gate: std::sync::Weak<Inner>,
    run: Run,
    arm: PodArm,
    ended: Arc<tokio::sync::Notify>,
    every: Duration,
) {
    let display: String = arm.request_id.chars().take(8).collect();
    let mut required = json!({
        "type": "tool.approval_required",
        "requestId": arm.request_id,
        "displayId": display,
        "toolName": arm.tool_name,
        "timeoutSeconds": arm.timeout.as_secs().max(1),
    });
    for (k, v) in [
        ("url", &arm.url),
        ("intention", &arm.intention),
        ("message", &arm.message),
        ("toolCallId", &arm.tool_call_id),
        ("approvalId", &arm.approval_id),
    ] {
        if let Some(v) = v {
            required[k] = v.clone().into();
        }
    }
    // Tollgate refusing the card (its id taken by another call or an ended card, the run
    // ended, a malformed field) means no operator can ever see it: it expires here at
    // once rather than leave the call waiting for nobody (fail closed). An outage or a
    // full project (429) the client's retries did not outlast leaves it waiting:
    // decisions on it are still forwarded (as for a card Tollgate never saw).
    let refused = match post_card_event(&run, required).await {
        Ok(answer) => answer.state.is_some_and(|s| s != "pending"),
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, request_id = %arm.request_id, "pod card not announced: Tollgate unavailable");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, request_id = %arm.request_id, "pod card refused by Tollgate; it expires");
            true
        }
    };
    if refused {
        if let Some(inner) = gate.upgrade() {
            if let Some(card) = inner.lock().cards.get_mut(&arm.request_id) {
                if card.state.is_none() {
                    card.end(PodDecision::Expired);
                }
            }
        }
        return;
    }
    let beat = json!({
        "type": "tool.approval_pending",
        "requestId": arm.request_id,
        "displayId": display,
        "toolName": arm.tool_name,
    });
    loop {
        let deadline = {
            let Some(inner) = gate.upgrade() else { return };
            let mut cards = inner.lock();
            let Some(card) = cards.cards.get_mut(&arm.request_id) else {
                return;
            };
            card.expire_if_due(Instant::now());
            match card.state {
                None => card.expires_at,
                Some(PodDecision::Expired) => break,
                // Decided through Tollgate, which recorded it.
                Some(_) => return,
            }
        };
        let next = (Instant::now() + every).min(deadline);
        tokio::select! {
            _ = ended.notified() => continue,
            _ = tokio::time::sleep_until(next) => {}
        }
        if next < deadline {
            let pending = gate.upgrade().is_some_and(|inner| {
                inner
                    .lock()
                    .cards
                    .get(&arm.request_id)
                    .is_some_and(|c| c.state.is_none())
            });
            if pending {
                if let Err(e) = post_card_event(&run, beat.clone()).await {
                    tracing::warn!(error = %e, request_id = %arm.request_id, "pod card heartbeat not appended");
                }
            }
        }
    }
    let expired = json!({
        "type": "tool.approval_resolved",
        "requestId": arm.request_id,
        "displayId": display,
        "toolName": arm.tool_name,
        "approved": false,
        "expired": true,
    });
    // Retried (the client already retries each request): Tollgate's backstop expires the
    // card should every attempt fail.
    for attempt in 0..3u32 {
        match post_card_event(&run, expired.clone()).await {
            Ok(_) => return,
            Err(e) if attempt == 2 => {
                tracing::warn!(error = %e, request_id = %arm.request_id, "pod card expiry not appended; Tollgate's backstop expires it");
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(1 << attempt)).await,
        }
    }
}

/// Appends one pod card event (alone, as Tollgate takes them).
async fn post_card_event(run: &Run, event: Value) -> Result<Appended, crate::Error> {
    run.call(
        reqwest::Method::POST,
        &["events"],
        Some(&json!({ "events": [event] })),
    )
    .await?
    .parse(&[200])
}
