//! Two kinds of bearer: the run token (the run's incarnation and an `HMAC-SHA256` of the
//! run id and incarnation under a key derived from the secret; re-derivable and never
//! stored) for producer calls on one run, and an HS256 JWT (`sub`, `role`, `exp`,
//! optional `project_id`) for creating runs and for operators. Tokens are compared in
//! constant time and never logged.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Agent,
    Operator,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub role: Role,
    pub exp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
}

/// Who is calling, once the bearer has been verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Holds a valid run token for this run.
    Run {
        run_id: String,
        /// The run incarnation the token was issued for.
        incarnation: String,
    },
    Jwt(Claims),
}

impl Caller {
    /// The caller as the access rules see a reader (`tollgate_app::access::may_read`).
    pub fn viewer(&self) -> tollgate_app::access::Viewer<'_> {
        use tollgate_app::access::Viewer;
        match self {
            Caller::Run { incarnation, .. } => Viewer::RunToken { incarnation },
            Caller::Jwt(c) if c.role == Role::Operator => Viewer::Operator {
                project: c.project_id.as_deref(),
            },
            Caller::Jwt(c) => Viewer::Agent {
                sub: &c.sub,
                project: c.project_id.as_deref(),
            },
        }
    }
}

/// Claims an API Gateway JWT authorizer already verified, placed in the request's
/// extensions by the Lambda entry point (only when `TOLLGATE_TRUST_GATEWAY_CLAIMS=1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayClaims(pub Claims);

/// What a request presents: its bearer (if any) and verified gateway claims (if any).
/// Its `Debug` never shows the bearer.
#[derive(Clone, Default)]
pub struct Credentials {
    bearer: Option<Result<String, &'static str>>,
    gateway: Option<Claims>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bearer = match &self.bearer {
            None => "none",
            Some(Ok(_)) => "<redacted>",
            Some(Err(why)) => why,
        };
        f.debug_struct("Credentials")
            .field("bearer", &bearer)
            .field("gateway", &self.gateway)
            .finish()
    }
}

impl Credentials {
    /// The bearer presented, or why it is unusable; `None` without one.
    pub fn bearer_token(&self) -> Option<Result<&str, &'static str>> {
        self.bearer.as_ref().map(|b| b.as_deref().map_err(|e| *e))
    }

    /// A bearer presented another way than `Authorization` (a WebSocket's subprotocol
    /// or query); the same rules judge it.
    pub fn from_token(token: impl Into<String>) -> Self {
        Self {
            bearer: Some(Ok(token.into())),
            gateway: None,
        }
    }

    pub fn from_headers(headers: &HeaderMap) -> Self {
        Self {
            bearer: bearer(headers),
            gateway: None,
        }
    }

    /// A bearer presented some other way than `Authorization` (a WebSocket
    /// subprotocol entry, `?access_token=`); `None` is no credential.
    pub fn from_optional_token(token: Option<&str>) -> Self {
        Self {
            bearer: token.map(|t| match t.trim() {
                "" => Err("empty token"),
                t => Ok(t.to_owned()),
            }),
            gateway: None,
        }
    }

    /// Whether the bearer is shaped as a JWT (a run token never has a dot).
    pub fn is_jwt(&self) -> bool {
        matches!(&self.bearer, Some(Ok(t)) if t.contains('.'))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Credentials {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Self {
            bearer: bearer(&parts.headers),
            gateway: parts.extensions.get::<GatewayClaims>().map(|g| g.0.clone()),
        })
    }
}

pub struct Auth {
    /// Key of the run tokens, derived from the secret. Never the JWT key itself: with one
    /// key, a run id shaped like `header.payload` would get a run token that is a valid
    /// JWT signature (an agent could mint itself an operator token).
    run_key: Vec<u8>,
    /// Key of the HS256 JWTs: the secret itself.
    jwt_key: crate::jwt::Hs256Key,
    /// The longest lifetime a JWT may have (`exp - iat`, or `exp - now` without `iat`),
    /// in seconds; `TOLLGATE_MAX_TOKEN_LIFETIME_SECONDS`, default
    /// [`DEFAULT_MAX_TOKEN_LIFETIME_SECS`].
    max_lifetime: u64,
    /// Operators signed in through an identity provider, when one is configured.
    oidc: Option<std::sync::Arc<crate::oidc::Oidc>>,
}

/// Default maximum JWT lifetime: a day — what `tollgate serve` prints and the longest
/// `tollgate token --ttl` a user is shown in the README.
pub const DEFAULT_MAX_TOKEN_LIFETIME_SECS: u64 = 86_400;

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Auth { secret: <redacted> }")
    }
}

type HmacSha256 = Hmac<Sha256>;

/// `run_key = HMAC-SHA256(secret, RUN_TOKEN_KEY_LABEL)`; run token =
/// `hex(HMAC-SHA256(run_key, run_id))`.
pub const RUN_TOKEN_KEY_LABEL: &[u8] = b"tollgate run-token key v1";

/// `pod_key = HMAC-SHA256(run_key, POD_CREDENTIAL_KEY_LABEL)` (see [`Auth::pod_credential`]).
const POD_CREDENTIAL_KEY_LABEL: &[u8] = b"tollgate pod-credential key v1";

/// `decision_key = HMAC-SHA256(run_key, POD_DECISION_KEY_LABEL)` (see [`Auth::pod_decision_id`]).
const POD_DECISION_KEY_LABEL: &[u8] = b"tollgate pod-decision key v1";

/// `digest_key = HMAC-SHA256(run_key, TOKEN_DIGEST_KEY_LABEL)` (see [`Auth::unbound_run_token`]).
const TOKEN_DIGEST_KEY_LABEL: &[u8] = b"tollgate run-token digest key v1";

/// A run token starts with the run's incarnation: 16 hex digits.
const INCARNATION_HEX: usize = 16;

impl Auth {
    pub fn new(secret: &[u8]) -> Self {
        let mut derive = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
        derive.update(RUN_TOKEN_KEY_LABEL);
        Self {
            run_key: derive.finalize().into_bytes().to_vec(),
            jwt_key: crate::jwt::Hs256Key::new(secret),
            max_lifetime: DEFAULT_MAX_TOKEN_LIFETIME_SECS,
            oidc: None,
        }
    }

    /// Also accepts operator tokens of an OpenID Connect issuer ([`crate::oidc`]).
    pub fn with_oidc(mut self, oidc: crate::oidc::Oidc) -> Self {
        self.oidc = Some(std::sync::Arc::new(oidc));
        self
    }

    /// [`Auth::with_oidc`] with `TOLLGATE_OIDC_*`, when `TOLLGATE_OIDC_ISSUER` is set.
    /// Says once, at startup, how the provider's operators are recognised.
    pub fn with_oidc_from_env(self) -> Result<Self, crate::ConfigError> {
        Ok(match crate::oidc::OidcConfig::from_env()? {
            Some(config) => {
                tracing::info!(
                    issuer = %config.issuer,
                    audience = %config.audience,
                    operators_named = %format!("{}<{}>", crate::oidc::SUBJECT_PREFIX, config.subject_claim),
                    projects = %config.projects,
                    console_sign_in = config.console.is_some(),
                    "operators may sign in through the OIDC provider"
                );
                self.with_oidc(crate::oidc::Oidc::new(config))
            }
            None => self,
        })
    }

    /// The identity provider operators may sign in through, when one is configured.
    pub fn oidc(&self) -> Option<&crate::oidc::Oidc> {
        self.oidc.as_deref()
    }

    /// Whether operators may also sign in through an identity provider.
    pub fn has_oidc(&self) -> bool {
        self.oidc.is_some()
    }

    /// Brings what verifying `creds` needs that is not at hand (an identity provider's
    /// keys). Every router runs this before its handlers, so [`Auth::caller`] — which
    /// never waits on the network — finds the keys; anything that verifies a credential
    /// outside the routers calls it first.
    pub async fn ready(&self, creds: &Credentials) {
        if let (Some(oidc), Some(Ok(token))) = (&self.oidc, &creds.bearer) {
            oidc.ready(token).await;
        }
    }

    /// Refuses JWTs valid for longer than `seconds` (see [`Auth::max_token_lifetime`]).
    pub fn with_max_token_lifetime(mut self, seconds: u64) -> Self {
        self.max_lifetime = seconds;
        self
    }

    /// The longest lifetime a JWT may have here, in seconds.
    pub fn max_token_lifetime(&self) -> u64 {
        self.max_lifetime
    }

    /// `TOLLGATE_MAX_TOKEN_LIFETIME_SECONDS` (whole seconds, at least 60; default a day).
    pub fn max_token_lifetime_from_env() -> Result<u64, crate::ConfigError> {
        match std::env::var("TOLLGATE_MAX_TOKEN_LIFETIME_SECONDS")
            .ok()
            .filter(|v| !v.is_empty())
        {
            None => Ok(DEFAULT_MAX_TOKEN_LIFETIME_SECS),
            Some(v) => v.parse().ok().filter(|s| *s >= 60).ok_or_else(|| {
                crate::ConfigError::Invalid(
                    "TOLLGATE_MAX_TOKEN_LIFETIME_SECONDS must be a whole number of seconds, \
                         at least 60"
                        .into(),
                )
            }),
        }
    }

    fn mac(&self, run_id: &str, incarnation: &str) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.run_key).expect("HMAC takes any key length");
        mac.update(run_id.as_bytes());
        // Runs stored before incarnations existed (empty incarnation) keep their tokens:
        // the MAC of the run id alone, which opens only a head without an incarnation.
        if !incarnation.is_empty() {
            mac.update(b"\0");
            mac.update(incarnation.as_bytes());
        }
        mac
    }

    /// The run token handed out at creation: the run's incarnation (16 hex digits) and
    /// `hex(HMAC-SHA256(run_key, run_id ‖ 0 ‖ incarnation))`. Anyone with the secret can
    /// re-derive it from the head; it is never stored. Binding the incarnation means a
    /// token of a run whose id was later created again does not open the new run.
    pub fn run_token(&self, run_id: &str, incarnation: &str) -> String {
        let mac = hex::encode(self.mac(run_id, incarnation).finalize().into_bytes());
        format!("{incarnation}{mac}")
    }

    /// The credential a pod-per-run AgentHost checks on forwarded decisions
    /// (`Authorization: Bearer`): `hex(HMAC-SHA256(pod_key, run_id ‖ 0 ‖ incarnation))`
    /// under a key derived from the secret for this purpose alone — a pod holding it can
    /// neither act as the run (its token is another MAC) nor mint anything. Handed to the
    /// creating agent with the run; never stored or logged.
    /// The `decisionId` of one operator's decision on one pod card (`parts`: run,
    /// request, verb, scope, operator): the same decision sent again has the same id, and
    /// a pod cannot tell from it who decided (it is a MAC under a key of its own).
    pub fn pod_decision_id(&self, parts: &[&str]) -> String {
        let mut key = HmacSha256::new_from_slice(&self.run_key).expect("HMAC takes any key length");
        key.update(POD_DECISION_KEY_LABEL);
        let decision_key = key.finalize().into_bytes();
        let mut mac = HmacSha256::new_from_slice(&decision_key).expect("HMAC takes any key length");
        for part in parts {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        hex::encode(&mac.finalize().into_bytes()[..16])
    }

    pub fn pod_credential(&self, run_id: &str, incarnation: &str) -> String {
        let mut key = HmacSha256::new_from_slice(&self.run_key).expect("HMAC takes any key length");
        key.update(POD_CREDENTIAL_KEY_LABEL);
        let pod_key = key.finalize().into_bytes();
        let mut mac = HmacSha256::new_from_slice(&pod_key).expect("HMAC takes any key length");
        mac.update(run_id.as_bytes());
        mac.update(b"\0");
        mac.update(incarnation.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// Signs a JWT (used by `tollgate token` and `tollgate serve`).
    pub fn mint_jwt(
        &self,
        sub: &str,
        role: Role,
        ttl_seconds: u64,
        project_id: Option<String>,
    ) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let claims = Claims {
            sub: sub.to_owned(),
            role,
            exp: now + ttl_seconds,
            project_id,
        };
        // With `iat`, so the lifetime is judged from issue to expiry.
        let mut value = serde_json::to_value(&claims).expect("claims serialize to JSON");
        value["iat"] = now.into();
        crate::jwt::encode(&self.jwt_key, &value).expect("claims serialize to JSON")
    }

    fn verify_jwt(&self, token: &str) -> Result<Claims, ApiError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        use crate::jwt::JwtError;
        crate::jwt::decode::<Claims>(&self.jwt_key, token, now, Some(self.max_lifetime))
            .map_err(|e| match e {
                JwtError::Expired => ApiError::unauthorized("token has expired"),
                JwtError::NotYetValid => ApiError::unauthorized("token is not valid yet (nbf)"),
                JwtError::IssuedInFuture => {
                    ApiError::unauthorized("token is issued in the future (iat)")
                }
                JwtError::TooLong => ApiError::unauthorized(format!(
                    "token lifetime is over the maximum of {} s",
                    self.max_lifetime
                )),
                JwtError::Invalid(_) => ApiError::unauthorized("invalid token"),
            })
            .and_then(checked_claims)
            .and_then(own_claims)
    }

    /// Verifies the bearer of a request. `run_id` is the run the route acts on, which a
    /// run token must belong to.
    pub fn caller(&self, creds: &Credentials, run_id: Option<&str>) -> Result<Caller, ApiError> {
        if let Some(claims) = &creds.gateway {
            return Ok(Caller::Jwt(own_claims(checked_claims(claims.clone())?)?));
        }
        let token = match &creds.bearer {
            None => {
                return Err(ApiError::unauthorized(
                    "missing Authorization: Bearer token",
                ))
            }
            Some(Err(why)) => return Err(ApiError::unauthorized(*why)),
            Some(Ok(token)) => token.as_str(),
        };
        if let Some(oidc) = self.oidc.as_ref().filter(|o| o.claims_token(token)) {
            // The issuer's token is verified as the issuer's only: never against the
            // HS256 secret (docs/architecture.md §5).
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default();
            return oidc
                .verify(token, now, self.max_lifetime)
                .map_err(ApiError::from)
                .and_then(checked_claims)
                .map(Caller::Jwt);
        }
        if token.contains('.') {
            return self.verify_jwt(token).map(Caller::Jwt);
        }
        let (incarnation, mac) = match token.split_at_checked(INCARNATION_HEX) {
            _ if token.len() == 64 => ("", token),
            Some((inc, mac)) if inc.bytes().all(|b| b.is_ascii_hexdigit()) => (inc, mac),
            _ => return Err(ApiError::unauthorized("invalid token")),
        };
        let mac = match hex::decode(mac) {
            Ok(b) if b.len() == 32 => b,
            _ => return Err(ApiError::unauthorized("invalid token")),
        };
        match run_id {
            Some(run_id) if self.mac(run_id, incarnation).verify_slice(&mac).is_ok() => {
                Ok(Caller::Run {
                    run_id: run_id.to_owned(),
                    incarnation: incarnation.to_owned(),
                })
            }
            Some(_) => Err(ApiError::forbidden("token is not valid for this run")),
            None => Err(ApiError::forbidden(
                "this route needs a JWT, not a run token",
            )),
        }
    }

    /// A run token presented before its run is named (a WebSocket connection names its
    /// runs later, docs/architecture.md §9): 401 unless it is shaped as a run token;
    /// else its incarnation and a keyed one-way digest of it, which is all that is kept —
    /// [`Auth::run_token_digest_matches`] checks it against a run later. The token itself
    /// is never stored.
    pub fn unbound_run_token(&self, creds: &Credentials) -> Result<(String, String), ApiError> {
        let token = match &creds.bearer {
            None => return Err(ApiError::unauthorized("missing token")),
            Some(Err(why)) => return Err(ApiError::unauthorized(*why)),
            Some(Ok(token)) => token.as_str(),
        };
        let (incarnation, mac) = match token.split_at_checked(INCARNATION_HEX) {
            _ if token.len() == 64 => ("", token),
            Some((inc, mac)) if inc.bytes().all(|b| b.is_ascii_hexdigit()) => (inc, mac),
            _ => return Err(ApiError::unauthorized("invalid token")),
        };
        if !matches!(hex::decode(mac), Ok(b) if b.len() == 32) {
            return Err(ApiError::unauthorized("invalid token"));
        }
        Ok((
            incarnation.to_owned(),
            hex::encode(self.digest_mac(token).finalize().into_bytes()),
        ))
    }

    /// Whether `digest` ([`Auth::unbound_run_token`]) is the digest of `run_id`'s token
    /// for `incarnation` (compared in constant time).
    pub fn run_token_digest_matches(&self, digest: &str, run_id: &str, incarnation: &str) -> bool {
        let Ok(digest) = hex::decode(digest) else {
            return false;
        };
        self.digest_mac(&self.run_token(run_id, incarnation))
            .verify_slice(&digest)
            .is_ok()
    }

    fn digest_mac(&self, token: &str) -> HmacSha256 {
        let mut key = HmacSha256::new_from_slice(&self.run_key).expect("HMAC takes any key length");
        key.update(TOKEN_DIGEST_KEY_LABEL);
        let digest_key = key.finalize().into_bytes();
        let mut mac = HmacSha256::new_from_slice(&digest_key).expect("HMAC takes any key length");
        mac.update(token.as_bytes());
        mac
    }

    /// Producer calls on a run: the run's own token only. Answers the incarnation the
    /// token was issued for (the store refuses writes to any other).
    pub fn require_run_token(&self, creds: &Credentials, run_id: &str) -> Result<String, ApiError> {
        match self.caller(creds, Some(run_id))? {
            Caller::Run { incarnation, .. } => Ok(incarnation),
            Caller::Jwt(_) => Err(ApiError::forbidden("this route needs the run's token")),
        }
    }

    /// A JWT with the given role.
    pub fn require_role(&self, creds: &Credentials, role: Role) -> Result<Claims, ApiError> {
        match self.caller(creds, None)? {
            Caller::Jwt(c) if c.role == role => Ok(c),
            Caller::Jwt(_) => Err(ApiError::forbidden(format!(
                "this route needs the {} role",
                match role {
                    Role::Agent => "agent",
                    Role::Operator => "operator",
                }
            ))),
            Caller::Run { .. } => Err(ApiError::forbidden("this route needs a JWT")),
        }
    }
}

/// The bearer token of `Authorization`, `None` when absent, or why it is unusable.
/// What a WebSocket upgrade offers (docs/architecture.md §9): its `Sec-WebSocket-Protocol`
/// entries, and its credential — the first `bearer.<token>` entry, else `access_token`
/// (the `?access_token=` query value). The one reading of an upgrade's credential: the
/// in-process WebSocket, the API Gateway `$connect` and the credentials layer use it.
pub struct UpgradeOffer<'a> {
    pub protocols: Vec<&'a str>,
    pub token: Option<&'a str>,
}

pub fn upgrade_offer<'a>(
    headers: &'a HeaderMap,
    access_token: Option<&'a str>,
) -> UpgradeOffer<'a> {
    let protocols: Vec<&str> = headers
        .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    let token = protocols
        .iter()
        .find_map(|p| p.strip_prefix(tollgate_protocol::ws::BEARER_PREFIX))
        .or(access_token);
    UpgradeOffer { protocols, token }
}

fn bearer(headers: &HeaderMap) -> Option<Result<String, &'static str>> {
    let value = headers.get(axum::http::header::AUTHORIZATION)?;
    let Ok(value) = value.to_str() else {
        return Some(Err("invalid Authorization header"));
    };
    Some(match value.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim().to_owned())
        }
        _ => Err("Authorization must be `Bearer <token>`"),
    })
}

/// Claims Tollgate cannot tell apart from its own markers are refused:
/// - a `sub` that is empty, or starts with `policy:` — the `decided_by` of a card a
///   standing grant approved, so an operator named so would make a human decision read
///   as an automatic one (and an agent so named would shadow it in audit trails);
/// - a `project_id` claim of `-` or an empty one: storage keys "no project" as `-`, so
///   such a claim would read as every project-less tenant's.
fn checked_claims(claims: Claims) -> Result<Claims, ApiError> {
    if claims.sub.is_empty()
        || claims
            .sub
            .starts_with(tollgate_domain::approval::POLICY_DECIDER_PREFIX)
    {
        return Err(ApiError::unauthorized(format!(
            "sub claim must not be empty or start with {:?}",
            tollgate_domain::approval::POLICY_DECIDER_PREFIX
        )));
    }
    match claims.project_id.as_deref() {
        Some("-") | Some("") => Err(ApiError::unauthorized(
            "project_id claim must not be empty or \"-\"",
        )),
        _ => Ok(claims),
    }
}

/// Tollgate's own tokens (HS256, or an API Gateway authorizer's claims) may not name a
/// subject in the OIDC operators' namespace ([`crate::oidc::SUBJECT_PREFIX`]): an agent or a
/// locally minted operator is never taken for an operator of the identity provider
/// (docs/architecture.md §5).
fn own_claims(claims: Claims) -> Result<Claims, ApiError> {
    if claims.sub.starts_with(crate::oidc::SUBJECT_PREFIX) {
        return Err(ApiError::unauthorized(format!(
            "sub claim must not start with {:?} (the identity provider's operators)",
            crate::oidc::SUBJECT_PREFIX
        )));
    }
    Ok(claims)
}

/// Maps an API Gateway JWT authorizer's claims (strings) to ours: `sub`, the role from
/// the claim named by `TOLLGATE_ROLE_CLAIM` (default `role`), optional `project_id`.
pub fn claims_from_gateway(
    claims: &std::collections::HashMap<String, String>,
    role_claim: &str,
) -> Option<Claims> {
    let role = match claims.get(role_claim).map(String::as_str) {
        Some("agent") => Role::Agent,
        Some("operator") => Role::Operator,
        _ => return None,
    };
    Some(Claims {
        sub: claims.get("sub")?.clone(),
        role,
        exp: claims
            .get("exp")
            .and_then(|e| e.parse().ok())
            .unwrap_or_default(),
        project_id: claims.get("project_id").cloned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderValue, StatusCode};

    fn headers(token: &str) -> Credentials {
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        Credentials::from_headers(&h)
    }

    #[test]
    fn an_unbound_run_token_keeps_only_a_digest_that_matches_its_own_run() {
        let auth = Auth::new(b"0123456789abcdef0123456789abcdef");
        let token = auth.run_token("run-1", "0123456789abcdef");
        let (incarnation, digest) = auth
            .unbound_run_token(&Credentials::from_optional_token(Some(&token)))
            .unwrap();
        assert_eq!(incarnation, "0123456789abcdef");
        assert!(
            !digest.contains(&token[16..]),
            "the token itself is not kept"
        );
        assert!(auth.run_token_digest_matches(&digest, "run-1", &incarnation));
        assert!(!auth.run_token_digest_matches(&digest, "run-2", &incarnation));
        assert!(!auth.run_token_digest_matches(&digest, "run-1", "fedcba9876543210"));
        // Another secret derives other digests.
        let other = Auth::new(b"another-secret-0123456789abcdef-xyz");
        assert!(!other.run_token_digest_matches(&digest, "run-1", &incarnation));
        for bad in [None, Some(""), Some("nope"), Some("0123456789abcdefzz")] {
            let err = auth
                .unbound_run_token(&Credentials::from_optional_token(bad))
                .unwrap_err();
            assert_eq!(err.status, StatusCode::UNAUTHORIZED, "{bad:?}");
        }
    }

    #[test]
    fn run_token_opens_only_its_run() {
        let auth = Auth::new(b"0123456789abcdef0123456789abcdef");
        let t = auth.run_token("run-1", "0123456789abcdef");
        assert_eq!(t.len(), 80);
        assert_eq!(
            auth.require_run_token(&headers(&t), "run-1").unwrap(),
            "0123456789abcdef"
        );
        // Another incarnation under the same MAC is not the same token.
        let forged = format!("fedcba9876543210{}", &t[16..]);
        let err = auth
            .require_run_token(&headers(&forged), "run-1")
            .unwrap_err();
        assert_eq!(err.status, StatusCode::FORBIDDEN);
        let other = auth.require_run_token(&headers(&t), "run-2").unwrap_err();
        assert_eq!(other.status, StatusCode::FORBIDDEN);
        let garbage = auth
            .require_run_token(&headers("nope"), "run-1")
            .unwrap_err();
        assert_eq!(garbage.status, StatusCode::UNAUTHORIZED);
        let missing = auth
            .require_run_token(&Credentials::default(), "run-1")
            .unwrap_err();
        assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn jwt_roles_and_signatures_are_checked() {
        let auth = Auth::new(b"0123456789abcdef0123456789abcdef");
        let op = auth.mint_jwt("alice", Role::Operator, 60, None);
        assert_eq!(
            auth.require_role(&headers(&op), Role::Operator)
                .unwrap()
                .sub,
            "alice"
        );
        assert_eq!(
            auth.require_role(&headers(&op), Role::Agent)
                .unwrap_err()
                .status,
            StatusCode::FORBIDDEN
        );
        let forged = Auth::new(b"another-secret-another-secret-xx").mint_jwt(
            "alice",
            Role::Operator,
            60,
            None,
        );
        assert_eq!(
            auth.require_role(&headers(&forged), Role::Operator)
                .unwrap_err()
                .status,
            StatusCode::UNAUTHORIZED
        );
    }

    #[test]
    fn gateway_claims_stand_in_for_a_bearer() {
        let auth = Auth::new(b"0123456789abcdef0123456789abcdef");
        let map = std::collections::HashMap::from([
            ("sub".to_string(), "bob".to_string()),
            ("role".to_string(), "agent".to_string()),
        ]);
        let claims = claims_from_gateway(&map, "role").unwrap();
        let creds = Credentials {
            bearer: None,
            gateway: Some(claims),
        };
        assert_eq!(auth.require_role(&creds, Role::Agent).unwrap().sub, "bob");
        let no_role = std::collections::HashMap::from([("sub".to_string(), "bob".to_string())]);
        assert!(claims_from_gateway(&no_role, "role").is_none());
    }

    /// A run token must never double as a JWT signature, whatever the run id looks like.
    #[test]
    fn run_tokens_cannot_forge_jwts() {
        use base64::Engine;
        let auth = Auth::new(b"0123456789abcdef0123456789abcdef");
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = b64.encode(br#"{"alg":"HS256"}"#);
        let claims = b64.encode(br#"{"sub":"x","role":"operator","exp":9999999999}"#);
        let run_id = format!("{header}.{claims}");
        let signature = b64.encode(hex::decode(auth.run_token(&run_id, "")).unwrap());
        let forged = format!("{run_id}.{signature}");
        let err = auth
            .require_role(&headers(&forged), Role::Operator)
            .unwrap_err();
        assert_eq!(err.status, StatusCode::UNAUTHORIZED);
    }

    /// Runs stored before incarnations existed keep working with their 64-hex tokens, and
    /// such a token names the empty incarnation, which no new run has.
    #[test]
    fn legacy_run_tokens_name_the_empty_incarnation() {
        let auth = Auth::new(b"0123456789abcdef0123456789abcdef");
        let legacy = auth.run_token("run-1", "");
        assert_eq!(legacy.len(), 64);
        assert_eq!(
            auth.require_run_token(&headers(&legacy), "run-1").unwrap(),
            ""
        );
        let current = auth.run_token("run-1", "0123456789abcdef");
        assert_ne!(&current[16..], legacy.as_str());
    }

    #[test]
    fn credentials_never_print_the_bearer() {
        let creds = headers("s3cr3t-bearer-value");
        let printed = format!("{creds:?} {:#?}", creds);
        assert!(!printed.contains("s3cr3t"), "{printed}");
        assert!(printed.contains("redacted"));
    }

    #[test]
    fn expired_jwt_is_refused() {
        let auth = Auth::new(b"0123456789abcdef0123456789abcdef");
        let claims = Claims {
            sub: "a".into(),
            role: Role::Agent,
            exp: 1_000,
            project_id: None,
        };
        let token = crate::jwt::encode(&auth.jwt_key, &claims).unwrap();
        let err = auth
            .require_role(&headers(&token), Role::Agent)
            .unwrap_err();
        assert_eq!(err.error, "token has expired");
    }
}
