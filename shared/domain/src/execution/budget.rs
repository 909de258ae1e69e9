//! A run's budget (`{tools:{name:max_starts}, call_ceiling}`) and what the run has used
//! of it: admission of an approved call's start against both.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::Reason;
use crate::approval::MAX_TOOL_NAME;
use crate::run::RunHead;

/// Limits a run's budget may name (the head is rewritten by every append, so it stays
/// small; the same limits `POST /api/runs` enforces).
pub const MAX_BUDGET_TOOLS: usize = 64;

/// A run's `budget` (`{tools:{name:max_starts}, call_ceiling}`) as a typed value. Seed
/// 000: "hosts must still explicitly select tools using ApprovedMutationBudget … receive
/// no extra allowance merely because their calls are approved."
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Budget {
    /// Approved-execution starts allowed per tool over the run's life.
    pub tools: BTreeMap<String, u64>,
    /// Admitted approved executions allowed over the run's life, all tools together;
    /// `None`: only the per-tool allowances bound them.
    pub call_ceiling: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("budget must be {{\"tools\": {{\"<tool>\": <max starts>}}, \"call_ceiling\": <n>}} with at most 64 tools named in 1 to 128 characters")]
pub struct BudgetError;

impl Budget {
    /// Parses the JSON stored on the head, with the rules `POST /api/runs` applies.
    pub fn parse(value: &Value) -> Result<Self, BudgetError> {
        let obj = value.as_object().ok_or(BudgetError)?;
        if obj.keys().any(|k| k != "tools" && k != "call_ceiling") {
            return Err(BudgetError);
        }
        let mut tools = BTreeMap::new();
        if let Some(listed) = obj.get("tools") {
            let listed = listed.as_object().ok_or(BudgetError)?;
            if listed.len() > MAX_BUDGET_TOOLS {
                return Err(BudgetError);
            }
            for (name, max) in listed {
                if name.is_empty() || name.chars().count() > MAX_TOOL_NAME {
                    return Err(BudgetError);
                }
                tools.insert(name.clone(), max.as_u64().ok_or(BudgetError)?);
            }
        }
        let call_ceiling = match obj.get("call_ceiling") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or(BudgetError)?),
        };
        Ok(Self {
            tools,
            call_ceiling,
        })
    }

    /// The budget a run was created with. `None` when it has none — or one that no
    /// longer parses, which must admit nothing either (fail closed).
    pub fn of_run(head: &RunHead) -> Option<Self> {
        head.budget.as_ref().and_then(|v| Self::parse(v).ok())
    }

    /// Starts of `tool` still allowed (0 for a tool the budget does not list).
    pub fn starts_left(&self, usage: &BudgetUsage, tool: &str) -> u64 {
        self.tools
            .get(tool)
            .map_or(0, |max| max.saturating_sub(usage.starts_of(tool)))
    }

    /// Admitted calls still allowed by the ceiling (`None`: no ceiling).
    pub fn calls_left(&self, usage: &BudgetUsage) -> Option<u64> {
        self.call_ceiling
            .map(|ceiling| ceiling.saturating_sub(usage.calls))
    }

    /// Admits one start of `tool`: the usage to store on the head in the same
    /// transaction as the intent, or why not. Checked in the order the issue names them:
    /// listed, starts left, then the run-wide ceiling.
    pub fn admit(&self, usage: &BudgetUsage, tool: &str) -> Result<BudgetUsage, Reason> {
        if !self.tools.contains_key(tool) {
            return Err(Reason::ToolNotInBudget);
        }
        if self.starts_left(usage, tool) == 0 {
            return Err(Reason::BudgetExhausted);
        }
        if self.calls_left(usage) == Some(0) {
            return Err(Reason::CallCeilingReached);
        }
        let mut next = usage.clone();
        *next.starts.entry(tool.to_owned()).or_default() += 1;
        next.calls += 1;
        Ok(next)
    }
}

/// Admission against a run's budget, where a run without one admits nothing.
pub fn admit(
    budget: Option<&Budget>,
    usage: &BudgetUsage,
    tool: &str,
) -> Result<BudgetUsage, Reason> {
    budget.ok_or(Reason::NoBudget)?.admit(usage, tool)
}

/// What a run has used of its budget; kept on the run head (docs/architecture.md §3 "budget, calls
/// used") so that admission is conditioned on the same item as the sequence. Starts are
/// consumed at admission and never given back: a call that ended `not_executed` needs a
/// fresh approval, and that approval grants no extra allowance.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BudgetUsage {
    /// Admitted starts per tool.
    pub starts: BTreeMap<String, u64>,
    /// Admitted starts over all tools (what `call_ceiling` bounds).
    pub calls: u64,
}

impl BudgetUsage {
    pub fn starts_of(&self, tool: &str) -> u64 {
        self.starts.get(tool).copied().unwrap_or(0)
    }

    /// `{"starts": {"<tool>": n}, "calls": n}`.
    pub fn to_json(&self) -> Value {
        json!({"starts": self.starts, "calls": self.calls})
    }

    /// The stored usage; nothing stored is nothing used.
    pub fn from_json(value: Option<&Value>) -> Result<Self, serde_json::Error> {
        match value {
            None | Some(Value::Null) => Ok(Self::default()),
            Some(v) => serde_json::from_value(v.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::execution::fixtures::*;
    use crate::execution::*;
    use serde_json::Map;

    // --- budget --------------------------------------------------------------------

    #[test]
    fn budgets_parse_like_run_creation_and_fail_closed() {
        let b = Budget::parse(&json!({"tools": {"a": 2, "b": 0}, "call_ceiling": 3})).unwrap();
        assert_eq!(b.tools.get("a"), Some(&2));
        assert_eq!(b.call_ceiling, Some(3));
        assert_eq!(Budget::parse(&json!({})).unwrap(), Budget::default());
        assert_eq!(
            Budget::parse(&json!({"tools": {"a": 1}, "call_ceiling": null}))
                .unwrap()
                .call_ceiling,
            None
        );
        for bad in [
            json!([]),
            json!({"tool": {}}),
            json!({"tools": []}),
            json!({"tools": {"a": -1}}),
            json!({"tools": {"a": 1.5}}),
            json!({"tools": {"": 1}}),
            json!({"tools": {"t".repeat(129): 1}}),
            json!({"call_ceiling": "5"}),
            json!({"tools": (0..65).map(|i| (format!("t{i}"), json!(1))).collect::<Map<_, _>>()}),
        ] {
            assert_eq!(Budget::parse(&bad), Err(BudgetError), "{bad}");
        }
        assert_eq!(Budget::of_run(&head_with(None)), None);
        assert_eq!(Budget::of_run(&head_with(Some(json!({"tools": 1})))), None);
        assert_eq!(Budget::of_run(&head()).unwrap().call_ceiling, Some(5));
    }

    #[test]
    fn admission_counts_starts_per_tool_and_calls_against_the_ceiling() {
        let b = Budget::parse(&json!({"tools": {"a": 2, "b": 5}, "call_ceiling": 3})).unwrap();
        let mut usage = BudgetUsage::default();
        assert_eq!(admit(None, &usage, "a"), Err(Reason::NoBudget));
        assert_eq!(b.starts_left(&usage, "a"), 2);
        assert_eq!(b.calls_left(&usage), Some(3));
        usage = b.admit(&usage, "a").unwrap();
        usage = admit(Some(&b), &usage, "a").unwrap();
        assert_eq!(b.starts_left(&usage, "a"), 0);
        assert_eq!(b.admit(&usage, "a"), Err(Reason::BudgetExhausted));
        usage = b.admit(&usage, "b").unwrap();
        assert_eq!(usage.calls, 3);
        assert_eq!(b.calls_left(&usage), Some(0));
        assert_eq!(b.admit(&usage, "b"), Err(Reason::CallCeilingReached));
        assert_eq!(b.admit(&usage, "c"), Err(Reason::ToolNotInBudget));
        assert_eq!(b.starts_left(&usage, "c"), 0);
        // No ceiling: only the per-tool allowances bound it.
        let open = Budget::parse(&json!({"tools": {"a": 100}})).unwrap();
        assert_eq!(open.calls_left(&usage), None);
        assert!(open.admit(&usage, "a").is_ok());
        // Five of twenty admitted against a ceiling of five, whatever the order.
        let b = Budget::parse(&json!({"tools": {"w": 100}, "call_ceiling": 5})).unwrap();
        let mut usage = BudgetUsage::default();
        let admitted = (0..20).filter(|_| match b.admit(&usage, "w") {
            Ok(next) => {
                usage = next;
                true
            }
            Err(_) => false,
        });
        assert_eq!(admitted.count(), 5);
    }

    #[test]
    fn usage_round_trips_through_json() {
        let usage = BudgetUsage {
            starts: [("a".to_owned(), 2), ("b".to_owned(), 1)].into(),
            calls: 3,
        };
        let v = usage.to_json();
        assert_eq!(v, json!({"starts": {"a": 2, "b": 1}, "calls": 3}));
        assert_eq!(BudgetUsage::from_json(Some(&v)).unwrap(), usage);
        assert_eq!(
            BudgetUsage::from_json(None).unwrap(),
            BudgetUsage::default()
        );
        assert_eq!(
            BudgetUsage::from_json(Some(&Value::Null)).unwrap(),
            BudgetUsage::default()
        );
        assert!(BudgetUsage::from_json(Some(&json!({"starts": 1}))).is_err());
    }
}
