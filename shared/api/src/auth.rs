//! Two kinds of bearer: the run token (`HMAC-SHA256` of the run id under a key derived from the secret, re-derivable and
//! never stored) for producer calls on one run, and an HS256 JWT (`sub`, `role`, `exp`,
//! optional `project_id`) for creating runs and for operators. Tokens are compared in
//! constant time and never logged.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use jsonwebtoken::{DecodingKey, EncodingKey, Header, Validation};
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
    },
    Jwt(Claims),
}

/// Claims an API Gateway JWT authorizer already verified, placed in the request's
/// extensions by the Lambda entry point (only when `TOLLGATE_TRUST_GATEWAY_CLAIMS=1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayClaims(pub Claims);

/// What a request presents: its bearer (if any) and verified gateway claims (if any).
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    bearer: Option<Result<String, &'static str>>,
    gateway: Option<Claims>,
}

impl Credentials {
    pub fn from_headers(headers: &HeaderMap) -> Self {
        Self {
            bearer: bearer(headers),
            gateway: None,
        }
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
    decoding: DecodingKey,
    encoding: EncodingKey,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Auth { secret: <redacted> }")
    }
}

type HmacSha256 = Hmac<Sha256>;

/// `run_key = HMAC-SHA256(secret, RUN_TOKEN_KEY_LABEL)`; run token =
/// `hex(HMAC-SHA256(run_key, run_id))`.
pub const RUN_TOKEN_KEY_LABEL: &[u8] = b"tollgate run-token key v1";

impl Auth {
    pub fn new(secret: &[u8]) -> Self {
        let mut derive = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
        derive.update(RUN_TOKEN_KEY_LABEL);
        Self {
            run_key: derive.finalize().into_bytes().to_vec(),
            decoding: DecodingKey::from_secret(secret).expect("an HMAC key of any length"),
            encoding: EncodingKey::from_secret(secret).expect("an HMAC key of any length"),
        }
    }

    fn mac(&self, run_id: &str) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.run_key).expect("HMAC takes any key length");
        mac.update(run_id.as_bytes());
        mac
    }

    /// The run token handed out at creation; anyone with the secret can re-derive it.
    pub fn run_token(&self, run_id: &str) -> String {
        hex::encode(self.mac(run_id).finalize().into_bytes())
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
        jsonwebtoken::encode(&Header::default(), &claims, &self.encoding)
            .expect("HS256 signing cannot fail")
    }

    fn verify_jwt(&self, token: &str) -> Result<Claims, ApiError> {
        let mut validation = Validation::new(jsonwebtoken::Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = 30;
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation)
            .map(|data| data.claims)
            .map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => {
                    ApiError::unauthorized("token has expired")
                }
                _ => ApiError::unauthorized("invalid token"),
            })
    }

    /// Verifies the bearer of a request. `run_id` is the run the route acts on, which a
    /// run token must belong to.
    pub fn caller(&self, creds: &Credentials, run_id: Option<&str>) -> Result<Caller, ApiError> {
        if let Some(claims) = &creds.gateway {
            return Ok(Caller::Jwt(claims.clone()));
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
        if token.contains('.') {
            return self.verify_jwt(token).map(Caller::Jwt);
        }
        let bytes = match hex::decode(token) {
            Ok(b) if b.len() == 32 => b,
            _ => return Err(ApiError::unauthorized("invalid token")),
        };
        match run_id {
            Some(run_id) if self.mac(run_id).verify_slice(&bytes).is_ok() => Ok(Caller::Run {
                run_id: run_id.to_owned(),
            }),
            Some(_) => Err(ApiError::forbidden("token is not valid for this run")),
            None => Err(ApiError::forbidden(
                "this route needs a JWT, not a run token",
            )),
        }
    }

    /// Producer calls on a run: the run's own token only.
    pub fn require_run_token(&self, creds: &Credentials, run_id: &str) -> Result<(), ApiError> {
        match self.caller(creds, Some(run_id))? {
            Caller::Run { .. } => Ok(()),
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
    fn run_token_opens_only_its_run() {
        let auth = Auth::new(b"0123456789abcdef0123456789abcdef");
        let t = auth.run_token("run-1");
        assert_eq!(t.len(), 64);
        assert!(auth.require_run_token(&headers(&t), "run-1").is_ok());
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
        let signature = b64.encode(hex::decode(auth.run_token(&run_id)).unwrap());
        let forged = format!("{run_id}.{signature}");
        let err = auth
            .require_role(&headers(&forged), Role::Operator)
            .unwrap_err();
        assert_eq!(err.status, StatusCode::UNAUTHORIZED);
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
        let token = jsonwebtoken::encode(&Header::default(), &claims, &auth.encoding).unwrap();
        let err = auth
            .require_role(&headers(&token), Role::Agent)
            .unwrap_err();
        assert_eq!(err.error, "token has expired");
    }
}
