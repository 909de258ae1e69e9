//! Who a Slack user is to Tollgate (docs/architecture.md §11): `TOLLGATE_SLACK_USERS`
//! maps Slack user ids to operators and the project each acts in. Only this mapping
//! names the deciding operator — never anything a button carries.
//!
//! Grammar: comma-separated `SLACK_USER_ID=operator[@project]`, e.g.
//! `U123=alice@payments,U456=bob@*`. `@project` limits the user to that project's cards
//! (as an operator token with `project_id`); `@*` reaches every project (as an operator
//! token without one). An entry without `@` takes `TOLLGATE_SLACK_PROJECT`; with neither,
//! start-up fails — a Slack user never reaches a project nobody named for it.

use std::collections::HashMap;

use tollgate_domain::approval::valid_id;

use crate::ConfigError;

/// The variable holding the mapping.
pub const USERS_VAR: &str = "TOLLGATE_SLACK_USERS";
/// The project of entries that name none.
pub const PROJECT_VAR: &str = "TOLLGATE_SLACK_PROJECT";
/// Most characters of an operator's name.
const MAX_OPERATOR: usize = 128;

/// The operator a Slack user acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlackOperator {
    /// The operator's identity (`decided_by`, the owner a scope is checked against).
    pub name: String,
    /// The project it acts in; `None`: every project (`@*`).
    pub project: Option<String>,
}

/// Slack user id → operator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlackUsers(HashMap<String, SlackOperator>);

fn slack_user_id(id: &str) -> bool {
    (2..=32).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
}

/// An operator's name: not in another namespace Tollgate reads meaning into (a standing
/// grant's `policy:` decider, the identity provider's `oidc:` operators).
fn operator_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(tollgate_domain::approval::POLICY_DECIDER_PREFIX)
        && !name.starts_with(crate::oidc::SUBJECT_PREFIX)
        && name.chars().count() <= MAX_OPERATOR
        && !name
            .chars()
            .any(|c| c.is_control() || c == ',' || c == '@' || c == '=')
        && name.trim() == name
}

impl SlackUsers {
    /// Parses `spec` (the grammar above); `default_project` is `TOLLGATE_SLACK_PROJECT`.
    pub fn parse(spec: &str, default_project: Option<&str>) -> Result<Self, ConfigError> {
        let bad = |why: String| ConfigError::Invalid(format!("{USERS_VAR}: {why}"));
        let default_project = default_project.map(str::trim).filter(|p| !p.is_empty());
        if let Some(p) = default_project {
            if p != "*" && (!valid_id(p) || p == crate::notify::NO_PROJECT) {
                return Err(ConfigError::Invalid(format!(
                    "{PROJECT_VAR} must be a project id or *"
                )));
            }
        }
        let mut users = HashMap::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (id, who) = entry
                .split_once('=')
                .ok_or_else(|| bad(format!("{entry:?} is not SLACK_USER_ID=operator[@project]")))?;
            let id = id.trim();
            if !slack_user_id(id) {
                return Err(bad(format!(
                    "{id:?} is not a Slack user id (upper-case letters and digits, e.g. U0123ABCD)"
                )));
            }
            let (name, project) = match who.trim().split_once('@') {
                Some((name, project)) => (name, Some(project)),
                None => (who.trim(), default_project),
            };
            if !operator_name(name) {
                return Err(bad(format!(
                    "the operator of {id} must be 1 to {MAX_OPERATOR} characters, without , @ = or control characters, and not start with policy: or oidc:"
                )));
            }
            let project = match project {
                Some("*") => None,
                Some(p) if valid_id(p) && p != crate::notify::NO_PROJECT => Some(p.to_owned()),
                Some(p) => return Err(bad(format!("{p:?} (for {id}) is not a project id or *"))),
                None => {
                    return Err(bad(format!(
                        "{id}={name} names no project: write {id}={name}@<project> (or @* for every project), or set {PROJECT_VAR}"
                    )))
                }
            };
            let operator = SlackOperator {
                name: name.to_owned(),
                project,
            };
            if users.insert(id.to_owned(), operator).is_some() {
                return Err(bad(format!("{id} is mapped twice")));
            }
        }
        Ok(Self(users))
    }

    /// The operator `slack_user` acts as, if it is mapped.
    pub fn operator(&self, slack_user: &str) -> Option<&SlackOperator> {
        self.0.get(slack_user)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str, project: Option<&str>) -> SlackOperator {
        SlackOperator {
            name: name.into(),
            project: project.map(Into::into),
        }
    }

    #[test]
    fn entries_name_their_project_or_take_the_default() {
        let users =
            SlackUsers::parse(" U123=alice@payments, U456=bob@*,W789=carol ", Some("ops")).unwrap();
        assert_eq!(users.operator("U123"), Some(&op("alice", Some("payments"))));
        assert_eq!(users.operator("U456"), Some(&op("bob", None)));
        assert_eq!(users.operator("W789"), Some(&op("carol", Some("ops"))));
        assert_eq!(users.operator("U999"), None);
        assert_eq!(users.len(), 3);
        let all = SlackUsers::parse("U1=dave", Some("*")).unwrap();
        assert_eq!(all.operator("U1"), Some(&op("dave", None)));
        assert!(SlackUsers::parse("", None).unwrap().is_empty());
    }

    #[test]
    fn a_user_without_a_project_or_a_bad_entry_fails_start_up() {
        for (spec, project) in [
            ("U123=alice", None),
            ("U123", None),
            ("u123=alice@p", None),
            ("U123=@p", None),
            ("U123=al@ice@p", None),
            ("U123=alice@bad/project", None),
            ("U123=alice@p,U123=bob@p", None),
            ("U123=alice", Some("bad/project")),
        ] {
            assert!(
                SlackUsers::parse(spec, project).is_err(),
                "{spec:?} with {project:?}"
            );
        }
    }
}
