//! The operator console's settings.

use serde::{Deserialize, Serialize};

/// `GET /api/console/config`: who the operator token is and what it may grant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ConsoleConfig {
    /// The token's subject (the console offers scopes beyond `once` only on runs whose
    /// `owner` it is).
    pub sub: String,
    /// The token's project, if it is bound to one.
    pub project_id: Option<String>,
    /// The tools an `always` scope may be granted for.
    pub always_eligible: Vec<String>,
}

/// `GET /api/console/sign-in` (no credentials): how the console may sign an operator in,
/// read before there is a token. Nothing in it is secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ConsoleSignIn {
    /// Sign-in with the identity provider (authorization code + PKCE, a public client),
    /// when configured and its endpoints could be discovered; `null`: a pasted token only.
    pub oidc: Option<ConsoleOidc>,
}

/// The console's sign-in with an OpenID Connect provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ConsoleOidc {
    /// The provider's name, for "Sign in with …".
    pub provider: String,
    /// The issuer (`iss` of the ID token).
    pub issuer: String,
    /// From the issuer's discovery document.
    pub authorization_endpoint: String,
    /// From the issuer's discovery document; the console page may connect to its origin.
    pub token_endpoint: String,
    /// The console's client id at the provider (the ID token's `aud`).
    pub client_id: String,
    /// Space-separated, holding `openid`.
    pub scopes: String,
    /// Where the provider sends the browser back; `null`: the console's own address.
    pub redirect_uri: Option<String>,
}
