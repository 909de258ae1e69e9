//! # tollgate-client
//!
//! The client of Tollgate's HTTP contract: an agent creates a run, appends its
//! events, asks a human before a tool call, and runs the approved call under an
//! execution guard that records what actually happened; an AgentHost pod holds the
//! cards of pod-per-run runs and answers Tollgate's forwarded decisions.
//!
//! It speaks only HTTP (reqwest with rustls, tokio, serde_json): no AWS types, and no
//! dependency on the server's crates (axum only with the `pod` feature).
//!
//! ## Quick start
//!
//! ```no_run
//! use std::time::Duration;
//! use serde_json::json;
//! use tollgate_client::{Budget, Client, Decision, GateRequest, Reply, RunSpec, TransportError};
//!
//! # async fn agent() -> Result<(), tollgate_client::Error> {
//! let client = Client::new("http://127.0.0.1:8080", "<agent JWT>")?;
//! let run = client
//!     .create_run(RunSpec {
//!         owner: Some("alice".into()),
//!         budget: Some(Budget::new().tool("web_fetch", 1).call_ceiling(5)),
//!         ..RunSpec::default()
//!     })
//!     .await?;
//! run.append([json!({"type": "agent.message", "text": "looking this up"})]).await?;
//!
//! // Ask before the call; waits until a human decides (or a policy approves at once).
//! let url = "https://example.com/docs";
//! let decision = run
//!     .gate(GateRequest::new("web_fetch", json!({"url": url})).url(url))
//!     .await?;
//! match decision {
//!     Decision::Approved { call, .. } => {
//!         // start → dispatch → the transport (10 s at most) → settle with the evidence.
//!         let executed = run
//!             .execute(call, Duration::from_secs(10), |_permit| async move {
//!                 // Send the request here; a response is `Ok(Reply)`, a failure `Err`.
//!                 Ok::<_, TransportError>(Reply::ok((), json!({"http_status": 200})))
//!             })
//!             .await?;
//!         println!("recorded as {:?}", executed.state());
//!     }
//!     Decision::Denied { decided_by } => println!("denied by {decided_by:?}"),
//!     Decision::Expired => println!("nobody answered in time"),
//! }
//! run.complete(None).await?;
//! # Ok(())
//! # }
//! ```
//!
//! ## What is where
//!
//! - [`Client`], [`RunSpec`], [`Run`]: runs and events (`POST /api/runs`, appends with
//!   automatic `event_id`s so retries are safe, replay pages, complete/fail/cancel,
//!   receipts by `delivery_id`).
//! - [`Run::gate`] ([`gate`]): arm a card, wait for its resolution on the live stream
//!   (SSE, resumed with `Last-Event-ID`) or by polling the event pages.
//! - [`Run::execute`] and [`Run::start`] → [`Started`] → [`Dispatched`]
//!   ([`execution`]): the execution guard for approved mutations; evidence
//!   `confirmed` / `ambiguous` / `not_sent` by what actually happened, and no way to
//!   retry an ambiguous call.
//! - [`operator`]: [`operator::Operator`], the operator's side: the pending cards,
//!   approve / deny, and a run's live stream followed with resume
//!   ([`operator::Follow`]); what the `tollgate` command is built on.
//! - `pod` (cargo feature `pod`, on by default): `pod::PodGate`, the in-memory gate
//!   and the routes (`/tool-approvals`, `/tool-denials`) of an AgentHost pod. It pulls
//!   in axum; a program that hosts no pod turns it off (`default-features = false`).
//! - [`sse`]: the `text/event-stream` parser both sides read the live stream with; a
//!   line or frame over its cap stops it, so a broken server cannot make a reader
//!   buffer without bound.
//! - [`RetryPolicy`]: every request is retried on transport errors, 5xx and 429 (with
//!   `Retry-After`), boundedly; other 4xx never.
//!
//! Examples: `examples/agent.rs` (an agent that asks before `web_fetch`) and
//! `examples/pod.rs` (a pod serving the decision routes on a loopback port).

#![warn(missing_docs)]

mod client;
mod error;
pub mod execution;
pub mod gate;
pub mod hash;
mod http;
pub mod operator;
#[cfg(feature = "pod")]
pub mod pod;
mod retry;
pub mod sse;
pub mod ws;

pub use client::{
    Budget, Client, ClientConfig, Ended, Event, EventPage, ExecutionMode, Receipt, Run, RunKind,
    RunSpec, SubtaskId, MAX_BATCH_EVENTS,
};
pub use error::Error;
pub use execution::{
    ApprovedCall, CallOutcome, CallRef, Dispatched, Evidence, EvidenceKind, Executed,
    MutationState, Record, Reply, SendPermit, Started, TransportError,
};
pub use gate::{Armed, Decision, GateRequest, Scope};
pub use hash::arguments_hash;
pub use retry::RetryPolicy;
/// The HTTP contract's types (`tollgate-protocol`): what this client sends and parses.
pub use tollgate_protocol as protocol;
