//! Which Slack channels a project's cards may be posted to (docs/architecture.md §11):
//! `TOLLGATE_SLACK_CHANNELS`, comma-separated `CHANNEL_ID@project` entries, `@-` for
//! the runs without a project, e.g. `C0PAY@payments,C0SEARCH@search,C0LAB@-`. With it
//! set, a run naming a `channel_id` that is not one of its project's is refused at
//! creation (400) — so one tenant's agent cannot post its cards (and their buttons)
//! into another team's channel. Unset: any channel (one team's deployment).

use std::collections::{HashMap, HashSet};

use crate::ConfigError;

/// The variable holding the channels.
pub const CHANNELS_VAR: &str = "TOLLGATE_SLACK_CHANNELS";

/// What stands for "no project" in an entry.
const NO_PROJECT: &str = "-";

/// Project (`None`: the runs without one) → its channels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlackChannels(HashMap<Option<String>, HashSet<String>>);

fn channel_id(id: &str) -> bool {
    (2..=32).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
}

impl SlackChannels {
    /// Parses `spec` (the grammar above); `None` when it is empty.
    pub fn parse(spec: &str) -> Result<Option<Self>, ConfigError> {
        let bad = |why: String| ConfigError::Invalid(format!("{CHANNELS_VAR}: {why}"));
        let mut map: HashMap<Option<String>, HashSet<String>> = HashMap::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (channel, project) = entry
                .split_once('@')
                .ok_or_else(|| bad(format!("{entry:?} is not CHANNEL_ID@project (or @-)")))?;
            if !channel_id(channel) {
                return Err(bad(format!("{channel:?} is not a Slack channel id")));
            }
            let project = match project {
                NO_PROJECT => None,
                p if !p.is_empty()
                    && p.chars().count() <= 128
                    && !p
                        .chars()
                        .any(|c| c.is_whitespace() || c.is_control() || c == ',') =>
                {
                    Some(p.to_owned())
                }
                p => return Err(bad(format!("{p:?} is not a project id"))),
            };
            map.entry(project).or_default().insert(channel.to_owned());
        }
        Ok((!map.is_empty()).then_some(Self(map)))
    }

    /// From `TOLLGATE_SLACK_CHANNELS`; `None` when unset or empty.
    pub fn from_env() -> Result<Option<Self>, ConfigError> {
        Self::parse(&std::env::var(CHANNELS_VAR).unwrap_or_default())
    }

    /// Whether a run of `project` may name `channel`.
    pub fn allows(&self, project: Option<&str>, channel: &str) -> bool {
        self.0
            .get(&project.map(str::to_owned))
            .is_some_and(|set| set.contains(channel))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_are_bounded_per_project() {
        let c = SlackChannels::parse("C0PAY@payments, C0PAY2@payments,C0LAB@-")
            .unwrap()
            .unwrap();
        assert!(c.allows(Some("payments"), "C0PAY"));
        assert!(c.allows(Some("payments"), "C0PAY2"));
        assert!(!c.allows(Some("search"), "C0PAY"));
        assert!(!c.allows(None, "C0PAY"));
        assert!(c.allows(None, "C0LAB"));
        assert!(!c.allows(Some("payments"), "C0LAB"));
        assert_eq!(SlackChannels::parse(" ").unwrap(), None);
        for bad in ["C0PAY", "c0pay@p", "C0PAY@", "C0PAY@a b"] {
            assert!(SlackChannels::parse(bad).is_err(), "{bad}");
        }
    }
}
