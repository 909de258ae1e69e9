//! Two kinds of bearer: the run token (`HMAC-SHA256(secret, run_id)`, re-derivable and
//! never stored) for producer calls on one run, and an HS256 JWT (`sub`, `role`, `exp`,
//! optional `project_id`) for creating runs and for operators. Tokens are compared in
//! constant time and never logged.

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

pub struct Auth {
    secret: Vec<u8>,
    decoding: DecodingKey,
    encoding: EncodingKey,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Auth { secret: <redacted> }")
    }
}

type HmacSha256 = Hmac<Sha256>;

impl Auth {
    pub fn new(secret: &[u8]) -> Self {
        Self {
            secret: secret.to_vec(),
            decoding: DecodingKey::from_secret(secret).expect("an HMAC key of any length"),
            encoding: EncodingKey::from_secret(secret).expect("an HMAC key of any length"),
        }
    }

    fn mac(&self, run_id: &str) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.secret).expect("HMAC takes any key length");
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
    pub fn caller(&self, headers: &HeaderMap, run_id: Option<&str>) -> Result<Caller, ApiError> {
        let token = bearer(headers)?;
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
    pub fn require_run_token(&self, headers: &HeaderMap, run_id: &str) -> Result<(), ApiError> {
        match self.caller(headers, Some(run_id))? {
            Caller::Run { .. } => Ok(()),
            Caller::Jwt(_) => Err(ApiError::forbidden("this route needs the run's token")),
        }
    }

    /// A JWT with the given role.
    pub fn require_role(&self, headers: &HeaderMap, role: Role) -> Result<Claims, ApiError> {
        match self.caller(headers, None)? {
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

fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| ApiError::unauthorized("missing Authorization: Bearer token"))?;
    let value = value
        .to_str()
        .map_err(|_| ApiError::unauthorized("invalid Authorization header"))?;
    match value.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim())
        }
        _ => Err(ApiError::unauthorized(
            "Authorization must be `Bearer <token>`",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderValue, StatusCode};

    fn headers(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        h
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
            .require_run_token(&HeaderMap::new(), "run-1")
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
