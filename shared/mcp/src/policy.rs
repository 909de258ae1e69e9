//! The gateway's policy file: which calls go ahead, which are refused, and which a human
//! decides, in the rule language of `tollgate_domain::rules`.
//!
//! ```toml
//! [[rule]]
//! tool = "git_status"          # a glob over the upstream server's tool names
//! decision = "allow"
//!
//! [[rule]]
//! tool = "git_*"
//! when = [{ pointer = "/repo_path", prefix = "/srv/prod/" }]
//! decision = "deny"
//! message = "production repositories are changed through the release pipeline"
//! ```
//!
//! The first rule that covers a call decides it. A call no rule covers is `ask`, unless
//! `--trust-annotations` is on and the upstream annotates the tool `readOnlyHint: true`,
//! which then defaults to `allow` (annotations are the upstream's own word about its
//! tools, so they decide nothing unless the operator says to trust them).

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use tollgate_domain::rules::{Outcome, RuleSpec, Rules};

/// A policy file that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("policy file {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// It is not a policy in TOML.
    #[error("policy file: {0}")]
    Parse(String),
    /// A rule is wrong.
    #[error("policy file: {0}")]
    Rule(#[from] tollgate_domain::rules::RuleError),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default, rename = "rule")]
    rules: Vec<RuleSpec>,
}

/// What the policy says of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Allow, deny or ask.
    pub outcome: Outcome,
    /// The rule that decided it (`None`: nothing covered it; `annotations`: the upstream's
    /// read-only hint, trusted).
    pub rule: Option<String>,
    /// For a deny: what the agent is told.
    pub message: Option<String>,
}

/// The loaded policy (empty: every call is asked).
#[derive(Debug, Clone, Default)]
pub struct Policy {
    rules: Rules,
    trust_annotations: bool,
}

impl Policy {
    /// A policy from TOML text.
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        let file: File = toml::from_str(text).map_err(|e| PolicyError::Parse(e.to_string()))?;
        Ok(Self {
            rules: Rules::compile(file.rules)?,
            trust_annotations: false,
        })
    }

    /// A policy from a TOML file.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// Whether a tool the upstream annotates `readOnlyHint: true` defaults to `allow`.
    pub fn trust_annotations(mut self, trust: bool) -> Self {
        self.trust_annotations = trust;
        self
    }

    /// How many rules it holds.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The verdict on a call of the upstream's `tool` with `arguments`; `read_only` is the
    /// tool's `readOnlyHint` as the upstream listed it.
    pub fn decide(&self, tool: &str, arguments: &Value, read_only: Option<bool>) -> Verdict {
        if let Some(rule) = self.rules.first_match(tool, arguments) {
            return Verdict {
                outcome: rule.decision(),
                rule: Some(rule.name().to_owned()),
                message: rule.message().map(str::to_owned),
            };
        }
        if self.trust_annotations && read_only == Some(true) {
            return Verdict {
                outcome: Outcome::Allow,
                rule: Some("annotations".into()),
                message: None,
            };
        }
        Verdict {
            outcome: Outcome::Ask,
            rule: None,
            message: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FILE: &str = r#"
        [[rule]]
        tool = "git_status"
        decision = "allow"

        [[rule]]
        name = "no prod"
        tool = "git_*"
        when = [{ pointer = "/repo_path", prefix = "/srv/prod/" }]
        decision = "deny"
        message = "not here"
    "#;

    #[test]
    fn rules_decide_first_and_annotations_only_when_trusted() {
        let p = Policy::from_toml(FILE).unwrap();
        assert_eq!(p.len(), 2);
        let v = p.decide("git_status", &json!({}), None);
        assert_eq!(
            (v.outcome, v.rule.as_deref()),
            (Outcome::Allow, Some("rule 1"))
        );
        let v = p.decide("git_commit", &json!({"repo_path": "/srv/prod/web"}), None);
        assert_eq!(v.outcome, Outcome::Deny);
        assert_eq!(v.rule.as_deref(), Some("no prod"));
        assert_eq!(v.message.as_deref(), Some("not here"));
        // Not covered: asked, whatever the hint says, until annotations are trusted.
        let v = p.decide("git_log", &json!({"repo_path": "/tmp/x"}), Some(true));
        assert_eq!((v.outcome, v.rule), (Outcome::Ask, None));
        let p = p.trust_annotations(true);
        let v = p.decide("git_log", &json!({}), Some(true));
        assert_eq!(
            (v.outcome, v.rule.as_deref()),
            (Outcome::Allow, Some("annotations"))
        );
        assert_eq!(
            p.decide("git_add", &json!({}), Some(false)).outcome,
            Outcome::Ask
        );
        // A rule still wins over a trusted hint.
        let v = p.decide(
            "git_status",
            &json!({"repo_path": "/srv/prod/x"}),
            Some(true),
        );
        assert_eq!(v.rule.as_deref(), Some("rule 1"));
    }

    #[test]
    fn a_bad_file_is_refused_with_why() {
        let e = Policy::from_toml("[[rule]]\ntool = \"x\"\ndecision = \"maybe\"\n").unwrap_err();
        assert!(e.to_string().contains("maybe"), "{e}");
        let e = Policy::from_toml("[[rules]]\ntool = \"x\"\n").unwrap_err();
        assert!(e.to_string().contains("rules"), "{e}");
        let e = Policy::from_toml(
            "[[rule]]\ntool = \"x\"\ndecision = \"ask\"\nwhen = [{ pointer = \"a\", equals = 1 }]\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("JSON pointer"), "{e}");
        assert!(Policy::from_toml("").unwrap().is_empty());
    }
}
