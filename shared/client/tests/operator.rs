//! The operator side against the real server in-process (embedded store, loopback), and
//! against a server that streams a line without end.

mod common;

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::IntoResponse;
use serde_json::json;
use tollgate_client::operator::{
    FollowItem, Interruption, Operator, OperatorConfig, OperatorError, RunQuery, Verb,
};
use tollgate_client::{RetryPolicy, Scope};

use common::{bounded, server};

fn operator(base: &str, token: &str) -> Operator {
    let config = OperatorConfig {
        retry: RetryPolicy::none(),
        answer_timeout: Duration::from_secs(5),
        ..OperatorConfig::default()
    };
    Operator::with_config(base, token, config).unwrap()
}

/// GIVEN five runs of a project (one ended, owners alternating) and one of another
/// WHEN an operator of the project lists them two at a time, then by status, owner and
/// run-id prefix THEN every run of the project once, newest first, none of the other's,
/// and each filter narrows to its runs; another project is refused.
#[tokio::test(flavor = "multi_thread")]
async fn lists_one_projects_runs_with_filters_and_a_cursor() {
    bounded(async {
        let srv = server().await;
        let agent = |project: &str| {
            srv.auth.mint_jwt(
                "agent",
                tollgate_api::Role::Agent,
                600,
                Some(project.to_owned()),
            )
        };
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let mut ours = Vec::new();
        for i in 0..5 {
            let (status, v) = srv
                .post(
                    "/api/runs",
                    &agent("acme"),
                    &json!({"run_id": format!("r-{tag}-{i}"), "project_id": "acme",
                            "owner": if i % 2 == 0 { "alice" } else { "bob" }}),
                )
                .await;
            assert_eq!(status.as_u16(), 201, "{v}");
            ours.push((
                v["run_id"].as_str().unwrap().to_owned(),
                v["run_token"].as_str().unwrap().to_owned(),
            ));
        }
        let (status, v) = srv
            .post(
                "/api/runs",
                &agent("other"),
                &json!({"run_id": format!("r-{tag}-other"), "project_id": "other"}),
            )
            .await;
        assert_eq!(status.as_u16(), 201, "{v}");
        let (status, v) = srv
            .post(
                &format!("/api/runs/{}/complete", ours[2].0),
                &ours[2].1,
                &json!({}),
            )
            .await;
        assert_eq!(status.as_u16(), 200, "{v}");
        let ops = srv.auth.mint_jwt(
            "olivia",
            tollgate_api::Role::Operator,
            600,
            Some("acme".to_owned()),
        );
        let op = operator(&srv.base, &ops);

        let mut listed = Vec::new();
        let mut query = RunQuery {
            limit: Some(2),
            ..RunQuery::default()
        };
        loop {
            let page = op.list_runs(&query).await.unwrap();
            assert!(page.runs.len() <= 2);
            assert!(page
                .runs
                .iter()
                .all(|r| r.project_id.as_deref() == Some("acme")));
            listed.extend(page.runs);
            match (page.has_more, page.next_cursor) {
                (true, Some(next)) => query.after = Some(next),
                _ => break,
            }
        }
        let mut ids: Vec<_> = listed.iter().map(|r| r.run_id.clone()).collect();
        assert!(
            listed
                .windows(2)
                .all(|w| w[0].created_at >= w[1].created_at),
            "newest first"
        );
        ids.sort();
        let mut expected: Vec<_> = ours.iter().map(|(id, _)| id.clone()).collect();
        expected.sort();
        assert_eq!(ids, expected);

        let completed = op
            .list_runs(&RunQuery {
                status: Some("completed".into()),
                ..RunQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(completed.runs.len(), 1);
        assert_eq!(completed.runs[0].run_id, ours[2].0);
        assert!(completed.runs[0].ended_at.is_some());
        let alice = op
            .list_runs(&RunQuery {
                owner: Some("alice".into()),
                ..RunQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(alice.runs.len(), 3);
        let one = op
            .list_runs(&RunQuery {
                run_id_prefix: Some(ours[4].0.clone()),
                ..RunQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(one.runs.len(), 1);
        match op
            .list_runs(&RunQuery {
                project_id: Some("other".into()),
                ..RunQuery::default()
            })
            .await
        {
            Err(OperatorError::Refused(refusal)) => assert_eq!(refusal.status, 403),
            other => panic!("another project: {other:?}"),
        }
    })
    .await;
}

/// GIVEN a run with two armed cards WHEN the operator lists, approves one, denies the
/// other and follows the run until it ends THEN the cards are listed, the answers say
/// who decided, a second click reads the card's real state, and every event arrives
/// once, in order, then `done`.
#[tokio::test(flavor = "multi_thread")]
async fn lists_decides_and_follows() {
    bounded(async {
        let srv = server().await;
        let op = operator(&srv.base, &srv.operator_token);
        let me = op
            .me()
            .expect("an operator JWT names its subject")
            .to_owned();
        let (run_id, token) = srv.create_run(json!({"owner": me})).await;
        for (request_id, tool) in [("card-a", "web_fetch"), ("card-b", "shell")] {
            let (status, v) = srv
                .post(
                    &format!("/api/runs/{run_id}/approval-requests"),
                    &token,
                    &json!({"request_id": request_id, "tool_name": tool,
                            "url": "https://example.com/docs"}),
                )
                .await;
            assert_eq!(status.as_u16(), 201, "{v}");
        }

        let page = op.pending(None, None).await.unwrap();
        assert!(!page.has_more);
        let mut listed: Vec<_> = page
            .cards
            .iter()
            .map(|c| (c.request_id.clone(), c.tool_name.clone()))
            .collect();
        listed.sort();
        assert_eq!(
            listed,
            [
                ("card-a".to_owned(), "web_fetch".to_owned()),
                ("card-b".to_owned(), "shell".to_owned())
            ]
        );
        assert_eq!(
            op.pending(Some(&run_id), None).await.unwrap().cards.len(),
            2
        );

        let approved = op
            .approve(&run_id, "card-a", Scope::Once, Some("web_fetch"))
            .await
            .unwrap();
        assert_eq!(approved.state, "approved");
        assert_eq!(approved.decided_by.as_deref(), Some(me.as_str()));
        let denied = op.deny(&run_id, "card-b", None).await.unwrap();
        assert_eq!(denied.state, "denied");
        // A later click answers with the card's real state.
        let again = op
            .decide(&run_id, "card-b", Verb::Approve, None, None)
            .await
            .unwrap();
        assert_eq!(again.state, "denied");
        assert!(op.pending(None, None).await.unwrap().cards.is_empty());
        match op.approve(&run_id, "no-such-card", Scope::Once, None).await {
            Err(OperatorError::Refused(r)) => assert_eq!(r.status, 404, "{r}"),
            other => panic!("{other:?}"),
        }

        let (status, _) = srv
            .post(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
            .await;
        assert_eq!(status.as_u16(), 200);
        let mut follow = op.follow(&run_id, 0);
        let mut seen = Vec::new();
        let done = loop {
            match follow.next().await.unwrap() {
                FollowItem::Event {
                    sequence, event, ..
                } => seen.push((sequence.unwrap(), event)),
                FollowItem::Done { data } => break data,
                other => panic!("{other:?}"),
            }
        };
        let sequences: Vec<u64> = seen.iter().map(|s| s.0).collect();
        assert_eq!(sequences, (1..=sequences.len() as u64).collect::<Vec<_>>());
        assert_eq!(seen.last().unwrap().1, "run_completed");
        let done: serde_json::Value = serde_json::from_str(&done).unwrap();
        assert_eq!(done["terminal_sequence"], sequences.len() as u64);
        // From after the last one: nothing but `done`.
        let mut follow = op.follow(&run_id, follow.last());
        assert!(matches!(
            follow.next().await.unwrap(),
            FollowItem::Done { .. }
        ));

        // An unknown run ends the follow; so does a token the server refuses.
        assert!(matches!(
            op.follow("no-such-run", 0).next().await,
            Err(OperatorError::Refused(r)) if r.status == 404
        ));
        let bad = operator(&srv.base, "not-a-token");
        assert!(matches!(
            bad.follow(&run_id, 0).next().await,
            Err(OperatorError::Refused(r)) if r.status == 401
        ));
    })
    .await;
}

/// GIVEN a server that sends one event, then a line that never ends WHEN following THEN
/// the event arrives, then the response is dropped as broken (an error, in bounded time
/// and memory) and the follow resumes after the event; the same for a gate: the reader
/// stops at the cap instead of buffering without bound.
#[tokio::test(flavor = "multi_thread")]
async fn a_line_over_the_cap_is_an_error_not_unbounded_memory() {
    bounded(async {
        let app = axum::Router::new().route(
            "/api/runs/{id}/events",
            axum::routing::get(|| async {
                let head = "retry: 50\n\nid: 1\nevent: run_started\ndata: {}\n\ndata: ";
                let endless = futures::stream::repeat_with(|| {
                    Ok::<_, std::io::Error>(Bytes::from(vec![b'a'; 64 * 1024]))
                });
                let body = futures::StreamExt::chain(
                    futures::stream::once(
                        async move { Ok::<_, std::io::Error>(Bytes::from(head)) },
                    ),
                    endless,
                );
                (
                    [("content-type", "text/event-stream")],
                    Body::from_stream(body),
                )
                    .into_response()
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

        let op = operator(&base, "fake-token");
        let mut follow = op.follow("run-x", 0);
        assert!(matches!(
            follow.next().await.unwrap(),
            FollowItem::Event {
                sequence: Some(1),
                ..
            }
        ));
        match follow.next().await.unwrap() {
            FollowItem::Reconnecting {
                why: Interruption::Overflow,
                after: 1,
                delay,
            } => assert_eq!(delay, Duration::from_millis(100)),
            other => panic!("{other:?}"),
        }
        // Resumed: the next response is dropped the same way.
        assert!(matches!(
            follow.next().await.unwrap(),
            FollowItem::Reconnecting {
                why: Interruption::Overflow,
                after: 1,
                ..
            }
        ));
    })
    .await;
}
