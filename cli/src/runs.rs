//! `tollgate runs`: one page of the project's runs (`GET /api/runs`) as a table, newest
//! first, and the command for the next page when there is one.

use chrono::{DateTime, Utc};
use tollgate_client::operator::{Operator, OperatorError, RunList, RunQuery};

use crate::remote::{refusal, Failure};
use crate::render::clean;

/// `GET /api/runs` with `query`. Prints the table.
pub async fn list(operator: &Operator, query: &RunQuery) -> Result<(), Failure> {
    let page = operator.list_runs(query).await.map_err(|e| match e {
        OperatorError::Unreachable(cause) | OperatorError::NoAnswer(cause) => {
            Failure::unavailable(format!("cannot reach the server: {cause}"))
        }
        OperatorError::Unreadable { message, .. } => {
            Failure::unavailable(format!("the answer is not JSON: {message}"))
        }
        OperatorError::Refused(r) => refusal(&r),
        other => Failure::unavailable(other.to_string()),
    })?;
    print!("{}", table(&page));
    Ok(())
}

/// Milliseconds since the epoch as `2026-01-01 00:00:00` (UTC).
fn utc(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms).map_or_else(
        || "?".to_owned(),
        |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
    )
}

/// The runs as an aligned table (or a sentence when there are none), then how to ask for
/// the next page.
fn table(page: &RunList) -> String {
    let mut out = String::new();
    if page.runs.is_empty() {
        out.push_str("no runs on this page\n");
    } else {
        let mut rows = vec![[
            "RUN".to_owned(),
            "STATUS".to_owned(),
            "OWNER".to_owned(),
            "CREATED (UTC)".to_owned(),
            "ENDED (UTC)".to_owned(),
        ]];
        for run in &page.runs {
            rows.push([
                clean(&run.run_id),
                clean(&run.status),
                run.owner
                    .as_deref()
                    .map(clean)
                    .unwrap_or_else(|| "-".into()),
                utc(run.created_at),
                run.ended_at.map(utc).unwrap_or_else(|| "-".into()),
            ]);
        }
        for line in crate::render::aligned(&rows) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    if let (true, Some(next)) = (page.has_more, &page.next_cursor) {
        out.push_str(&format!("(more: the same command with --after {next})\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_client::operator::RunSummary;

    fn run(id: &str, status: &str, owner: Option<&str>, ended: Option<i64>) -> RunSummary {
        RunSummary {
            run_id: id.into(),
            kind: "single".into(),
            status: status.into(),
            owner: owner.map(Into::into),
            project_id: None,
            channel_id: None,
            created_at: 1_767_225_600_000,
            ended_at: ended,
        }
    }

    #[test]
    fn table_aligns_and_says_how_to_page() {
        let page = RunList {
            runs: vec![
                run("run-1", "running", Some("alice"), None),
                run("run-longer-2", "completed", None, Some(1_767_225_661_000)),
            ],
            has_more: true,
            next_cursor: Some("abc".into()),
        };
        assert_eq!(
            table(&page),
            "RUN           STATUS     OWNER  CREATED (UTC)        ENDED (UTC)\n\
             run-1         running    alice  2026-01-01 00:00:00  -\n\
             run-longer-2  completed  -      2026-01-01 00:00:00  2026-01-01 00:01:01\n\
             (more: the same command with --after abc)\n"
        );
        let empty = RunList {
            runs: vec![],
            has_more: false,
            next_cursor: None,
        };
        assert_eq!(table(&empty), "no runs on this page\n");
    }
}
