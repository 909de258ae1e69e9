//! The agent side: a [`Client`] with the agent's JWT creates [`Run`]s; a [`Run`] (its
//! id and run token) appends events, arms gates, executes approved calls and ends.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde::Serialize;
use serde_json::{json, Map, Value};

use tollgate_protocol::execution::MutationRecord;
use tollgate_protocol::runs::{AppendEvents, Appended, CreateRun, RunEnded, RunReceipt};

pub use tollgate_protocol::events::{Event, EventPage};

use crate::http::Http;
use crate::{Error, RetryPolicy};

/// Most events one append request carries (the server's batch limit).
pub const MAX_BATCH_EVENTS: usize = 99;

/// How a [`Client`] talks to the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// Retries of transport errors, 5xx and 429 (every request).
    pub retry: RetryPolicy,
    /// How long one attempt of a plain request may take.
    pub request_timeout: Duration,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// A live stream that sends nothing this long is treated as broken and reopened (the
    /// server sends a keep-alive every 15 s).
    pub stream_stall: Duration,
    /// Between two reads of `GET …/events?after=N` when the live stream is unavailable.
    pub poll_interval: Duration,
    /// How long past a card's deadline a gate keeps waiting for its expiry to be
    /// reported before it gives up with [`Error::WaitTimedOut`] (the server's sweeper
    /// expires a card whose timer was lost within a minute or so).
    pub expiry_grace: Duration,
}

impl Default for ClientConfig {
    /// Default retries, 30 s requests, 10 s connects, 45 s stream stall, 1 s polls,
    /// 120 s grace.
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            stream_stall: Duration::from_secs(45),
            poll_interval: Duration::from_secs(1),
            expiry_grace: Duration::from_secs(120),
        }
    }
}

/// A connection to one Tollgate server as one agent (its JWT). Cheap to clone.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) http: Http,
    agent_token: String,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.inner.http.config)
            .finish_non_exhaustive()
    }
}

/// `kind` of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunKind {
    /// A run on its own (the default).
    Single,
    /// A run whose children raise approvals routed through it.
    Coordinator,
    /// A run under a coordinator (`parent_run_id`).
    Child,
}

/// `execution_mode` of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionMode {
    /// Cards live in Tollgate (the default).
    Inline,
    /// Cards live in an AgentHost pod's memory (`tollgate_client::pod`, feature `pod`); needs
    /// `agenthost_origin`.
    Pod,
}

/// `subtask_id` of a child run: a number or a short string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum SubtaskId {
    /// A number.
    Number(u64),
    /// A string of 1 to 256 bytes.
    Text(String),
}

impl From<u64> for SubtaskId {
    fn from(n: u64) -> Self {
        SubtaskId::Number(n)
    }
}

impl From<&str> for SubtaskId {
    fn from(s: &str) -> Self {
        SubtaskId::Text(s.to_owned())
    }
}

/// A run's budget for approved execution: which tools may start how often, and how many
/// calls in all. A run without one admits no approved execution (fail closed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Budget {
    /// Tool name → most starts.
    pub tools: BTreeMap<String, u64>,
    /// Most approved calls in all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_ceiling: Option<u64>,
}

impl Budget {
    /// An empty budget (admits nothing until tools are added).
    pub fn new() -> Self {
        Self::default()
    }

    /// Allows `max_starts` starts of `tool`.
    pub fn tool(mut self, tool: impl Into<String>, max_starts: u64) -> Self {
        self.tools.insert(tool.into(), max_starts);
        self
    }

    /// Caps the approved calls of the run.
    pub fn call_ceiling(mut self, ceiling: u64) -> Self {
        self.call_ceiling = Some(ceiling);
        self
    }
}

/// What to create: the body of `POST /api/runs`. Every field is optional.
///
/// Retrying a create is safe: with a `delivery_id` the server answers a repeat with the
/// same run (the receipt); without one the client picks the `run_id` itself (when you
/// do not) so that a repeat after a lost answer finds the run it made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RunSpec {
    /// The run's id (1–128 of `A-Z a-z 0-9 _ . : -`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The delivery this run answers: the same `delivery_id` from the same agent always
    /// gets the same run, and [`Client::receipt`] finds it later.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_id: Option<String>,
    /// The human the run acts for (only they may grant scopes beyond `once`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The channel the run reports to (copied into every event's envelope).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel_id: Option<String>,
    /// The approved-execution budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// Single (default), coordinator or child.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<RunKind>,
    /// A child's coordinator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    /// A child's subtask.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subtask_id: Option<SubtaskId>,
    /// Inline (default) or pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_mode: Option<ExecutionMode>,
    /// The AgentHost pod's origin for a pod run (`http(s)://…`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agenthost_origin: Option<String>,
}

impl RunSpec {
    /// The body of `POST /api/runs` (the contract's `CreateRun`).
    pub fn into_wire(self) -> CreateRun {
        fn json<T: Serialize>(v: Option<T>) -> Option<Value> {
            v.and_then(|v| serde_json::to_value(v).ok())
        }
        fn text<T: Serialize>(v: Option<T>) -> Option<String> {
            json(v).and_then(|v| v.as_str().map(str::to_owned))
        }
        CreateRun {
            run_id: self.run_id,
            kind: text(self.kind),
            parent_run_id: self.parent_run_id,
            subtask_id: json(self.subtask_id),
            owner: self.owner,
            project_id: None,
            channel_id: self.channel_id,
            delivery_id: self.delivery_id,
            budget: json(self.budget),
            execution_mode: text(self.execution_mode),
            agenthost_origin: self.agenthost_origin,
        }
    }
}

/// What `GET /api/receipts/{delivery_id}` answers: the run a delivery created.
#[derive(Clone)]
pub struct Receipt {
    /// The run.
    pub run: Run,
    /// Its status now: `running`, `completed`, `failed` or `cancelled`.
    pub status: String,
}

impl fmt::Debug for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receipt")
            .field("run", &self.run)
            .field("status", &self.status)
            .finish()
    }
}

impl Client {
    /// A client of the server at `base_url` (e.g. `http://127.0.0.1:8080`; a path prefix
    /// such as an API stage is kept) acting with the agent's JWT.
    pub fn new(base_url: &str, agent_jwt: &str) -> Result<Self, Error> {
        Self::with_config(base_url, agent_jwt, ClientConfig::default())
    }

    /// [`Client::new`] with other timeouts or retries.
    pub fn with_config(
        base_url: &str,
        agent_jwt: &str,
        config: ClientConfig,
    ) -> Result<Self, Error> {
        if agent_jwt.trim().is_empty() {
            return Err(Error::Config("the agent token is empty".into()));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                http: Http::new(base_url, config, crate::http::USER_AGENT)?,
                agent_token: agent_jwt.trim().to_owned(),
            }),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.http.config
    }

    pub(crate) fn http(&self) -> &Http {
        &self.inner.http
    }

    /// Creates a run (`POST /api/runs`): 201 a new run, 200 the run an earlier attempt
    /// of the same create made ([`Run::created`] tells which).
    pub async fn create_run(&self, mut spec: RunSpec) -> Result<Run, Error> {
        if spec.run_id.is_none() && spec.delivery_id.is_none() {
            // Our own id makes a retried create find the run the first attempt made.
            spec.run_id = Some(format!("run-{}", uuid::Uuid::new_v4().simple()));
        }
        let body = serde_json::to_value(spec.into_wire()).map_err(|e| Error::Config(e.to_string()))?;
        let http = self.http();
        let answer = http
            .send(
                Method::POST,
                http.endpoint(&["api", "runs"]),
                &self.inner.agent_token,
                Some(&body),
            )
            .await?;
        let created = answer.status == 201;
        let receipt: RunReceipt = answer.parse(&[200, 201])?;
        let mut run = self.run_from(receipt);
        run.created = created;
        Ok(run)
    }

    /// The run a create with this `delivery_id` made (`GET /api/receipts/{delivery_id}`);
    /// [`Error::NotFound`] when there is none (or another agent made it).
    pub async fn receipt(&self, delivery_id: &str) -> Result<Receipt, Error> {
        let http = self.http();
        let answer = http
            .send(
                Method::GET,
                http.endpoint(&["api", "receipts", delivery_id]),
                &self.inner.agent_token,
                None,
            )
            .await?;
        let status = answer.status;
        let mut receipt: RunReceipt = answer.parse(&[200])?;
        let run_status = receipt
            .status
            .take()
            .ok_or_else(|| Error::malformed(status, "status"))?;
        Ok(Receipt {
            run: self.run_from(receipt),
            status: run_status,
        })
    }

    /// A handle on an existing run from its id and run token (e.g. kept across a
    /// restart). Nothing is sent.
    pub fn run(&self, run_id: impl Into<String>, run_token: impl Into<String>) -> Run {
        Run {
            client: self.clone(),
            run_id: run_id.into(),
            run_token: run_token.into(),
            created: false,
            agenthost_credential: None,
            on_execution_started: None,
        }
    }

    fn run_from(&self, receipt: RunReceipt) -> Run {
        let mut run = self.run(receipt.run_id, receipt.run_token);
        run.agenthost_credential = receipt.agenthost_credential;
        run
    }
}

/// One run: its id and its run token (which the `Debug` output never shows). Cheap to
/// clone; every method talks to the server with the run token.
#[derive(Clone)]
pub struct Run {
    pub(crate) client: Client,
    run_id: String,
    run_token: String,
    created: bool,
    agenthost_credential: Option<String>,
    on_execution_started: Option<ExecutionStartedHook>,
}

/// Seed 000's optional `on_tool_execution_started(tool_name)` adapter hook.
pub(crate) type ExecutionStartedHook = Arc<dyn Fn(&str) + Send + Sync>;

impl fmt::Debug for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run")
            .field("run_id", &self.run_id)
            .field("created", &self.created)
            .finish_non_exhaustive()
    }
}

/// How a run ended: what `POST …/complete`, `/fail` or `/cancel` answered.
pub type Ended = RunEnded;

impl Run {
    /// The run's id.
    pub fn id(&self) -> &str {
        &self.run_id
    }

    /// This handle with seed 000's optional `on_tool_execution_started(tool_name)` hook:
    /// called with the tool's name whenever the server has announced
    /// `tool_execution_started` for a call this handle started — admitted, or refused at
    /// admission right after (budget, ceiling). Not for a call a policy approved, nor one
    /// whose card was denied or expired (nothing started). A repeated start of the same
    /// attempt (after a restart) may call it again.
    pub fn on_tool_execution_started(
        mut self,
        hook: impl Fn(&str) + Send + Sync + 'static,
    ) -> Self {
        self.on_execution_started = Some(Arc::new(hook));
        self
    }

    pub(crate) fn execution_started(&self, tool_name: &str) {
        if let Some(hook) = &self.on_execution_started {
            hook(tool_name);
        }
    }

    /// The run's token (a secret: give it only to whoever acts for this run).
    pub fn token(&self) -> &str {
        &self.run_token
    }

    /// Whether [`Client::create_run`] created the run just now (201) rather than found
    /// the one an earlier attempt made (200).
    pub fn created(&self) -> bool {
        self.created
    }

    /// For a pod-per-run run (`execution_mode: pod`): the credential its AgentHost pod
    /// checks on the decisions Tollgate forwards (`Authorization: Bearer`; give it to the
    /// pod's `pod::PodGate::new` and nobody else). `None` for inline runs and
    /// runs made with [`Client::run`].
    pub fn agenthost_credential(&self) -> Option<&str> {
        self.agenthost_credential.as_deref()
    }

    /// The client this run talks through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub(crate) fn endpoint(&self, rest: &[&str]) -> reqwest::Url {
        let mut segments = vec!["api", "runs", self.run_id.as_str()];
        segments.extend_from_slice(rest);
        self.client.http().endpoint(&segments)
    }

    /// `method` on `/api/runs/{id}/<rest>` with the run token, retried per the policy.
    pub(crate) async fn call(
        &self,
        method: Method,
        rest: &[&str],
        body: Option<&Value>,
    ) -> Result<crate::http::Answer, Error> {
        self.client
            .http()
            .send(method, self.endpoint(rest), &self.run_token, body)
            .await
    }

    /// Appends events (`POST /api/runs/{id}/events`) and returns their sequences, in
    /// order. Each event is a JSON object with a `type`; one without an `event_id` gets a
    /// fresh UUID, so a retried request (transport error, 5xx, 429) answers the original
    /// sequences instead of appending twice. More than 99 events go in several requests
    /// (each atomic on its own).
    pub async fn append<I>(&self, events: I) -> Result<Vec<u64>, Error>
    where
        I: IntoIterator<Item = Value>,
    {
        let events = events
            .into_iter()
            .enumerate()
            .map(|(i, e)| keyed_event(i, e))
            .collect::<Result<Vec<_>, _>>()?;
        if events.is_empty() {
            return Err(Error::InvalidEvent("nothing to append".into()));
        }
        let mut sequences = Vec::with_capacity(events.len());
        for batch in events.chunks(MAX_BATCH_EVENTS) {
            let body = AppendEvents {
                events: batch.to_vec(),
            };
            let body = serde_json::to_value(body).map_err(|e| Error::Config(e.to_string()))?;
            let answer = self.call(Method::POST, &["events"], Some(&body)).await?;
            let status = answer.status;
            let appended: Appended = answer.parse(&[200])?;
            if appended.sequences.len() != batch.len() {
                return Err(Error::malformed(status, "one sequence per event"));
            }
            sequences.extend(appended.sequences);
        }
        Ok(sequences)
    }

    /// One page of the run's stream after `after` (`limit` 1–1000, default 100).
    pub async fn events(&self, after: u64, limit: Option<u32>) -> Result<EventPage, Error> {
        let mut url = self.endpoint(&["events"]);
        url.query_pairs_mut()
            .append_pair("after", &after.to_string());
        if let Some(limit) = limit {
            url.query_pairs_mut()
                .append_pair("limit", &limit.to_string());
        }
        let answer = self
            .client
            .http()
            .send(Method::GET, url, &self.run_token, None)
            .await?;
        answer.parse(&[200])
    }

    /// Completes the run (`run_completed`, with `fields` in it). Repeating answers the
    /// same sequence.
    pub async fn complete(&self, fields: Option<Value>) -> Result<Ended, Error> {
        self.finish("complete", fields).await
    }

    /// Fails the run (`run_failed`).
    pub async fn fail(&self, fields: Option<Value>) -> Result<Ended, Error> {
        self.finish("fail", fields).await
    }

    /// Cancels the run (`run_cancelled`).
    pub async fn cancel(&self, fields: Option<Value>) -> Result<Ended, Error> {
        self.finish("cancel", fields).await
    }

    async fn finish(&self, verb: &str, fields: Option<Value>) -> Result<Ended, Error> {
        let body = fields.unwrap_or_else(|| json!({}));
        self.call(Method::POST, &[verb], Some(&body))
            .await?
            .parse(&[200])
    }

    /// A durable `mutation_outcome/v1` record
    /// (`GET /api/runs/{id}/mutations/{tool_call_id}/{approval_id}`).
    pub async fn mutation(
        &self,
        tool_call_id: &str,
        approval_id: &str,
    ) -> Result<MutationRecord, Error> {
        self.call(Method::GET, &["mutations", tool_call_id, approval_id], None)
            .await?
            .parse(&[200])
    }
}

/// An event for the wire: a JSON object with a `type`, keyed by an `event_id`.
fn keyed_event(index: usize, event: Value) -> Result<Map<String, Value>, Error> {
    let Value::Object(mut map) = event else {
        return Err(Error::InvalidEvent(format!(
            "events[{index}] must be a JSON object"
        )));
    };
    if !map.get("type").is_some_and(Value::is_string) {
        return Err(Error::InvalidEvent(format!(
            "events[{index}] needs a string \"type\""
        )));
    }
    if !map.contains_key("event_id") {
        map.insert("event_id".into(), uuid::Uuid::new_v4().to_string().into());
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_get_an_event_id_unless_given_and_need_a_type() {
        let e = keyed_event(0, json!({"type": "agent.message", "text": "hi"})).unwrap();
        let id = e["event_id"].as_str().unwrap();
        assert!(uuid::Uuid::parse_str(id).is_ok());
        let given = keyed_event(0, json!({"type": "x", "event_id": "mine"})).unwrap();
        assert_eq!(given["event_id"], "mine");
        assert!(matches!(
            keyed_event(3, json!({"text": "no type"})),
            Err(Error::InvalidEvent(m)) if m.contains("events[3]")
        ));
        assert!(matches!(
            keyed_event(0, json!([1])),
            Err(Error::InvalidEvent(_))
        ));
    }

    #[test]
    fn specs_serialize_only_what_is_set() {
        let spec = RunSpec {
            owner: Some("alice".into()),
            budget: Some(Budget::new().tool("web_fetch", 1).call_ceiling(5)),
            kind: Some(RunKind::Child),
            subtask_id: Some(3.into()),
            execution_mode: Some(ExecutionMode::Pod),
            ..RunSpec::default()
        };
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            json!({"owner": "alice", "budget": {"tools": {"web_fetch": 1}, "call_ceiling": 5},
                   "kind": "child", "subtask_id": 3, "execution_mode": "pod"})
        );
        assert_eq!(serde_json::to_value(RunSpec::default()).unwrap(), json!({}));
    }

    #[test]
    fn debug_never_shows_tokens() {
        let client = Client::new("http://127.0.0.1:1", "secret-jwt").unwrap();
        let run = client.run("run-1", "secret-run-token");
        let shown = format!("{client:?} {run:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(matches!(
            Client::new("http://127.0.0.1:1", " "),
            Err(Error::Config(_))
        ));
    }
}
