//! The operator console's settings.

use serde::{Deserialize, Serialize};

/// `GET /api/console/config`: who the operator token is and what it may grant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ConsoleConfig {
    /// The token's subject (the console offers scopes beyond `once` only on runs whose
    /// `owner` it is).
    pub sub: String,
    /// The token's project, if it is bound to one.
    pub project_id: Option<String>,
    /// The tools an `always` scope may be granted for.
    pub always_eligible: Vec<String>,
}
