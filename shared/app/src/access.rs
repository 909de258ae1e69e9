//! Who may do what — each rule written once (docs/architecture.md §6): project scoping
//! (a caller with a project sees and acts on its project's runs only), who may read a
//! run, owner-only scopes (a grant beyond `once` is the run owner's) and the
//! always-eligible tools.

use tollgate_domain::{RunHead, Scope};

use crate::AppError;

/// Whether a caller whose token names `caller_project` (none: every project) may see
/// or act on something of `project`.
pub fn in_project(caller_project: Option<&str>, project: Option<&str>) -> bool {
    caller_project.is_none() || caller_project == project
}

/// Who reads a run, as its verified credentials say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Viewer<'a> {
    /// A run token for the run, issued for `incarnation`.
    RunToken { incarnation: &'a str },
    /// An operator token (of `project`, when it names one).
    Operator { project: Option<&'a str> },
    /// An agent token: `sub`, of `project` when it names one.
    Agent {
        sub: &'a str,
        project: Option<&'a str>,
    },
}

/// Who may read a run (`head`): its own token (of this incarnation), the creating agent
/// (its token's project, or none, must be the run's), an operator — limited to one
/// project when the token names one. A run outside the
/// viewer's reach answers as if it did not exist (404); another agent's run is 403.
pub fn may_read(viewer: &Viewer<'_>, head: &RunHead) -> Result<(), AppError> {
    let project = head.project_id.as_deref();
    match *viewer {
        Viewer::RunToken { incarnation } if incarnation == head.incarnation => Ok(()),
        Viewer::RunToken { .. } => Err(AppError::run_not_found()),
        Viewer::Operator { project: claim } if !in_project(claim, project) => {
            Err(AppError::run_not_found())
        }
        // An agent's token is of one tenant: without a project, of the runs without one
        // (not every project's, as a global operator's is).
        Viewer::Agent { project: claim, .. } if claim != project => Err(AppError::run_not_found()),
        Viewer::Operator { .. } => Ok(()),
        Viewer::Agent { sub, .. } if sub == head.created_by => Ok(()),
        Viewer::Agent { .. } => Err(AppError::Forbidden(
            "an agent token reads only the runs it created".into(),
        )),
    }
}

/// Whether an approval by `by` with `scope` may be granted on a card of `tool` whose run
/// `owner` is: beyond `once` only by the run's owner, and `always` only for the
/// `always_eligible` tools. Refused: 403, and the card stays pending.
pub fn may_grant(
    scope: Scope,
    owner: Option<&str>,
    by: &str,
    tool: &str,
    always_eligible: &[String],
) -> Result<(), AppError> {
    owners_scope(scope, owner, by)?;
    eligible_scope(scope, tool, always_eligible)
}

/// The owner half of [`may_grant`] (for a card whose tool is not known yet).
pub fn owners_scope(scope: Scope, owner: Option<&str>, by: &str) -> Result<(), AppError> {
    if scope != Scope::Once && owner != Some(by) {
        return Err(AppError::Forbidden(format!(
            "scope {} needs the run's owner; the card stays pending",
            scope.as_str()
        )));
    }
    Ok(())
}

/// The tool half of [`may_grant`]: `always` only for the always-eligible tools.
pub fn eligible_scope(
    scope: Scope,
    tool: &str,
    always_eligible: &[String],
) -> Result<(), AppError> {
    if scope == Scope::Always && !is_always_eligible(tool, always_eligible) {
        return Err(AppError::Forbidden(format!(
            "scope always is not allowed for {tool}; the card stays pending"
        )));
    }
    Ok(())
}

/// Whether `tool` may be granted `always` (`TOLLGATE_ALWAYS_ELIGIBLE_TOOLS`).
pub fn is_always_eligible(tool: &str, always_eligible: &[String]) -> bool {
    always_eligible.iter().any(|t| t == tool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_beyond_once_are_the_owners_and_always_only_for_eligible_tools() {
        let eligible = vec!["web_fetch".to_owned()];
        assert!(may_grant(Scope::Once, None, "bob", "shell", &eligible).is_ok());
        assert!(may_grant(Scope::Tool, Some("alice"), "alice", "shell", &eligible).is_ok());
        assert!(may_grant(Scope::Run, Some("alice"), "bob", "web_fetch", &eligible).is_err());
        assert!(may_grant(Scope::Tool, None, "bob", "web_fetch", &eligible).is_err());
        assert!(may_grant(
            Scope::Always,
            Some("alice"),
            "alice",
            "web_fetch",
            &eligible
        )
        .is_ok());
        assert!(matches!(
            may_grant(Scope::Always, Some("alice"), "alice", "shell", &eligible),
            Err(AppError::Forbidden(_))
        ));
    }

    #[test]
    fn a_run_is_read_by_its_token_its_creator_and_its_projects_operators() {
        let head: RunHead = serde_json::from_value(serde_json::json!({
            "run_id": "r1", "status": "running", "next_seq": 2, "kind": "single",
            "project_id": "p1", "created_by": "agent-a", "created_at": 0,
            "last_event_at": 0, "incarnation": "i1",
        }))
        .unwrap();
        let read = |v: Viewer<'_>| may_read(&v, &head);
        assert!(read(Viewer::RunToken { incarnation: "i1" }).is_ok());
        assert!(matches!(
            read(Viewer::RunToken { incarnation: "i0" }),
            Err(AppError::NotFound { .. })
        ));
        assert!(read(Viewer::Operator { project: None }).is_ok());
        assert!(read(Viewer::Operator {
            project: Some("p1")
        })
        .is_ok());
        assert!(matches!(
            read(Viewer::Operator {
                project: Some("p2")
            }),
            Err(AppError::NotFound { .. })
        ));
        let agent = |sub, project| Viewer::Agent { sub, project };
        assert!(read(agent("agent-a", Some("p1"))).is_ok());
        assert!(matches!(
            read(agent("agent-b", Some("p1"))),
            Err(AppError::Forbidden(_))
        ));
        assert!(matches!(
            read(agent("agent-a", Some("p2"))),
            Err(AppError::NotFound { .. })
        ));
        // The same `sub` without a project is another tenant's agent.
        assert!(matches!(
            read(agent("agent-a", None)),
            Err(AppError::NotFound { .. })
        ));
    }

    #[test]
    fn a_project_caller_sees_its_project_only() {
        assert!(in_project(None, Some("p1")));
        assert!(in_project(None, None));
        assert!(in_project(Some("p1"), Some("p1")));
        assert!(!in_project(Some("p1"), Some("p2")));
        assert!(!in_project(Some("p1"), None));
    }
}
