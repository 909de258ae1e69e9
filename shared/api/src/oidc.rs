//! Operators signed in through a company identity provider (OpenID Connect): JWTs from
//! one configured issuer, verified against the issuer's published keys (JWKS) with
//! `ring` — RS256 (RSA keys) and ES256 (P-256 keys) only (docs/architecture.md §5).
//!
//! - **Which tokens.** With OIDC configured, a JWT whose header `alg` is not `HS256`, or
//!   whose payload carries an `iss`, is the issuer's and is verified here only: it never
//!   falls back to the HS256 secret (and an `HS256` token naming an issuer is refused
//!   here, so a token "signed" with a public key as an HMAC secret is never accepted).
//! - **Algorithm.** The key is picked by the header's `kid`; the header's `alg` must be
//!   the one the key's type allows (`RSA` → `RS256`, `EC`/`P-256` → `ES256`, and the key's
//!   own `alg` when it names one). `none`, HMAC and every other algorithm are refused
//!   before any key is used: algorithm confusion is impossible by construction.
//! - **Claims.** `iss` exactly the issuer; `aud` the audience or an array holding it;
//!   `exp` required; `nbf` and `iat` honoured; [`crate::jwt::LEEWAY_SECS`] of clock skew
//!   and the same maximum lifetime as Tollgate's own tokens. The operator's name is
//!   `oidc:` and the subject claim (`sub` unless configured) — a namespace Tollgate's own
//!   tokens may not use, so no agent or locally minted operator can share it. The role
//!   comes from the role claim (a string or an array of strings that must hold the
//!   configured operator role).
//! - **Projects.** Always configured explicitly ([`OidcProjects`]): from a project claim
//!   (then required, optionally one of a list), one project for every operator, or every
//!   project (`*`). Neither configured: the configuration is refused at startup.
//! - **Keys.** Fetched over HTTPS (plain HTTP only from a loopback host), from the
//!   configured JWKS URL or the one the issuer's discovery document names; kept for a
//!   TTL; an unknown `kid` fetches again at most once per refetch interval. Verification
//!   itself never waits on the network: [`Oidc::ready`] (run by every router before any
//!   handler) brings the keys a token needs, and [`Oidc::verify`] reads them. Without
//!   keys fetched within the TTL nothing verifies: 503 (the provider cannot be asked, so
//!   the token is neither known good nor known bad; the caller may retry) — fail closed.
//! - **Console sign-in.** With a console client id, the console signs operators in with
//!   the authorization code flow and PKCE ([`ConsoleClient`]); the authorization and
//!   token endpoints come from the issuer's discovery document (cached for the keys'
//!   TTL), `https` only — plain `http` only to a loopback host, and only when the issuer
//!   itself is one.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{Map, Value};

use crate::auth::{Claims, Role};
use crate::{ApiError, ConfigError};

/// Largest JWKS or discovery document read, in bytes.
const MAX_DOCUMENT_BYTES: usize = 256 * 1024;
/// How long one fetch of the keys or the discovery document may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// How OIDC operators are recognised (`TOLLGATE_OIDC_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcConfig {
    /// `TOLLGATE_OIDC_ISSUER`: the exact `iss`.
    pub issuer: String,
    /// `TOLLGATE_OIDC_AUDIENCE`: what `aud` must be or hold.
    pub audience: String,
    /// `TOLLGATE_OIDC_JWKS_URL`; unset: the `jwks_uri` of
    /// `{issuer}/.well-known/openid-configuration`.
    pub jwks_url: Option<String>,
    /// `TOLLGATE_OIDC_ROLE_CLAIM` (default `cognito:groups`): a string or an array of
    /// strings.
    pub role_claim: String,
    /// `TOLLGATE_OIDC_OPERATOR_ROLE` (default `tollgate-operators`): the role claim must
    /// be or hold it.
    pub operator_role: String,
    /// `TOLLGATE_OIDC_SUBJECT_CLAIM` (default `sub`): the operator's name (`decided_by`),
    /// after [`SUBJECT_PREFIX`].
    pub subject_claim: String,
    /// `TOLLGATE_OIDC_PROJECT_CLAIM` / `TOLLGATE_OIDC_PROJECTS`: which projects the
    /// provider's operators act on.
    pub projects: OidcProjects,
    /// `TOLLGATE_OIDC_CONSOLE_*`: the console signs in with the provider.
    pub console: Option<ConsoleClient>,
    /// `TOLLGATE_OIDC_JWKS_TTL_SECONDS` (default 600): how long fetched keys are used.
    pub jwks_ttl: Duration,
    /// `TOLLGATE_OIDC_JWKS_REFETCH_SECONDS` (default 60): the keys are fetched again for
    /// an unknown `kid` at most this often.
    pub refetch_interval: Duration,
}

/// The namespace of OIDC operators' names: `oidc:` and the subject claim's value. Tollgate's
/// own tokens may not name a subject in it (docs/architecture.md §5).
pub const SUBJECT_PREFIX: &str = "oidc:";

/// Which projects the provider's operators act on — never implied (docs/architecture.md §5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OidcProjects {
    /// `TOLLGATE_OIDC_PROJECTS=*`: every operator of the provider acts on every project.
    All,
    /// `TOLLGATE_OIDC_PROJECTS=<project>` (no project claim): every operator of the
    /// provider is bound to this one project.
    One(String),
    /// `TOLLGATE_OIDC_PROJECT_CLAIM`: the claim names the operator's project (a token
    /// without it is refused, 403); with `TOLLGATE_OIDC_PROJECTS=a,b` it must be one of
    /// those (else 403).
    Claim {
        claim: String,
        allowed: Option<Vec<String>>,
    },
}

impl std::fmt::Display for OidcProjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OidcProjects::All => f.write_str("every operator acts on every project"),
            OidcProjects::One(p) => write!(f, "every operator is bound to project {p:?}"),
            OidcProjects::Claim {
                claim,
                allowed: None,
            } => write!(
                f,
                "each operator's project is its {claim:?} claim (required)"
            ),
            OidcProjects::Claim {
                claim,
                allowed: Some(list),
            } => write!(
                f,
                "each operator's project is its {claim:?} claim (required), one of {list:?}"
            ),
        }
    }
}

/// The console's sign-in with the provider: the authorization code flow with PKCE, as a
/// public client (no secret). The console keeps the ID token, whose `aud` is the client
/// id: so the client id must be the configured audience.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleClient {
    /// `TOLLGATE_OIDC_CONSOLE_CLIENT_ID`.
    pub client_id: String,
    /// `TOLLGATE_OIDC_CONSOLE_SCOPES` (default `openid profile email`; must hold `openid`).
    pub scopes: String,
    /// `TOLLGATE_OIDC_CONSOLE_PROVIDER` (default: the issuer's host): "Sign in with …".
    pub provider: String,
    /// `TOLLGATE_OIDC_CONSOLE_REDIRECT_URI`; unset: the console's own address as the
    /// browser sees it (what the provider must have registered either way).
    pub redirect_uri: Option<String>,
}

impl ConsoleClient {
    pub const DEFAULT_SCOPES: &'static str = "openid profile email";

    /// A console client with the default scopes, named after `issuer`'s host.
    pub fn new(client_id: &str, issuer: &str) -> Self {
        let provider = reqwest::Url::parse(issuer)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_else(|| issuer.to_owned());
        Self {
            client_id: client_id.to_owned(),
            scopes: Self::DEFAULT_SCOPES.into(),
            provider,
            redirect_uri: None,
        }
    }
}

/// The endpoints the console signs in with, from the issuer's discovery document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleEndpoints {
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    /// The token endpoint's origin (`scheme://host[:port]`): the console page's policy
    /// lets it connect there.
    pub token_origin: String,
}

impl OidcConfig {
    pub const DEFAULT_ROLE_CLAIM: &'static str = "cognito:groups";
    pub const DEFAULT_OPERATOR_ROLE: &'static str = "tollgate-operators";

    /// A configuration with the defaults for `issuer` and `audience`, its operators'
    /// projects as `projects` says, no console sign-in.
    pub fn new(issuer: &str, audience: &str, projects: OidcProjects) -> Self {
        Self {
            issuer: issuer.to_owned(),
            audience: audience.to_owned(),
            jwks_url: None,
            role_claim: Self::DEFAULT_ROLE_CLAIM.into(),
            operator_role: Self::DEFAULT_OPERATOR_ROLE.into(),
            subject_claim: "sub".into(),
            projects,
            console: None,
            jwks_ttl: Duration::from_secs(600),
            refetch_interval: Duration::from_secs(60),
        }
    }

    /// The configuration from the environment; `None` without `TOLLGATE_OIDC_ISSUER`.
    pub fn from_env() -> Result<Option<Self>, ConfigError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The configuration from `TOLLGATE_OIDC_*` variables as `lookup` reads them.
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, ConfigError> {
        let var = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let Some(issuer) = var("TOLLGATE_OIDC_ISSUER") else {
            return Ok(None);
        };
        let audience = var("TOLLGATE_OIDC_AUDIENCE").ok_or_else(|| {
            ConfigError::Invalid(
                "TOLLGATE_OIDC_AUDIENCE must be set with TOLLGATE_OIDC_ISSUER".into(),
            )
        })?;
        let projects = match (
            var("TOLLGATE_OIDC_PROJECT_CLAIM"),
            var("TOLLGATE_OIDC_PROJECTS").map(|v| {
                v.split(',')
                    .map(|p| p.trim().to_owned())
                    .filter(|p| !p.is_empty())
                    .collect::<Vec<_>>()
            }),
        ) {
            (Some(claim), None) => OidcProjects::Claim {
                claim,
                allowed: None,
            },
            (Some(claim), Some(list)) if list == ["*"] => OidcProjects::Claim {
                claim,
                allowed: None,
            },
            (_, Some(list)) if list.iter().any(|p| p == "*") && list.len() > 1 => {
                return Err(ConfigError::Invalid(
                    "TOLLGATE_OIDC_PROJECTS is either * or a list of projects, not both".into(),
                ))
            }
            (Some(claim), Some(list)) => OidcProjects::Claim {
                claim,
                allowed: Some(list),
            },
            (None, Some(list)) if list == ["*"] => OidcProjects::All,
            (None, Some(list)) if list.len() == 1 => OidcProjects::One(list[0].clone()),
            (None, Some(_)) => return Err(ConfigError::Invalid(
                "TOLLGATE_OIDC_PROJECTS lists several projects: set TOLLGATE_OIDC_PROJECT_CLAIM \
                     to say which one each operator acts on"
                    .into(),
            )),
            (None, None) => {
                return Err(ConfigError::Invalid(
                    "with TOLLGATE_OIDC_ISSUER, say which projects the provider's operators act \
                     on: TOLLGATE_OIDC_PROJECT_CLAIM (the claim naming each operator's project), \
                     or TOLLGATE_OIDC_PROJECTS=<project> (all bound to one), or \
                     TOLLGATE_OIDC_PROJECTS=* (every operator of the provider acts on every \
                     project)"
                        .into(),
                ))
            }
        };
        let mut config = Self::new(issuer.trim(), audience.trim(), projects);
        config.jwks_url = var("TOLLGATE_OIDC_JWKS_URL");
        if let Some(v) = var("TOLLGATE_OIDC_ROLE_CLAIM") {
            config.role_claim = v;
        }
        if let Some(v) = var("TOLLGATE_OIDC_OPERATOR_ROLE") {
            config.operator_role = v;
        }
        if let Some(v) = var("TOLLGATE_OIDC_SUBJECT_CLAIM") {
            config.subject_claim = v;
        }
        if let Some(client_id) = var("TOLLGATE_OIDC_CONSOLE_CLIENT_ID") {
            let client_id = client_id.trim().to_owned();
            if client_id != config.audience {
                return Err(ConfigError::Invalid(
                    "TOLLGATE_OIDC_CONSOLE_CLIENT_ID must be TOLLGATE_OIDC_AUDIENCE: the console \
                     signs in with the provider's ID token, whose aud is the client id"
                        .into(),
                ));
            }
            let mut console = ConsoleClient::new(&client_id, &config.issuer);
            if let Some(v) = var("TOLLGATE_OIDC_CONSOLE_SCOPES") {
                if !v.split_whitespace().any(|s| s == "openid") {
                    return Err(ConfigError::Invalid(
                        "TOLLGATE_OIDC_CONSOLE_SCOPES must hold openid (the console needs an ID token)"
                            .into(),
                    ));
                }
                console.scopes = v.split_whitespace().collect::<Vec<_>>().join(" ");
            }
            if let Some(v) = var("TOLLGATE_OIDC_CONSOLE_PROVIDER") {
                console.provider = v.trim().to_owned();
            }
            if let Some(v) = var("TOLLGATE_OIDC_CONSOLE_REDIRECT_URI") {
                fetchable(v.trim()).map_err(|why| {
                    ConfigError::Invalid(format!("TOLLGATE_OIDC_CONSOLE_REDIRECT_URI: {why}"))
                })?;
                console.redirect_uri = Some(v.trim().to_owned());
            }
            config.console = Some(console);
        }
        let seconds = |name: &str, default: Duration| -> Result<Duration, ConfigError> {
            match var(name) {
                None => Ok(default),
                Some(v) => v.parse().map(Duration::from_secs).map_err(|_| {
                    ConfigError::Invalid(format!("{name} must be a whole number of seconds"))
                }),
            }
        };
        config.jwks_ttl = seconds("TOLLGATE_OIDC_JWKS_TTL_SECONDS", config.jwks_ttl)?;
        config.refetch_interval = seconds(
            "TOLLGATE_OIDC_JWKS_REFETCH_SECONDS",
            config.refetch_interval,
        )?;
        for url in std::iter::once(&config.issuer).chain(config.jwks_url.as_ref()) {
            fetchable(url).map_err(|why| ConfigError::Invalid(format!("{url}: {why}")))?;
        }
        Ok(Some(config))
    }
}

/// Whether `url` may be fetched: `https://`, or `http://` to a loopback host.
fn fetchable(url: &str) -> Result<reqwest::Url, &'static str> {
    let parsed = reqwest::Url::parse(url).map_err(|_| "not a URL")?;
    match parsed.scheme() {
        "https" => Ok(parsed),
        "http" => {
            let host = parsed.host_str().unwrap_or_default();
            let loopback = host.eq_ignore_ascii_case("localhost")
                || host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            if loopback {
                Ok(parsed)
            } else {
                Err("must be https (plain http only to a loopback host)")
            }
        }
        _ => Err("must be https (plain http only to a loopback host)"),
    }
}

/// The algorithms accepted, each tied to one key type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alg {
    Rs256,
    Es256,
}

impl Alg {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "RS256" => Some(Alg::Rs256),
            "ES256" => Some(Alg::Es256),
            _ => None,
        }
    }
}

/// A verification key of the issuer.
#[derive(Clone)]
enum PublicKey {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// The uncompressed P-256 point `04 ‖ x ‖ y`.
    P256(Vec<u8>),
}

impl PublicKey {
    fn alg(&self) -> Alg {
        match self {
            PublicKey::Rsa { .. } => Alg::Rs256,
            PublicKey::P256(_) => Alg::Es256,
        }
    }

    fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        use ring::signature;
        match self {
            PublicKey::Rsa { n, e } => signature::RsaPublicKeyComponents { n, e }
                .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, signature)
                .is_ok(),
            PublicKey::P256(point) => {
                signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(message, signature)
                    .is_ok()
            }
        }
    }

    /// A JWK this verifier can use: `RSA` (`n`, `e`) or `EC` on `P-256` (`x`, `y`), not
    /// meant for encryption only, its `alg` (when named) the one its type allows.
    /// Anything else is skipped.
    fn from_jwk(jwk: &Map<String, Value>) -> Option<(String, Self)> {
        let text = |k: &str| jwk.get(k).and_then(Value::as_str);
        let bytes = |k: &str| text(k).and_then(|v| URL_SAFE_NO_PAD.decode(v).ok());
        let kid = text("kid")?.to_owned();
        if text("use").is_some_and(|u| u != "sig") {
            return None;
        }
        let key = match text("kty")? {
            "RSA" => PublicKey::Rsa {
                n: bytes("n")?,
                e: bytes("e")?,
            },
            "EC" if text("crv") == Some("P-256") => {
                let (x, y) = (bytes("x")?, bytes("y")?);
                if x.len() != 32 || y.len() != 32 {
                    return None;
                }
                let mut point = vec![4];
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                PublicKey::P256(point)
            }
            _ => return None,
        };
        match text("alg") {
            Some(alg) if Alg::parse(alg) != Some(key.alg()) => None,
            _ => Some((kid, key)),
        }
    }
}

/// The keys as last fetched.
#[derive(Default)]
struct Keys {
    by_kid: HashMap<String, PublicKey>,
    /// When the keys were last fetched successfully.
    fetched_at: Option<Instant>,
    /// When a fetch was last tried (successful or not).
    tried_at: Option<Instant>,
    /// The JWKS URL discovery named (kept once found).
    discovered_url: Option<String>,
}

/// Why an OIDC token was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OidcError {
    /// Not a valid token of the issuer (401); the text names the check (for logs).
    Invalid(&'static str),
    Expired,
    NotYetValid,
    IssuedInFuture,
    TooLong,
    /// A valid token of the issuer that does not make its holder an operator (403).
    NotOperator(&'static str),
    /// The issuer's keys could not be had within their TTL (503).
    KeysUnavailable,
}

impl From<OidcError> for ApiError {
    fn from(e: OidcError) -> Self {
        match e {
            OidcError::Invalid(_) => ApiError::unauthorized("invalid token"),
            OidcError::Expired => ApiError::unauthorized("token has expired"),
            OidcError::NotYetValid => ApiError::unauthorized("token is not valid yet (nbf)"),
            OidcError::IssuedInFuture => {
                ApiError::unauthorized("token is issued in the future (iat)")
            }
            OidcError::TooLong => {
                ApiError::unauthorized("token lifetime is over the maximum this server accepts")
            }
            OidcError::NotOperator(why) => ApiError::forbidden(why),
            OidcError::KeysUnavailable => ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "the identity provider's keys cannot be fetched now; retry",
            ),
        }
    }
}

/// The verifier of one issuer's tokens, with its key cache.
pub struct Oidc {
    config: OidcConfig,
    http: reqwest::Client,
    keys: RwLock<Keys>,
    /// One fetch at a time; the others wait for it and read its keys.
    fetching: tokio::sync::Mutex<()>,
    /// The console's endpoints as last discovered, and when.
    endpoints: RwLock<Option<(Instant, ConsoleEndpoints)>>,
    /// When discovering them last failed: not tried again within the refetch interval,
    /// so a provider that is down does not hold up every console page.
    endpoints_failed_at: RwLock<Option<Instant>>,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oidc")
            .field("issuer", &self.config.issuer)
            .finish()
    }
}

/// A token split and its header and payload decoded, nothing verified.
struct Parts<'a> {
    header: Map<String, Value>,
    payload: Map<String, Value>,
    signing_input: &'a str,
    signature: &'a str,
}

fn split(token: &str) -> Option<Parts<'_>> {
    let mut it = token.split('.');
    let (h, p, s) = (it.next()?, it.next()?, it.next()?);
    if it.next().is_some() {
        return None;
    }
    let object = |b64: &str| -> Option<Map<String, Value>> {
        let raw = URL_SAFE_NO_PAD.decode(b64).ok()?;
        match serde_json::from_slice(&raw).ok()? {
            Value::Object(m) => Some(m),
            _ => None,
        }
    };
    Some(Parts {
        header: object(h)?,
        payload: object(p)?,
        signing_input: &token[..h.len() + 1 + p.len()],
        signature: s,
    })
}

impl Oidc {
    pub fn new(config: OidcConfig) -> Self {
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Self {
            config,
            http,
            keys: RwLock::new(Keys::default()),
            fetching: tokio::sync::Mutex::new(()),
            endpoints: RwLock::new(None),
            endpoints_failed_at: RwLock::new(None),
        }
    }

    /// The discovery document's address.
    fn discovery_url(&self) -> String {
        format!(
            "{}/.well-known/openid-configuration",
            self.config.issuer.trim_end_matches('/')
        )
    }

    /// Whether an address the discovery document names may be used: `https`, or plain
    /// `http` to a loopback host when the issuer itself is plain `http` (a local issuer:
    /// a discovered address may not point a deployed function, or an operator's browser,
    /// at loopback services unless the issuer itself is one).
    fn discovered_ok(&self, uri: &str) -> bool {
        uri.starts_with("https://")
            || (self.config.issuer.starts_with("http://") && fetchable(uri).is_ok())
    }

    /// The authorization and token endpoints the console signs in with, from the
    /// issuer's discovery document (fetched again after the keys' TTL). `None` without a
    /// console client; an error when the document cannot be had or names an endpoint
    /// that is not https (the console then offers no sign-in with the provider).
    pub async fn console_endpoints(&self) -> Option<Result<ConsoleEndpoints, String>> {
        self.config.console.as_ref()?;
        if let Some((at, endpoints)) = &*self.endpoints.read().unwrap_or_else(|e| e.into_inner()) {
            if at.elapsed() < self.config.jwks_ttl {
                return Some(Ok(endpoints.clone()));
            }
        }
        let failed_at = *self
            .endpoints_failed_at
            .read()
            .unwrap_or_else(|e| e.into_inner());
        if failed_at.is_some_and(|at| at.elapsed() < self.config.refetch_interval) {
            return Some(Err("the discovery failed moments ago".into()));
        }
        let found = async {
            let doc = self.get_json(&self.discovery_url()).await?;
            let endpoint = |name: &str| -> Result<reqwest::Url, String> {
                let uri = doc
                    .get(name)
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("the discovery document names no {name}"))?;
                if !self.discovered_ok(uri) {
                    return Err(format!("the discovered {name} must be https"));
                }
                reqwest::Url::parse(uri).map_err(|_| format!("the discovered {name} is not a URL"))
            };
            let authorization = endpoint("authorization_endpoint")?;
            let token = endpoint("token_endpoint")?;
            Ok::<_, String>(ConsoleEndpoints {
                authorization_endpoint: authorization.to_string(),
                token_origin: token.origin().ascii_serialization(),
                token_endpoint: token.to_string(),
            })
        }
        .await;
        match &found {
            Ok(endpoints) => {
                *self.endpoints.write().unwrap_or_else(|e| e.into_inner()) =
                    Some((Instant::now(), endpoints.clone()))
            }
            Err(why) => {
                *self
                    .endpoints_failed_at
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                tracing::warn!(why = %why, "the identity provider's endpoints could not be discovered")
            }
        }
        Some(found)
    }

    pub fn config(&self) -> &OidcConfig {
        &self.config
    }

    /// Whether `token` is one for this verifier (never for the HS256 secret): a JWT whose
    /// header `alg` is not `HS256`, or whose payload names an issuer.
    pub fn claims_token(&self, token: &str) -> bool {
        match split(token) {
            Some(parts) => {
                parts.header.get("alg").and_then(Value::as_str) != Some("HS256")
                    || parts.payload.contains_key("iss")
            }
            // Not a JWT at all: the HS256 path refuses it.
            None => false,
        }
    }

    /// Makes sure the keys `token` needs are here, when it is this issuer's: fetches them
    /// when they are older than the TTL, or when its `kid` is unknown and the last fetch
    /// is at least the refetch interval old. A failed fetch leaves the keys as they were
    /// ([`Oidc::verify`] then decides). Never fails.
    pub async fn ready(&self, token: &str) {
        let Some(parts) = split(token) else { return };
        if parts.payload.get("iss").and_then(Value::as_str) != Some(self.config.issuer.as_str()) {
            return;
        }
        let Some(kid) = parts.header.get("kid").and_then(Value::as_str) else {
            return;
        };
        if !self.wants_fetch(kid) {
            return;
        }
        let _one = self.fetching.lock().await;
        // Another request may have fetched meanwhile.
        if !self.wants_fetch(kid) {
            return;
        }
        let fetched = self.fetch().await;
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        keys.tried_at = Some(Instant::now());
        match fetched {
            Ok((url, by_kid)) => {
                keys.by_kid = by_kid;
                keys.fetched_at = Some(Instant::now());
                if self.config.jwks_url.is_none() {
                    keys.discovered_url = Some(url);
                }
            }
            Err(why) => {
                tracing::warn!(why = %why, "the identity provider's keys could not be fetched")
            }
        }
    }

    fn wants_fetch(&self, kid: &str) -> bool {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        let fresh = keys
            .fetched_at
            .is_some_and(|at| at.elapsed() < self.config.jwks_ttl);
        let may_retry = keys
            .tried_at
            .is_none_or(|at| at.elapsed() >= self.config.refetch_interval);
        if !fresh {
            // Stale or never fetched: fetch — though, while the provider fails, not
            // more often than the refetch interval.
            return may_retry || keys.tried_at == keys.fetched_at;
        }
        !keys.by_kid.contains_key(kid) && may_retry
    }

    async fn fetch(&self) -> Result<(String, HashMap<String, PublicKey>), String> {
        let known = self
            .keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .discovered_url
            .clone();
        let url = match self.config.jwks_url.clone().or(known) {
            Some(url) => url,
            None => {
                let doc = self.get_json(&self.discovery_url()).await?;
                let uri = doc
                    .get("jwks_uri")
                    .and_then(Value::as_str)
                    .ok_or("the discovery document names no jwks_uri")?;
                if !self.discovered_ok(uri) {
                    return Err("the discovered jwks_uri must be https".into());
                }
                uri.to_owned()
            }
        };
        let jwks = self.get_json(&url).await?;
        let by_kid = jwks
            .get("keys")
            .and_then(Value::as_array)
            .ok_or("the JWKS has no keys array")?
            .iter()
            .filter_map(Value::as_object)
            .filter_map(PublicKey::from_jwk)
            .collect();
        Ok((url, by_kid))
    }

    async fn get_json(&self, url: &str) -> Result<Map<String, Value>, String> {
        let url = fetchable(url).map_err(|why| format!("{url}: {why}"))?;
        let mut answer = self
            .http
            .get(url.clone())
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if !answer.status().is_success() {
            return Err(format!("{url}: HTTP {}", answer.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = answer.chunk().await.map_err(|e| format!("{url}: {e}"))? {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_DOCUMENT_BYTES {
                return Err(format!("{url}: larger than {MAX_DOCUMENT_BYTES} bytes"));
            }
        }
        match serde_json::from_slice(&body) {
            Ok(Value::Object(m)) => Ok(m),
            _ => Err(format!("{url}: not a JSON object")),
        }
    }

    /// Verifies `token` (one [`Oidc::claims_token`] claims) against the keys at hand, at
    /// `now` (seconds), with `max_lifetime` as for Tollgate's own tokens.
    pub fn verify(&self, token: &str, now: u64, max_lifetime: u64) -> Result<Claims, OidcError> {
        let parts = split(token).ok_or(OidcError::Invalid("shape"))?;
        // The algorithm decides nothing by itself: it must be one we accept, and the
        // key's own (below).
        let alg = parts
            .header
            .get("alg")
            .and_then(Value::as_str)
            .and_then(Alg::parse)
            .ok_or(OidcError::Invalid("alg"))?;
        let kid = parts
            .header
            .get("kid")
            .and_then(Value::as_str)
            .ok_or(OidcError::Invalid("kid"))?;
        // Another issuer's token is refused whatever the keys (checked again once signed).
        if parts.payload.get("iss").and_then(Value::as_str) != Some(self.config.issuer.as_str()) {
            return Err(OidcError::Invalid("iss"));
        }
        let key = {
            let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
            let fresh = keys
                .fetched_at
                .is_some_and(|at| at.elapsed() < self.config.jwks_ttl);
            if !fresh {
                return Err(OidcError::KeysUnavailable);
            }
            keys.by_kid
                .get(kid)
                .cloned()
                .ok_or(OidcError::Invalid("unknown kid"))?
        };
        if key.alg() != alg {
            return Err(OidcError::Invalid("alg does not match the key"));
        }
        let signature = URL_SAFE_NO_PAD
            .decode(parts.signature)
            .map_err(|_| OidcError::Invalid("signature encoding"))?;
        if !key.verify(parts.signing_input.as_bytes(), &signature) {
            return Err(OidcError::Invalid("signature"));
        }
        let claims = parts.payload;
        let text = |k: &str| claims.get(k).and_then(Value::as_str);
        if text("iss") != Some(self.config.issuer.as_str()) {
            return Err(OidcError::Invalid("iss"));
        }
        let audience_ok = match claims.get("aud") {
            Some(Value::String(aud)) => *aud == self.config.audience,
            Some(Value::Array(auds)) => auds
                .iter()
                .any(|a| a.as_str() == Some(self.config.audience.as_str())),
            _ => false,
        };
        if !audience_ok {
            return Err(OidcError::Invalid("aud"));
        }
        use crate::jwt::JwtError;
        let exp =
            crate::jwt::check_times(&claims, now, Some(max_lifetime)).map_err(|e| match e {
                JwtError::Expired => OidcError::Expired,
                JwtError::NotYetValid => OidcError::NotYetValid,
                JwtError::IssuedInFuture => OidcError::IssuedInFuture,
                JwtError::TooLong => OidcError::TooLong,
                JwtError::Invalid(why) => OidcError::Invalid(why),
            })?;
        let sub = text(&self.config.subject_claim)
            .filter(|s| !s.is_empty())
            .ok_or(OidcError::Invalid("subject claim"))?;
        let operator = match claims.get(&self.config.role_claim) {
            Some(Value::String(role)) => *role == self.config.operator_role,
            Some(Value::Array(roles)) => roles
                .iter()
                .any(|r| r.as_str() == Some(self.config.operator_role.as_str())),
            _ => false,
        };
        if !operator {
            return Err(OidcError::NotOperator(
                "the token's role claim does not hold the operator role",
            ));
        }
        let project_id = match &self.config.projects {
            OidcProjects::All => None,
            OidcProjects::One(project) => Some(project.clone()),
            OidcProjects::Claim { claim, allowed } => {
                let project = text(claim).ok_or(OidcError::NotOperator(
                    "the token has no project claim; operators here belong to a project",
                ))?;
                if allowed
                    .as_ref()
                    .is_some_and(|list| !list.iter().any(|p| p == project))
                {
                    return Err(OidcError::NotOperator(
                        "the token's project is not one this provider's operators may act on",
                    ));
                }
                Some(project.to_owned())
            }
        };
        Ok(Claims {
            sub: format!("{SUBJECT_PREFIX}{sub}"),
            role: Role::Operator,
            exp,
            project_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_or_loopback_http_is_fetched() {
        for ok in [
            "https://idp.example.com/.well-known/jwks.json",
            "http://127.0.0.1:8080/jwks",
            "http://localhost/jwks",
            "http://[::1]:9/jwks",
        ] {
            assert!(fetchable(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://idp.example.com/jwks",
            "http://10.0.0.1/jwks",
            "ftp://127.0.0.1/jwks",
            "file:///etc/passwd",
            "not a url",
        ] {
            assert!(fetchable(bad).is_err(), "{bad}");
        }
    }

    fn vars(pairs: &[(&str, &str)]) -> Result<Option<OidcConfig>, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        OidcConfig::from_vars(|name| map.get(name).cloned())
    }

    const ISSUER: (&str, &str) = ("TOLLGATE_OIDC_ISSUER", "https://idp.example.com");
    const AUDIENCE: (&str, &str) = ("TOLLGATE_OIDC_AUDIENCE", "console-app");

    #[test]
    fn the_projects_of_the_providers_operators_are_never_implied() {
        assert_eq!(vars(&[]).unwrap(), None);
        let err = vars(&[ISSUER, AUDIENCE]).unwrap_err().to_string();
        assert!(err.contains("TOLLGATE_OIDC_PROJECT_CLAIM"), "{err}");
        assert!(err.contains("TOLLGATE_OIDC_PROJECTS=*"), "{err}");
        let projects = |extra: &[(&str, &str)]| {
            let mut all = vec![ISSUER, AUDIENCE];
            all.extend_from_slice(extra);
            vars(&all).map(|c| c.unwrap().projects)
        };
        assert_eq!(
            projects(&[("TOLLGATE_OIDC_PROJECTS", "*")]).unwrap(),
            OidcProjects::All
        );
        assert_eq!(
            projects(&[("TOLLGATE_OIDC_PROJECTS", " p-1 ")]).unwrap(),
            OidcProjects::One("p-1".into())
        );
        assert!(projects(&[("TOLLGATE_OIDC_PROJECTS", "p-1,p-2")]).is_err());
        assert!(projects(&[("TOLLGATE_OIDC_PROJECTS", "*,p-2")]).is_err());
        assert_eq!(
            projects(&[("TOLLGATE_OIDC_PROJECT_CLAIM", "custom:project")]).unwrap(),
            OidcProjects::Claim {
                claim: "custom:project".into(),
                allowed: None
            }
        );
        assert_eq!(
            projects(&[
                ("TOLLGATE_OIDC_PROJECT_CLAIM", "custom:project"),
                ("TOLLGATE_OIDC_PROJECTS", "p-1, p-2")
            ])
            .unwrap(),
            OidcProjects::Claim {
                claim: "custom:project".into(),
                allowed: Some(vec!["p-1".into(), "p-2".into()])
            }
        );
    }

    #[test]
    fn the_console_client_is_the_audience_and_asks_for_an_id_token() {
        let base = [ISSUER, AUDIENCE, ("TOLLGATE_OIDC_PROJECTS", "*")];
        let with = |extra: &[(&str, &str)]| {
            let mut all = base.to_vec();
            all.extend_from_slice(extra);
            vars(&all).map(|c| c.unwrap().console)
        };
        assert_eq!(with(&[]).unwrap(), None);
        let console = with(&[("TOLLGATE_OIDC_CONSOLE_CLIENT_ID", "console-app")])
            .unwrap()
            .unwrap();
        assert_eq!(
            (console.provider.as_str(), console.scopes.as_str()),
            ("idp.example.com", "openid profile email")
        );
        assert!(with(&[("TOLLGATE_OIDC_CONSOLE_CLIENT_ID", "another-app")]).is_err());
        assert!(with(&[
            ("TOLLGATE_OIDC_CONSOLE_CLIENT_ID", "console-app"),
            ("TOLLGATE_OIDC_CONSOLE_SCOPES", "email profile")
        ])
        .is_err());
        assert!(with(&[
            ("TOLLGATE_OIDC_CONSOLE_CLIENT_ID", "console-app"),
            (
                "TOLLGATE_OIDC_CONSOLE_REDIRECT_URI",
                "http://console.example.com/console"
            )
        ])
        .is_err());
    }

    #[test]
    fn discovered_endpoints_are_https_unless_the_issuer_is_a_local_one() {
        let remote = Oidc::new(OidcConfig::new(
            "https://idp.example.com",
            "a",
            OidcProjects::All,
        ));
        assert!(remote.discovered_ok("https://idp.example.com/token"));
        assert!(!remote.discovered_ok("http://127.0.0.1:9/token"));
        assert!(!remote.discovered_ok("http://idp.example.com/token"));
        let local = Oidc::new(OidcConfig::new(
            "http://127.0.0.1:8080",
            "a",
            OidcProjects::All,
        ));
        assert!(local.discovered_ok("http://127.0.0.1:9/token"));
        assert!(local.discovered_ok("https://idp.example.com/token"));
        assert!(!local.discovered_ok("http://idp.example.com/token"));
    }

    #[test]
    fn a_jwk_is_used_only_for_the_algorithm_its_type_allows() {
        let ec = serde_json::json!({"kty": "EC", "crv": "P-256", "kid": "a",
            "x": URL_SAFE_NO_PAD.encode([1u8; 32]), "y": URL_SAFE_NO_PAD.encode([2u8; 32])});
        let (_, key) = PublicKey::from_jwk(ec.as_object().unwrap()).unwrap();
        assert_eq!(key.alg(), Alg::Es256);
        let mut lying = ec.as_object().unwrap().clone();
        lying.insert("alg".into(), "RS256".into());
        assert!(PublicKey::from_jwk(&lying).is_none());
        let oct = serde_json::json!({"kty": "oct", "kid": "h", "k": "c2VjcmV0"});
        assert!(PublicKey::from_jwk(oct.as_object().unwrap()).is_none());
        let p384 = serde_json::json!({"kty": "EC", "crv": "P-384", "kid": "b",
            "x": URL_SAFE_NO_PAD.encode([1u8; 48]), "y": URL_SAFE_NO_PAD.encode([2u8; 48])});
        assert!(PublicKey::from_jwk(p384.as_object().unwrap()).is_none());
    }
}
