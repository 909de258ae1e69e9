//! The Slack interactivity endpoint's shapes (`POST /api/slack/interactions`): what
//! Tollgate puts in a card message's buttons, and what it answers Slack.

use serde::{Deserialize, Serialize};

/// `action_id` of a card message's Approve button.
pub const APPROVE_ACTION: &str = "tollgate.approve";
/// `action_id` of a card message's Deny button.
pub const DENY_ACTION: &str = "tollgate.deny";
/// `action_id` of a card message's scope menu (its option values are scope names).
pub const SCOPE_ACTION: &str = "tollgate.scope";
/// Most bytes a button's `value` may hold (Slack's own bound).
pub const MAX_BUTTON_VALUE: usize = 2000;

/// What a card message's Approve and Deny buttons carry in their `value`, as compact
/// JSON: which card, and which decision. It names the card only: who decides is the
/// Slack user the (signed) interaction names, mapped to an operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ButtonValue {
    /// Format version, `1`.
    pub v: u8,
    /// The card's project (`null` for a run of no project).
    pub p: Option<String>,
    /// The run's id.
    pub r: String,
    /// The card's `request_id`.
    pub q: String,
    /// `approve` or `deny`.
    pub d: String,
}

/// What the interactivity endpoint answers a verified interaction (Slack reads only the
/// status; the user sees the updated message, or an ephemeral message when nothing was
/// decided).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"outcome": "decided", "state": "approved", "decided_by": "alice"})))]
pub struct SlackAnswer {
    /// `decided` (this click decided the card), `already` (it had been decided or had
    /// expired), `refused` (nothing decided: the user is not mapped, the card is outside
    /// the user's projects, or the gate refused the decision, e.g. a scope beyond `once`
    /// from someone who does not own the run, or the decision failed), `pending` (`serve`
    /// only: the run's pod has not answered yet; the decision goes on and the card's
    /// message shows its outcome) or `ignored` (not a decision: a scope chosen, another
    /// kind of interaction).
    pub outcome: String,
    /// The card's state after the interaction, when a card was reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Who decided the card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// What the user was told (ephemerally) when nothing was decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
