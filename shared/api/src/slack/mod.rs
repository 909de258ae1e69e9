//! Approving from Slack (docs/architecture.md §11): a card armed on a run with a
//! `channel_id` is posted to that channel with Approve / Deny buttons and a scope menu
//! (the Slack sink of the notifier), and Slack's clicks come back to the interactivity
//! endpoint, `POST /api/slack/interactions`:
//!
//! 1. the request's signature is checked over the raw body ([`signature`]); a missing,
//!    wrong or stale one is 401 and nothing is read further;
//! 2. the clicking Slack user is mapped to an operator and its project
//!    ([`users`]) — identity comes only from there, never from the button;
//! 3. the button's value names the card ([`ButtonValue`]), the message's scope menu the
//!    scope, and the decision goes through the same use-case as the HTTP decision routes
//!    (`approvals::decide_as`), with `decided_by` = the mapped operator;
//! 4. whatever decided nothing (an unmapped user, a card outside the user's projects, a
//!    scope the gate refuses) is answered 200 and told to the user in an ephemeral
//!    message; the card message itself is rewritten by the sink when the card resolves,
//!    however it resolves;
//! 5. in `serve` every click is answered within Slack's window (3 s): a decision
//!    forwarded to a run's pod that has not answered by [`FORWARD_BUDGET`] after the
//!    request arrived is answered `pending` and goes on in its task, which records what
//!    the pod answers; a Lambda function, frozen after its answer, waits for it
//!    (docs/architecture.md §11).

pub mod blocks;
pub mod channels;
pub mod client;
pub mod signature;
pub mod sink;
pub mod users;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tollgate_domain::approval::valid_id;
use tollgate_protocol::approvals::Decide;
use tollgate_protocol::slack::{
    ButtonValue, SlackAnswer, APPROVE_ACTION, DENY_ACTION, MAX_BUTTON_VALUE, SCOPE_ACTION,
};

use crate::approvals::{decide_as, Verb};
use crate::auth::{Claims, Role};
use crate::config::Secret;
use crate::request::{JsonBody, RunId};
use crate::{ApiError, ConfigError, Deps};

pub use client::{Posted, SlackClient, SlackError};
pub use sink::SlackSink;
pub use users::{SlackOperator, SlackUsers};

/// How long after a click arrives `serve` waits for its decision before answering
/// `pending` (the decision goes on): Slack shows the user an error when its request is
/// not answered within 3 s, so the wait and the ephemeral message fit inside
/// [`ANSWER_BUDGET`], which leaves room for the network both ways
/// (docs/architecture.md §11).
pub const FORWARD_BUDGET: std::time::Duration = std::time::Duration::from_millis(1800);
/// When a click is answered at the latest (bar a store slower than its own budget):
/// an ephemeral message not sent by then is dropped (logged).
pub const ANSWER_BUDGET: std::time::Duration = std::time::Duration::from_millis(2500);

/// The interactivity endpoint (Slack app → Interactivity → Request URL).
pub const INTERACTIONS_PATH: &str = "/api/slack/interactions";
/// The Web API's base URL (default [`client::DEFAULT_API_URL`]).
pub const API_URL_VAR: &str = "TOLLGATE_SLACK_API_URL";
/// `tollgate serve`: the bot token (`xoxb-…`).
pub const BOT_TOKEN_VAR: &str = "TOLLGATE_SLACK_BOT_TOKEN";
/// `tollgate serve`: the app's signing secret.
pub const SIGNING_SECRET_VAR: &str = "TOLLGATE_SLACK_SIGNING_SECRET";
/// Deployed: the Secrets Manager ARN of the bot token.
pub const BOT_TOKEN_ARN_VAR: &str = "TOLLGATE_SLACK_BOT_TOKEN_ARN";
/// Deployed: the Secrets Manager ARN of the signing secret.
pub const SIGNING_SECRET_ARN_VAR: &str = "TOLLGATE_SLACK_SIGNING_SECRET_ARN";

/// What Slack needs here: the Web API client (bot token), the signing secret and the
/// user mapping. Its `Debug` shows no secret.
pub struct Slack {
    pub client: SlackClient,
    signing_secret: Secret,
    pub users: SlackUsers,
}

impl std::fmt::Debug for Slack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slack")
            .field("client", &self.client)
            .field("users", &self.users.len())
            .finish_non_exhaustive()
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl Slack {
    pub fn new(
        api_url: &str,
        bot_token: Secret,
        signing_secret: Secret,
        users: SlackUsers,
    ) -> Self {
        Self {
            client: SlackClient::new(api_url, bot_token),
            signing_secret,
            users,
        }
    }

    /// The signing secret's bytes (to verify a request).
    fn secret(&self) -> &[u8] {
        self.signing_secret.expose()
    }

    /// `tollgate serve`: Slack from `TOLLGATE_SLACK_BOT_TOKEN`,
    /// `TOLLGATE_SLACK_SIGNING_SECRET`, `TOLLGATE_SLACK_USERS` (`TOLLGATE_SLACK_PROJECT`)
    /// and `TOLLGATE_SLACK_API_URL`; `None` when neither secret is set. One without the
    /// other fails start-up.
    pub fn from_env() -> Result<Option<Self>, ConfigError> {
        let token = env(BOT_TOKEN_VAR);
        let secret = env(SIGNING_SECRET_VAR);
        match (token, secret) {
            (None, None) => Ok(None),
            (Some(token), Some(secret)) => Self::with_secrets(token, secret).map(Some),
            _ => Err(ConfigError::Invalid(format!(
                "Slack needs both {BOT_TOKEN_VAR} and {SIGNING_SECRET_VAR} (or neither)"
            ))),
        }
    }

    /// A deployed function: the bot token and signing secret from Secrets Manager
    /// (`TOLLGATE_SLACK_BOT_TOKEN_ARN`, `TOLLGATE_SLACK_SIGNING_SECRET_ARN`, read once at
    /// cold start), the rest as [`Slack::from_env`]; `None` when neither ARN is set. The
    /// secrets themselves in a function's environment are refused (readable by
    /// `lambda:GetFunctionConfiguration`).
    pub async fn from_secrets_manager_env() -> Result<Option<Self>, ConfigError> {
        for var in [BOT_TOKEN_VAR, SIGNING_SECRET_VAR] {
            if env(var).is_some() {
                return Err(ConfigError::Invalid(format!(
                    "{var} is set in the environment; functions read Slack's secrets from \
                     Secrets Manager ({BOT_TOKEN_ARN_VAR}, {SIGNING_SECRET_ARN_VAR})"
                )));
            }
        }
        match (env(BOT_TOKEN_ARN_VAR), env(SIGNING_SECRET_ARN_VAR)) {
            (None, None) => Ok(None),
            (Some(token_arn), Some(secret_arn)) => {
                let token = crate::config::secret_string(
                    &token_arn,
                    "the Slack bot token",
                    BOT_TOKEN_ARN_VAR,
                )
                .await?;
                let secret = crate::config::secret_string(
                    &secret_arn,
                    "the Slack signing secret",
                    SIGNING_SECRET_ARN_VAR,
                )
                .await?;
                Self::with_secrets(token, secret).map(Some)
            }
            _ => Err(ConfigError::Invalid(format!(
                "Slack needs both {BOT_TOKEN_ARN_VAR} and {SIGNING_SECRET_ARN_VAR} (or neither)"
            ))),
        }
    }

    fn with_secrets(token: String, secret: String) -> Result<Self, ConfigError> {
        let empty = |var: &str| ConfigError::Invalid(format!("{var} is empty"));
        let token = Secret::opaque(token.trim()).ok_or_else(|| empty(BOT_TOKEN_VAR))?;
        let secret = Secret::opaque(secret.trim()).ok_or_else(|| empty(SIGNING_SECRET_VAR))?;
        let users = SlackUsers::parse(
            &env(users::USERS_VAR).unwrap_or_default(),
            env(users::PROJECT_VAR).as_deref(),
        )?;
        Ok(Self::new(&api_url_from_env()?, token, secret, users))
    }
}

/// `TOLLGATE_SLACK_API_URL` (default Slack's), checked to be an http(s) URL.
fn api_url_from_env() -> Result<String, ConfigError> {
    let api_url = env(API_URL_VAR).unwrap_or_else(|| client::DEFAULT_API_URL.to_owned());
    let parsed = url::Url::parse(&api_url)
        .map_err(|_| ConfigError::Invalid(format!("{API_URL_VAR} is not a URL")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ConfigError::Invalid(format!(
            "{API_URL_VAR} must be an http(s) URL"
        )));
    }
    Ok(api_url)
}

impl SlackClient {
    /// The `notifier` function's Slack: the Web API client with the bot token from
    /// Secrets Manager (`TOLLGATE_SLACK_BOT_TOKEN_ARN`, read once at cold start), and
    /// nothing else: posting needs neither the signing secret nor the user mapping.
    /// `None` when the ARN is not set; the token itself in the environment is refused.
    pub async fn from_secrets_manager_env() -> Result<Option<Self>, ConfigError> {
        if env(BOT_TOKEN_VAR).is_some() {
            return Err(ConfigError::Invalid(format!(
                "{BOT_TOKEN_VAR} is set in the environment; functions read the bot token \
                 from Secrets Manager ({BOT_TOKEN_ARN_VAR})"
            )));
        }
        let Some(arn) = env(BOT_TOKEN_ARN_VAR) else {
            return Ok(None);
        };
        let token =
            crate::config::secret_string(&arn, "the Slack bot token", BOT_TOKEN_ARN_VAR).await?;
        let token = Secret::opaque(token.trim()).ok_or_else(|| {
            ConfigError::Invalid(format!("{BOT_TOKEN_ARN_VAR}: the secret is empty"))
        })?;
        Ok(Some(SlackClient::new(&api_url_from_env()?, token)))
    }
}

/// The interactivity route (served by the `approvals` function and `tollgate serve`).
pub fn routes() -> Router<Deps> {
    // (The path is [`INTERACTIONS_PATH`], written out: the route tests read it here.)
    Router::new().route("/api/slack/interactions", post(interaction))
}

/// The parts of a Slack interaction payload this endpoint reads.
#[derive(Debug, Deserialize)]
struct Interaction {
    #[serde(rename = "type")]
    kind: String,
    user: Option<Id>,
    channel: Option<Id>,
    #[serde(default)]
    actions: Vec<Action>,
    state: Option<MessageState>,
}

#[derive(Debug, Deserialize)]
struct Id {
    id: String,
}

#[derive(Debug, Deserialize)]
struct Action {
    action_id: String,
    value: Option<String>,
}

#[derive(Debug, Deserialize)]
struct MessageState {
    #[serde(default)]
    values: std::collections::HashMap<String, std::collections::HashMap<String, StateValue>>,
}

#[derive(Debug, Deserialize)]
struct StateValue {
    selected_option: Option<SelectedOption>,
}

#[derive(Debug, Deserialize)]
struct SelectedOption {
    value: String,
}

fn answer(outcome: &str) -> SlackAnswer {
    SlackAnswer {
        outcome: outcome.into(),
        state: None,
        decided_by: None,
        message: None,
    }
}

/// A click's decision, as its button and the message's scope menu say.
struct Click {
    verb: Verb,
    card: ButtonValue,
    run_id: RunId,
    scope: &'static str,
}

/// The button's value, checked: it must be one this server wrote for the button clicked.
fn click(action: &Action, state: Option<&MessageState>) -> Result<Click, ApiError> {
    let bad = || ApiError::bad_request("the button's value is not a Tollgate card's");
    let verb = match action.action_id.as_str() {
        APPROVE_ACTION => Verb::Approve,
        _ => Verb::Deny,
    };
    let value = action.value.as_deref().ok_or_else(bad)?;
    if value.len() > MAX_BUTTON_VALUE {
        return Err(bad());
    }
    let card: ButtonValue = serde_json::from_str(value).map_err(|_| bad())?;
    let decision = match verb {
        Verb::Approve => "approve",
        Verb::Deny => "deny",
    };
    if card.v != 1
        || card.d != decision
        || !valid_id(&card.q)
        || card.p.as_deref().is_some_and(|p| !valid_id(p))
    {
        return Err(bad());
    }
    let run_id = RunId::parse(&card.r).ok_or_else(bad)?;
    // The scope menu's choice in the message (`once` when none is chosen).
    let chosen = state
        .into_iter()
        .flat_map(|s| s.values.values())
        .filter_map(|block| block.get(SCOPE_ACTION))
        .find_map(|v| v.selected_option.as_ref().map(|o| o.value.as_str()));
    let scope = match chosen {
        None | Some("once") => "once",
        Some("run") => "run",
        Some("tool") => "tool",
        Some("always") => "always",
        Some(_) => {
            return Err(ApiError::bad_request(
                "the scope menu's value is not a scope",
            ))
        }
    };
    Ok(Click {
        verb,
        card,
        run_id,
        scope,
    })
}

/// The largest interaction body read (before its signature is checked): 413 beyond.
pub const MAX_INTERACTION_BYTES: usize = 64 * 1024;

/// `POST /api/slack/interactions`.
async fn interaction(
    State(deps): State<Deps>,
    headers: HeaderMap,
    body: JsonBody,
) -> Result<Json<SlackAnswer>, ApiError> {
    let arrived = tokio::time::Instant::now();
    let answer_by = arrived + ANSWER_BUDGET;
    let Some(slack) = deps.slack.clone() else {
        return Err(ApiError::not_found(
            "Slack is not configured on this server",
        ));
    };
    // A click is a few KiB: nothing more is read before the signature is checked.
    let raw = body.bytes_within(MAX_INTERACTION_BYTES).await?;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let now = tollgate_domain::now_millis().div_euclid(1000);
    if let Err(e) = signature::verify(
        slack.secret(),
        header(signature::TIMESTAMP_HEADER),
        header(signature::SIGNATURE_HEADER),
        &raw,
        now,
    ) {
        tracing::warn!(why = %e, "Slack interaction refused");
        return Err(ApiError::unauthorized(e.to_string()));
    }
    let payload = url::form_urlencoded::parse(&raw)
        .find(|(k, _)| k == "payload")
        .map(|(_, v)| v.into_owned())
        .ok_or_else(|| ApiError::bad_request("the body has no payload field"))?;
    let interaction: Interaction = serde_json::from_str(&payload)
        .map_err(|e| ApiError::bad_request(format!("the payload is not an interaction: {e}")))?;
    if interaction.kind != "block_actions" {
        return Ok(Json(answer("ignored")));
    }
    let Some(action) = interaction
        .actions
        .iter()
        .find(|a| a.action_id == APPROVE_ACTION || a.action_id == DENY_ACTION)
    else {
        // A scope chosen in the menu, or another app's element: nothing to decide.
        return Ok(Json(answer("ignored")));
    };
    let click = click(action, interaction.state.as_ref())?;
    let user = interaction
        .user
        .as_ref()
        .map(|u| u.id.as_str())
        .ok_or_else(|| ApiError::bad_request("the interaction names no user"))?;
    let channel = interaction.channel.as_ref().map(|c| c.id.as_str());
    let refuse = |message: String| refused(&slack, channel, user, message, answer_by);
    let Some(operator) = slack.users.operator(user).cloned() else {
        tracing::info!(
            slack_user = user,
            "Slack user not mapped to an operator; nothing decided"
        );
        return refuse(
            "Not allowed: your Slack user is not mapped to a Tollgate operator. Nothing was decided."
                .into(),
        )
        .await;
    };
    // The operator's project bounds the card, as an operator token's would; a user of
    // every project reaches the card only in the project its button names.
    let project = match &operator.project {
        Some(p) if click.card.p.as_deref() != Some(p.as_str()) => {
            return refuse(not_allowed()).await;
        }
        Some(p) => Some(p.clone()),
        None => click.card.p.clone(),
    };
    let claims = Claims {
        sub: operator.name.clone(),
        role: Role::Operator,
        exp: 0,
        project_id: project,
    };
    let decide = Decide {
        request_id: click.card.q.clone(),
        scope: (click.verb == Verb::Approve).then(|| json!(click.scope)),
        tool_name: None,
        reason: None,
    };
    // The decision runs in a task of its own with the configured forward timeout, so
    // whatever the run's pod answers is recorded (docs/architecture.md §11). Only a
    // decision the pod makes may be slow (a card the store does not know, or one its pod
    // holds, still pending), and `decide_as` says when it hands one to the pod: then
    // `serve` answers `pending` once FORWARD_BUDGET has passed and lets the task finish.
    // Any other decision is the store's, and is waited for; so is every decision in a
    // Lambda function, frozen after its answer (Slack may show its timeout notice; the
    // outcome is recorded and the card's message rewritten by the notifier).
    let (forwarding, to_pod) = tokio::sync::oneshot::channel();
    let mut task = tokio::spawn(decide_as(
        deps.clone(),
        claims,
        Ok(click.run_id),
        decide,
        click.verb,
        (!frozen_after_answer()).then_some(forwarding),
    ));
    let joined = tokio::select! {
        biased;
        joined = &mut task => joined,
        told = to_pod => match told {
            // The pod decides: answered by the budget at the latest.
            Ok(()) => match tokio::time::timeout_at(arrived + FORWARD_BUDGET, &mut task).await {
                Ok(joined) => joined,
                Err(_) => {
                    let pending = still_deciding(&slack, channel, user, &operator.name, answer_by);
                    return Ok(pending.await);
                }
            },
            // The store decides: waited for.
            Err(_) => (&mut task).await,
        },
    };
    let decided = match joined {
        Ok(decided) => decided,
        Err(e) => {
            tracing::error!(error = %e, "Slack click: the decision task failed");
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the decision could not be confirmed",
            ))
        }
    };
    match decided {
        Ok(decision) => {
            let decided = decision.answer;
            let asked = match click.verb {
                Verb::Approve => "approved",
                Verb::Deny => "denied",
            };
            // This click resolved the card (for a pod's card, not known: as it reads).
            let mine = decision.fresh.unwrap_or_else(|| {
                decided.state == asked
                    && decided.decided_by.as_deref() == Some(operator.name.as_str())
            });
            tracing::info!(
                slack_user = user,
                operator = %operator.name,
                run_id = %decided.run_id,
                request_id = %decided.request_id,
                state = %decided.state,
                "Slack click on a card"
            );
            let mut out = SlackAnswer {
                state: Some(decided.state.clone()),
                decided_by: decided.decided_by.clone(),
                ..answer(if mine { "decided" } else { "already" })
            };
            if !mine {
                let message = format!(
                    "This card was already {}{}.",
                    decided.state,
                    decided
                        .decided_by
                        .as_deref()
                        .map(|by| format!(" by {by}"))
                        .unwrap_or_default()
                );
                tell(&slack, channel, user, &message, answer_by).await;
                out.message = Some(message);
            }
            Ok(Json(out))
        }
        // Refused by the gate: nothing decided, the card as it stands.
        Err(e) if e.status == StatusCode::NOT_FOUND => refuse(not_allowed()).await,
        Err(e) if e.status.is_client_error() => refuse(format!("Not decided: {}", e.error)).await,
        // The run's pod did not answer in time (or is unreachable), the store is
        // unavailable, or too many decisions are on their way: nothing was recorded
        // (a forward that timed out records nothing, §8), the card stands as its message
        // shows, and the user may click again. Slack still gets its 200 in time.
        Err(e) => {
            tracing::warn!(
                slack_user = user,
                status = e.status.as_u16(),
                error = %e.error,
                "Slack click not decided"
            );
            refuse(format!(
                "Not confirmed: {} The card's message shows where it stands; click again if it still offers its buttons.",
                if e.state == Some(tollgate_app::ErrorState::AgenthostUnreachable) {
                    "the agent's host could not be reached."
                } else {
                    "Tollgate could not decide it just now."
                }
            ))
            .await
        }
    }
}

/// The answer to a click whose decision the run's pod has not made by the budget: the
/// user is told, and the decision goes on in its task.
async fn still_deciding(
    slack: &Arc<Slack>,
    channel: Option<&str>,
    user: &str,
    operator: &str,
    answer_by: tokio::time::Instant,
) -> Json<SlackAnswer> {
    tracing::info!(
        slack_user = user,
        operator,
        "Slack click: the run's pod has not answered yet; deciding on"
    );
    let message = "Deciding: the agent's host has not answered yet. The card's message will \
                   show the outcome when it does."
        .to_owned();
    told(slack, channel, user, message, answer_by, "pending").await
}

/// Whether this process is frozen once it has answered (a Lambda function: the runtime
/// sets `AWS_LAMBDA_FUNCTION_NAME`), so work left running after the answer may never end.
fn frozen_after_answer() -> bool {
    std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some()
}

/// Nothing decided: the user is told why, and Slack gets its 200.
async fn refused(
    slack: &Arc<Slack>,
    channel: Option<&str>,
    user: &str,
    message: String,
    answer_by: tokio::time::Instant,
) -> Result<Json<SlackAnswer>, ApiError> {
    Ok(told(slack, channel, user, message, answer_by, "refused").await)
}

/// The answer `outcome` with `message`, shown to `user` alone first ([`tell`]).
async fn told(
    slack: &Arc<Slack>,
    channel: Option<&str>,
    user: &str,
    message: String,
    answer_by: tokio::time::Instant,
    outcome: &'static str,
) -> Json<SlackAnswer> {
    tell(slack, channel, user, &message, answer_by).await;
    Json(SlackAnswer {
        message: Some(message),
        ..answer(outcome)
    })
}

fn not_allowed() -> String {
    "Not allowed: this card is outside your Tollgate projects (or no longer exists). Nothing was decided.".into()
}

/// Shows `message` to `user` alone (best effort, and only until `answer_by`, Slack's
/// answer being due: a failure or a Slack too slow is logged, the answer stands).
async fn tell(
    slack: &Arc<Slack>,
    channel: Option<&str>,
    user: &str,
    message: &str,
    answer_by: tokio::time::Instant,
) {
    let Some(channel) = channel else { return };
    let by = answer_by.max(tokio::time::Instant::now() + EPHEMERAL_AT_LEAST);
    match tokio::time::timeout_at(by, slack.client.post_ephemeral(channel, user, message)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "ephemeral Slack message not sent"),
        Err(_) => tracing::warn!("ephemeral Slack message not sent in Slack's window"),
    }
}

/// The least time an ephemeral message is given, however late the answer already is.
const EPHEMERAL_AT_LEAST: std::time::Duration = std::time::Duration::from_millis(200);
