//! A test OpenID Connect identity provider on loopback: its discovery document and JWKS
//! (the keys signing tokens here: an ECDSA P-256 key generated per test, a fixed RSA test
//! key from `fixtures/oidc/`), and — for the console's sign-in — an authorization
//! endpoint that consents at once (it redirects back with a code, remembering the PKCE
//! challenge and nonce) and a token endpoint that checks the code verifier against the
//! S256 challenge (a wrong one: 400) and answers an ID token it signs, with the nonce and
//! CORS headers for the console's origin.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair, RsaKeyPair};
use serde_json::{json, Value};
use tollgate_api::oidc::{OidcConfig, OidcProjects};

/// The RSA test key (PKCS#1 DER).
pub const RSA_KEY: &[u8] = include_bytes!("../../fixtures/oidc/test-rsa-2048.der");
/// The audience of the test IdP's tokens (and the console's client id).
pub const AUDIENCE: &str = "tollgate-console";
/// The role that makes an operator (the default `TOLLGATE_OIDC_OPERATOR_ROLE`).
pub const OPERATORS: &str = "tollgate-operators";

pub fn b64(raw: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(raw)
}

pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

enum Key {
    Ec(EcdsaKeyPair),
    Rsa(RsaKeyPair),
}

/// A signing key of the test IdP.
pub struct SigningKey {
    pub kid: String,
    key: Key,
}

impl SigningKey {
    /// A fresh P-256 key (ES256).
    pub fn ec(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        Self {
            kid: kid.into(),
            key: Key::Ec(EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap()),
        }
    }

    /// The fixed RSA test key (RS256).
    pub fn rsa(kid: &str) -> Self {
        Self {
            kid: kid.into(),
            key: Key::Rsa(RsaKeyPair::from_der(RSA_KEY).unwrap()),
        }
    }

    pub fn jwk(&self) -> Value {
        match &self.key {
            Key::Ec(k) => {
                let point = k.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": self.kid, "use": "sig", "alg": "ES256",
                       "x": b64(&point[1..33]), "y": b64(&point[33..])})
            }
            Key::Rsa(k) => {
                let c = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(k.public());
                json!({"kty": "RSA", "kid": self.kid, "use": "sig", "alg": "RS256",
                       "n": b64(&c.n), "e": b64(&c.e)})
            }
        }
    }

    /// The public key's bytes, as an attacker would use them as an HMAC secret.
    pub fn public_bytes(&self) -> Vec<u8> {
        match &self.key {
            Key::Ec(k) => k.public_key().as_ref().to_vec(),
            Key::Rsa(k) => k.public().as_ref().to_vec(),
        }
    }

    pub fn alg(&self) -> &'static str {
        match self.key {
            Key::Ec(_) => "ES256",
            Key::Rsa(_) => "RS256",
        }
    }

    /// `claims` signed with this key under its own `alg` and `kid`.
    pub fn token(&self, claims: &Value) -> String {
        self.token_with(
            json!({"alg": self.alg(), "kid": self.kid, "typ": "JWT"}),
            claims,
        )
    }

    /// `claims` under any `header`, signed with this key's own algorithm.
    pub fn token_with(&self, header: Value, claims: &Value) -> String {
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let rng = SystemRandom::new();
        let sig = match &self.key {
            Key::Ec(k) => k.sign(&rng, input.as_bytes()).unwrap().as_ref().to_vec(),
            Key::Rsa(k) => {
                let mut sig = vec![0; k.public().modulus_len()];
                k.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    input.as_bytes(),
                    &mut sig,
                )
                .unwrap();
                sig
            }
        };
        format!("{input}.{}", b64(&sig))
    }
}

/// An HMAC-SHA256 token under `secret`.
pub fn hs256(header: Value, claims: &Value, secret: &[u8]) -> String {
    let input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    format!(
        "{input}.{}",
        b64(ring::hmac::sign(&key, input.as_bytes()).as_ref())
    )
}

/// What the authorization endpoint remembered for a code.
#[derive(Debug, Clone)]
struct Grant {
    client_id: String,
    redirect_uri: String,
    challenge: String,
    nonce: Option<String>,
}

/// Who signs in at the authorization endpoint, and the console the token endpoint
/// answers (CORS).
struct Login {
    signer: SigningKey,
    subject: String,
    groups: Value,
    console_origin: Mutex<Option<String>>,
    codes: Mutex<HashMap<String, Grant>>,
    /// Token requests refused for a wrong code verifier.
    refused: AtomicUsize,
    /// Token requests answered.
    issued: AtomicUsize,
    /// The authorization endpoint sends back another `state` than it was given.
    tamper_state: AtomicBool,
    /// How long the ID tokens it issues are valid, in seconds.
    lifetime: AtomicUsize,
}

/// The test identity provider: discovery and JWKS on loopback; keys, availability and
/// the count of JWKS fetches under the test's control; with [`Idp::start_login`], also
/// the authorization and token endpoints.
pub struct Idp {
    pub issuer: String,
    jwks: Arc<Mutex<Vec<Value>>>,
    pub down: Arc<AtomicBool>,
    fetches: Arc<AtomicUsize>,
    login: Option<Arc<Login>>,
}

impl Idp {
    /// Discovery and JWKS (publishing `keys`) only.
    pub async fn start(keys: &[&SigningKey]) -> Self {
        Self::serve(keys.iter().map(|k| k.jwk()).collect(), None).await
    }

    /// Also signs operators in: the authorization endpoint consents for `subject` (its
    /// role claim `cognito:groups` = `groups`) at once; ID tokens are signed with
    /// `signer` (published).
    pub async fn start_login(signer: SigningKey, subject: &str, groups: Value) -> Self {
        let jwks = vec![signer.jwk()];
        let login = Arc::new(Login {
            signer,
            subject: subject.into(),
            groups,
            console_origin: Mutex::new(None),
            codes: Mutex::new(HashMap::new()),
            refused: AtomicUsize::new(0),
            issued: AtomicUsize::new(0),
            tamper_state: AtomicBool::new(false),
            lifetime: AtomicUsize::new(600),
        });
        Self::serve(jwks, Some(login)).await
    }

    async fn serve(jwks: Vec<Value>, login: Option<Arc<Login>>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("http://{}", listener.local_addr().unwrap());
        let jwks = Arc::new(Mutex::new(jwks));
        let down = Arc::new(AtomicBool::new(false));
        let fetches = Arc::new(AtomicUsize::new(0));
        let discovery = json!({
            "issuer": issuer,
            "jwks_uri": format!("{issuer}/keys"),
            "authorization_endpoint": format!("{issuer}/authorize"),
            "token_endpoint": format!("{issuer}/token"),
            "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"],
            "id_token_signing_alg_values_supported": ["ES256", "RS256"],
        });
        let (j, d, f) = (jwks.clone(), down.clone(), fetches.clone());
        let mut app = axum::Router::new()
            .route(
                "/.well-known/openid-configuration",
                get(move || async move { axum::Json(discovery) }),
            )
            .route(
                "/keys",
                get(move || async move {
                    f.fetch_add(1, Ordering::SeqCst);
                    if d.load(Ordering::SeqCst) {
                        return StatusCode::SERVICE_UNAVAILABLE.into_response();
                    }
                    let keys = j.lock().unwrap().clone();
                    axum::Json(json!({ "keys": keys })).into_response()
                }),
            );
        if let Some(login) = &login {
            let (a, t, o) = (login.clone(), login.clone(), login.clone());
            let iss = issuer.clone();
            app = app
                .route("/authorize", get(move |uri: Uri| authorize(a.clone(), uri)))
                .route(
                    "/token",
                    axum::routing::post(move |headers: HeaderMap, body: String| {
                        token(t.clone(), iss.clone(), headers, body)
                    })
                    .options(move |headers: HeaderMap| preflight(o.clone(), headers)),
                );
        }
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            issuer,
            jwks,
            down,
            fetches,
            login,
        }
    }

    pub fn publish(&self, key: &SigningKey) {
        self.jwks.lock().unwrap().push(key.jwk());
    }

    /// How many times the JWKS was fetched.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// The token endpoint answers CORS for `origin` (the console's).
    pub fn allow_console(&self, origin: &str) {
        let login = self
            .login
            .as_ref()
            .expect("an IdP started with start_login");
        *login.console_origin.lock().unwrap() = Some(origin.into());
    }

    /// From now on the authorization endpoint sends back a `state` other than the one it
    /// was given (as an attacker's answer would).
    pub fn tamper_state(&self) {
        let login = self
            .login
            .as_ref()
            .expect("an IdP started with start_login");
        login.tamper_state.store(true, Ordering::SeqCst);
    }

    /// The ID tokens issued from now on are valid for `seconds`.
    pub fn token_lifetime(&self, seconds: usize) {
        let login = self
            .login
            .as_ref()
            .expect("an IdP started with start_login");
        login.lifetime.store(seconds, Ordering::SeqCst);
    }

    /// ID tokens the token endpoint issued.
    pub fn issued(&self) -> usize {
        self.login
            .as_ref()
            .map_or(0, |l| l.issued.load(Ordering::SeqCst))
    }

    /// Token requests refused for a code verifier that does not match the challenge.
    pub fn refused_verifiers(&self) -> usize {
        self.login
            .as_ref()
            .map_or(0, |l| l.refused.load(Ordering::SeqCst))
    }

    /// Valid operator claims of this issuer (`groups` as the role claim holds them).
    pub fn claims(&self, sub: &str, groups: Value) -> Value {
        let now = now();
        json!({"iss": self.issuer, "aud": AUDIENCE, "sub": sub, "email": format!("{sub}@example.com"),
               "iat": now, "exp": now + 600, "cognito:groups": groups})
    }

    /// Tollgate's configuration for this issuer (audience [`AUDIENCE`]), its operators'
    /// projects as `projects` says.
    pub fn config(&self, projects: OidcProjects) -> OidcConfig {
        OidcConfig::new(&self.issuer, AUDIENCE, projects)
    }
}

fn query(raw: &str) -> HashMap<String, String> {
    reqwest::Url::parse(&format!("http://query.invalid/?{raw}"))
        .map(|u| u.query_pairs().into_owned().collect())
        .unwrap_or_default()
}

fn oauth_error(status: StatusCode, error: &str) -> Response {
    (status, axum::Json(json!({ "error": error }))).into_response()
}

/// `GET /authorize`: consents at once — redirects to `redirect_uri` with a fresh code and
/// the `state`, remembering the S256 challenge and the nonce.
async fn authorize(login: Arc<Login>, uri: Uri) -> Response {
    let q = query(uri.query().unwrap_or_default());
    let field = |k: &str| q.get(k).cloned().unwrap_or_default();
    if field("response_type") != "code"
        || field("code_challenge_method") != "S256"
        || field("code_challenge").is_empty()
        || field("client_id") != AUDIENCE
        || !field("scope").split(' ').any(|s| s == "openid")
    {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_request");
    }
    let Ok(mut back) = reqwest::Url::parse(&field("redirect_uri")) else {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_request");
    };
    let code = uuid::Uuid::new_v4().to_string();
    login.codes.lock().unwrap().insert(
        code.clone(),
        Grant {
            client_id: field("client_id"),
            redirect_uri: back.to_string(),
            challenge: field("code_challenge"),
            nonce: q.get("nonce").cloned(),
        },
    );
    let mut state = field("state");
    if login.tamper_state.load(Ordering::SeqCst) {
        state.push_str("-tampered");
    }
    back.query_pairs_mut()
        .append_pair("code", &code)
        .append_pair("state", &state);
    (StatusCode::FOUND, [(header::LOCATION, back.to_string())]).into_response()
}

fn cors(login: &Login, headers: &HeaderMap, mut response: Response) -> Response {
    let allowed = login.console_origin.lock().unwrap().clone();
    let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
    if let (Some(allowed), Some(origin)) = (allowed, origin) {
        if allowed == origin {
            let h = response.headers_mut();
            h.insert(
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                HeaderValue::from_str(origin).unwrap(),
            );
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static("content-type, accept"),
            );
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("POST"),
            );
        }
    }
    response
}

async fn preflight(login: Arc<Login>, headers: HeaderMap) -> Response {
    cors(&login, &headers, StatusCode::NO_CONTENT.into_response())
}

/// `POST /token` (form): a code once, for its client and redirect URI, with the verifier
/// whose S256 challenge it was given; answers an ID token with the nonce.
async fn token(login: Arc<Login>, issuer: String, headers: HeaderMap, body: String) -> Response {
    let form = query(&body);
    let field = |k: &str| form.get(k).cloned().unwrap_or_default();
    let answer = (|| {
        if field("grant_type") != "authorization_code" {
            return oauth_error(StatusCode::BAD_REQUEST, "unsupported_grant_type");
        }
        let Some(grant) = login.codes.lock().unwrap().remove(&field("code")) else {
            return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant");
        };
        if grant.client_id != field("client_id") || grant.redirect_uri != field("redirect_uri") {
            return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant");
        }
        let verifier = field("code_verifier");
        let challenge =
            b64(ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes()).as_ref());
        if verifier.len() < 43 || challenge != grant.challenge {
            login.refused.fetch_add(1, Ordering::SeqCst);
            return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant");
        }
        let now = now();
        let mut claims = json!({"iss": issuer, "aud": AUDIENCE, "sub": login.subject,
            "email": format!("{}@example.com", login.subject), "iat": now, "exp": now + login.lifetime.load(Ordering::SeqCst) as u64,
            "cognito:groups": login.groups});
        if let Some(nonce) = grant.nonce {
            claims["nonce"] = json!(nonce);
        }
        login.issued.fetch_add(1, Ordering::SeqCst);
        let mut response = axum::Json(json!({
            "id_token": login.signer.token(&claims),
            "token_type": "Bearer",
            "expires_in": 600,
        }))
        .into_response();
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    })();
    cors(&login, &headers, answer)
}
