//! The rule language: which tool calls a rule covers and what it decides.
//!
//! A rule names a tool by a glob (`*` any run of characters, `?` one) and may add
//! conditions on the call's arguments, each a JSON pointer (RFC 6901) with one test:
//! `equals` (the value there is exactly this JSON value), `prefix` (a string starting
//! with this) or `regex` (a string the whole of which matches). Every condition must
//! hold. Rules are tried in order and the first that covers a call decides it: `allow`,
//! `deny` (with a message for the agent) or `ask` (a human decides). A call no rule
//! covers is the caller's default.
//!
//! One language for every place that decides calls by rule (the MCP gateway's policy
//! file today), so a rule reads the same wherever it is written.

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

/// What a rule decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The call goes ahead without a human.
    Allow,
    /// The call is refused without a human.
    Deny,
    /// A human decides.
    Ask,
}

impl Outcome {
    /// The outcome's name as rules spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allow => "allow",
            Outcome::Deny => "deny",
            Outcome::Ask => "ask",
        }
    }
}

/// A rule as written (TOML, JSON): compile it with [`Rules::compile`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// A name shown where the rule decided (defaults to `rule N`, N from 1).
    #[serde(default)]
    pub name: Option<String>,
    /// The tool-name glob.
    pub tool: String,
    /// Conditions on the arguments, all of which must hold.
    #[serde(default)]
    pub when: Vec<ConditionSpec>,
    /// What the rule decides.
    pub decision: Outcome,
    /// For `deny`: what the agent is told.
    #[serde(default)]
    pub message: Option<String>,
}

/// One condition as written: a pointer and exactly one test.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConditionSpec {
    /// A JSON pointer into the arguments (`/path`, `/files/0`; `""` is the whole).
    pub pointer: String,
    /// The value there equals this.
    #[serde(default)]
    pub equals: Option<Value>,
    /// The value there is a string starting with this.
    #[serde(default)]
    pub prefix: Option<String>,
    /// The value there is a string the whole of which matches this regular expression.
    #[serde(default)]
    pub regex: Option<String>,
}

/// A rule that cannot be compiled, with which one and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rule {index} ({name}): {why}")]
pub struct RuleError {
    /// 1-based position of the rule.
    pub index: usize,
    /// Its name.
    pub name: String,
    /// What is wrong.
    pub why: String,
}

/// The most rules one list holds, and the longest pattern or pointer.
pub const MAX_RULES: usize = 1000;
const MAX_PATTERN_CHARS: usize = 1000;

#[derive(Debug, Clone)]
enum Test {
    Equals(Value),
    Prefix(String),
    Regex(Regex),
}

#[derive(Debug, Clone)]
struct Condition {
    pointer: String,
    test: Test,
}

impl Condition {
    fn holds(&self, arguments: &Value) -> bool {
        let Some(value) = arguments.pointer(&self.pointer) else {
            return false;
        };
        match &self.test {
            Test::Equals(v) => value == v,
            Test::Prefix(p) => value.as_str().is_some_and(|s| s.starts_with(p.as_str())),
            Test::Regex(r) => value.as_str().is_some_and(|s| r.is_match(s)),
        }
    }
}

/// A compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    name: String,
    tool: String,
    when: Vec<Condition>,
    decision: Outcome,
    message: Option<String>,
}

impl Rule {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What it decides.
    pub fn decision(&self) -> Outcome {
        self.decision
    }

    /// For `deny`: what the agent is told.
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }

    /// Whether it covers a call of `tool` with `arguments`.
    pub fn covers(&self, tool: &str, arguments: &Value) -> bool {
        glob_matches(&self.tool, tool) && self.when.iter().all(|c| c.holds(arguments))
    }
}

/// An ordered list of rules: the first that covers a call decides it.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    rules: Vec<Rule>,
}

impl Rules {
    /// Compiles rules as written, refusing the whole list at the first bad one.
    pub fn compile(specs: Vec<RuleSpec>) -> Result<Self, RuleError> {
        if specs.len() > MAX_RULES {
            return Err(RuleError {
                index: MAX_RULES + 1,
                name: String::new(),
                why: format!("at most {MAX_RULES} rules"),
            });
        }
        let rules = specs
            .into_iter()
            .enumerate()
            .map(|(i, spec)| compile_rule(i + 1, spec))
            .collect::<Result<_, _>>()?;
        Ok(Self { rules })
    }

    /// The first rule covering a call of `tool` with `arguments`.
    pub fn first_match(&self, tool: &str, arguments: &Value) -> Option<&Rule> {
        self.rules.iter().find(|r| r.covers(tool, arguments))
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

fn compile_rule(index: usize, spec: RuleSpec) -> Result<Rule, RuleError> {
    let name = spec.name.clone().unwrap_or_else(|| format!("rule {index}"));
    let fail = |why: String| RuleError {
        index,
        name: name.clone(),
        why,
    };
    if spec.tool.is_empty() || spec.tool.chars().count() > MAX_PATTERN_CHARS {
        return Err(fail(format!(
            "`tool` must be a glob of 1 to {MAX_PATTERN_CHARS} characters"
        )));
    }
    if spec.message.is_some() && spec.decision != Outcome::Deny {
        return Err(fail(
            "`message` is what a `deny` tells the agent; this rule does not deny".into(),
        ));
    }
    let mut when = Vec::with_capacity(spec.when.len());
    for c in spec.when {
        if !(c.pointer.is_empty() || c.pointer.starts_with('/'))
            || c.pointer.chars().count() > MAX_PATTERN_CHARS
        {
            return Err(fail(format!(
                "pointer {:?} is not a JSON pointer (\"\" or starting with /)",
                c.pointer
            )));
        }
        let test = match (c.equals, c.prefix, c.regex) {
            (Some(v), None, None) => Test::Equals(v),
            (None, Some(p), None) => Test::Prefix(p),
            (None, None, Some(r)) => {
                if r.chars().count() > MAX_PATTERN_CHARS {
                    return Err(fail("regex too long".into()));
                }
                let anchored = format!("^(?:{r})$");
                Test::Regex(
                    regex::RegexBuilder::new(&anchored)
                        .size_limit(1 << 20)
                        .build()
                        .map_err(|e| fail(format!("regex {r:?}: {e}")))?,
                )
            }
            _ => {
                return Err(fail(format!(
                    "the condition on {:?} needs exactly one of `equals`, `prefix`, `regex`",
                    c.pointer
                )))
            }
        };
        when.push(Condition {
            pointer: c.pointer,
            test,
        });
    }
    Ok(Rule {
        name,
        tool: spec.tool,
        when,
        decision: spec.decision,
        message: spec.message,
    })
}

/// `*` matches any run of characters (none included), `?` exactly one; all else itself.
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    // The last `*` seen and where in the text it was tried from: linear backtracking.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(tool: &str, decision: Outcome, when: Vec<ConditionSpec>) -> RuleSpec {
        RuleSpec {
            name: None,
            tool: tool.into(),
            when,
            decision,
            message: None,
        }
    }

    fn cond(pointer: &str) -> ConditionSpec {
        ConditionSpec {
            pointer: pointer.into(),
            equals: None,
            prefix: None,
            regex: None,
        }
    }

    #[test]
    fn globs_match_as_shells_do() {
        assert!(glob_matches("git_*", "git_status"));
        assert!(glob_matches("*", ""));
        assert!(glob_matches("git_?dd", "git_add"));
        assert!(glob_matches("*_commit", "git_commit"));
        assert!(glob_matches("a*b*c", "aXbYbZc"));
        assert!(!glob_matches("git_*", "gh_status"));
        assert!(!glob_matches("git_?", "git_ab"));
        assert!(!glob_matches("exact", "exactly"));
        assert!(!glob_matches("", "x"));
    }

    #[test]
    fn the_first_covering_rule_decides() {
        let mut deny_main = spec(
            "git_*",
            Outcome::Deny,
            vec![ConditionSpec {
                equals: Some(json!("main")),
                ..cond("/branch")
            }],
        );
        deny_main.message = Some("not on main".into());
        let rules = Rules::compile(vec![
            deny_main,
            spec(
                "git_add",
                Outcome::Allow,
                vec![ConditionSpec {
                    prefix: Some("docs/".into()),
                    ..cond("/files/0")
                }],
            ),
            spec(
                "git_*",
                Outcome::Ask,
                vec![ConditionSpec {
                    regex: Some("[a-z]+".into()),
                    ..cond("/message")
                }],
            ),
        ])
        .unwrap();
        let m = rules
            .first_match("git_push", &json!({"branch": "main"}))
            .unwrap();
        assert_eq!((m.name(), m.decision()), ("rule 1", Outcome::Deny));
        assert_eq!(m.message(), Some("not on main"));
        let m = rules
            .first_match("git_add", &json!({"files": ["docs/a.md"]}))
            .unwrap();
        assert_eq!(m.decision(), Outcome::Allow);
        // Anchored: "fix 1" does not match the whole of [a-z]+.
        assert!(rules
            .first_match("git_commit", &json!({"message": "fix 1"}))
            .is_none());
        assert_eq!(
            rules
                .first_match("git_commit", &json!({"message": "fix"}))
                .unwrap()
                .name(),
            "rule 3"
        );
        // A prefix or regex test on a non-string, or a missing pointer, does not hold.
        assert!(rules
            .first_match("git_add", &json!({"files": [7]}))
            .is_none());
        assert!(rules.first_match("git_add", &json!({})).is_none());
    }

    #[test]
    fn bad_rules_are_refused_with_their_place() {
        let two_tests = ConditionSpec {
            equals: Some(json!(1)),
            prefix: Some("a".into()),
            ..cond("/a")
        };
        let e = Rules::compile(vec![
            spec("ok", Outcome::Allow, vec![]),
            spec("x", Outcome::Ask, vec![two_tests]),
        ])
        .unwrap_err();
        assert_eq!(e.index, 2);
        assert!(e.why.contains("exactly one"), "{e}");
        let e = Rules::compile(vec![spec("x", Outcome::Ask, vec![cond("no-slash")])]).unwrap_err();
        assert!(e.why.contains("JSON pointer"), "{e}");
        let bad_regex = ConditionSpec {
            regex: Some("(".into()),
            ..cond("/a")
        };
        assert!(Rules::compile(vec![spec("x", Outcome::Ask, vec![bad_regex])]).is_err());
        let mut allow_with_message = spec("x", Outcome::Allow, vec![]);
        allow_with_message.message = Some("hi".into());
        assert!(Rules::compile(vec![allow_with_message]).is_err());
        assert!(Rules::compile(vec![spec("", Outcome::Allow, vec![])]).is_err());
    }
}
