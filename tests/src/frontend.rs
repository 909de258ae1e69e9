//! A frontend's card board kept by seed 003's lifecycle rules, fed a replayed stream as
//! a console would be: `tool.approval_required` (or, on a coordinator's stream,
//! `coordinator.child_approval_required`) shows a card with live buttons; the matching
//! `tool.approval_resolved` (`coordinator.child_approval_resolved`) disables and removes
//! it; a `tool.approval_pending` heartbeat never changes the board. Whatever a stream
//! leaves on the board once its run has ended is a card an operator could still click
//! for ever.

use std::collections::BTreeSet;

use serde_json::Value;

/// The board, and every departure from the lifecycle the stream showed.
#[derive(Debug, Default)]
pub struct CardBoard {
    /// Request ids shown with live buttons.
    pub live: BTreeSet<String>,
    /// Request ids the stream resolved (each at most once).
    pub resolved: BTreeSet<String>,
    /// What broke the rules: a resolution twice, a heartbeat after the resolution, an
    /// event after the terminal one.
    pub violations: Vec<String>,
    /// The terminal event's type, once seen.
    pub ended: Option<String>,
}

const TERMINAL: [&str; 3] = ["run_completed", "run_failed", "run_cancelled"];

impl CardBoard {
    /// The board after `events` (one run's stream, in sequence).
    pub fn replay(events: &[Value]) -> Self {
        let mut board = Self::default();
        for event in events {
            board.apply(event);
        }
        board
    }

    pub fn apply(&mut self, event: &Value) {
        let kind = event["type"].as_str().unwrap_or_default();
        let request = event["requestId"].as_str().map(str::to_owned);
        if let Some(ended) = &self.ended {
            self.violations
                .push(format!("{kind} after the terminal {ended}"));
        }
        match (kind, request) {
            ("tool.approval_required" | "coordinator.child_approval_required", Some(id)) => {
                if self.resolved.contains(&id) {
                    self.violations
                        .push(format!("{id} shown after its resolution"));
                } else {
                    self.live.insert(id);
                }
            }
            ("tool.approval_pending", Some(id)) if self.resolved.contains(&id) => {
                self.violations
                    .push(format!("heartbeat for {id} after its resolution"));
            }
            ("tool.approval_resolved" | "coordinator.child_approval_resolved", Some(id)) => {
                self.live.remove(&id);
                if !self.resolved.insert(id.clone()) {
                    self.violations.push(format!("{id} resolved twice"));
                }
            }
            (k, _) if TERMINAL.contains(&k) => self.ended = Some(k.to_owned()),
            _ => {}
        }
    }
}
