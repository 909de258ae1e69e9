//! The operator console: one self-contained page (`GET /console`, its script at
//! `GET /console.js`) that reattaches to the open approval cards, follows their runs'
//! streams and decides them (seed 003's card lifecycle), plus the small JSON route it
//! reads its settings from (`GET /api/console/config`). Served by the `replay`
//! functions (and so by `tollgate serve`).
//!
//! The page is served with a strict Content-Security-Policy: nothing from another
//! origin, no inline script (the script is `/console.js`, same origin), the one inline
//! `<style>` allowed by its SHA-256 hash, no forms that submit anywhere, no framing,
//! Trusted Types enforced (the script writes no HTML, only text nodes). Every answer is
//! `cache-control: no-store`.
//!
//! With the identity provider's console sign-in configured ([`crate::oidc::ConsoleClient`]),
//! `GET /api/console/sign-in` (public) names its authorization and token endpoints, and
//! the page's policy lets the script connect to exactly the token endpoint's origin (the
//! code exchange); the sign-in itself is a top-level navigation to the authorization
//! endpoint (docs/architecture.md §5).
//!
//! What agents wrote (tool names, URLs, intentions, messages) is shown as text with
//! every bidi control and invisible character as a visible `<U+…>` marker, and a card's
//! URL with the host a URL parser finds in it shown apart. The script accepts only
//! `text/event-stream` answers to its streams (lines up to 1 MiB) and JSON answers to its
//! API calls; anything else counts as a failure and is retried after a backoff.

use std::sync::LazyLock;

use axum::extract::State;
use axum::http::{header, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::auth::{Credentials, Role};
use crate::{ApiError, Deps};

/// The page: markup and its one inline `<style>`.
const PAGE: &str = include_str!("../assets/console/console.html");
/// The page's script, served from the same origin.
const SCRIPT: &str = include_str!("../assets/console/console.js");

/// The console's routes (mounted in the `Replay` set).
pub fn routes() -> Router<Deps> {
    Router::new()
        .route("/console", get(page))
        .route("/console.js", get(script))
        .route("/api/console/config", get(config))
        .route("/api/console/sign-in", get(sign_in))
}

/// The text of the page's `<style>` element (exactly what the browser hashes).
fn inline_style(page: &str) -> &str {
    let start = page.find("<style>").map(|i| i + "<style>".len());
    let end = page.find("</style>");
    match (start, end) {
        (Some(start), Some(end)) if start <= end => &page[start..end],
        _ => "",
    }
}

/// `'sha256-…'` of a source text, as CSP hash sources are written.
fn csp_hash(source: &str) -> String {
    let digest = Sha256::digest(source.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// The page's policy: same-origin script and requests only, the inline style by hash.
static PAGE_CSP: LazyLock<String> = LazyLock::new(|| page_csp(None));

/// The page's policy; with `token_origin` (the identity provider's token endpoint's
/// exact origin, `scheme://host[:port]`), the script may also connect there.
fn page_csp(token_origin: Option<&str>) -> String {
    let connect = match token_origin {
        Some(origin) => format!("connect-src 'self' {origin}"),
        None => "connect-src 'self'".to_owned(),
    };
    [
        "default-src 'none'".to_owned(),
        "script-src 'self'".to_owned(),
        format!("style-src {}", csp_hash(inline_style(PAGE))),
        connect,
        "img-src data:".to_owned(),
        "base-uri 'none'".to_owned(),
        "form-action 'none'".to_owned(),
        "frame-ancestors 'none'".to_owned(),
        "require-trusted-types-for 'script'".to_owned(),
        "trusted-types 'none'".to_owned(),
    ]
    .join("; ")
}

/// A token endpoint origin as a CSP source: only `scheme://host[:port]` of a URL parser's
/// serialization, so nothing in it can end the directive or add a source.
fn csp_origin(origin: &str) -> Option<&str> {
    let ok = (origin.starts_with("https://") || origin.starts_with("http://"))
        && origin
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:/[]".contains(&b));
    ok.then_some(origin)
}

/// Headers every console answer carries.
fn hardened(content_type: &'static str, csp: &str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_str(csp).expect("the policy is ASCII"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// `GET /console`: the page. It holds no data; the operator's token (pasted into it)
/// authorizes the API calls its script makes.
async fn page(State(deps): State<Deps>) -> Response {
    let endpoints = match deps.auth.oidc() {
        Some(oidc) => oidc.console_endpoints().await.and_then(Result::ok),
        None => None,
    };
    match endpoints.as_ref().and_then(|e| csp_origin(&e.token_origin)) {
        Some(origin) => hardened("text/html; charset=utf-8", &page_csp(Some(origin)), PAGE),
        None => hardened("text/html; charset=utf-8", &PAGE_CSP, PAGE),
    }
}

/// `GET /api/console/sign-in` (no credentials): the identity provider's sign-in for the
/// console, when configured and its endpoints are discovered (else `oidc: null`: the
/// pasted token only).
async fn sign_in(State(deps): State<Deps>) -> Response {
    let mut oidc = None;
    if let Some(provider) = deps.auth.oidc() {
        if let (Some(Ok(endpoints)), Some(client)) = (
            provider.console_endpoints().await,
            provider.config().console.as_ref(),
        ) {
            oidc = Some(tollgate_protocol::console::ConsoleOidc {
                provider: client.provider.clone(),
                issuer: provider.config().issuer.clone(),
                authorization_endpoint: endpoints.authorization_endpoint,
                token_endpoint: endpoints.token_endpoint,
                client_id: client.client_id.clone(),
                scopes: client.scopes.clone(),
                redirect_uri: client.redirect_uri.clone(),
            });
        }
    }
    let mut response = Json(tollgate_protocol::console::ConsoleSignIn { oidc }).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `GET /console.js`: the page's script.
async fn script() -> Response {
    hardened(
        "text/javascript; charset=utf-8",
        "default-src 'none'",
        SCRIPT,
    )
}

/// `GET /api/console/config` (operator JWT): who the token is and what it may grant —
/// the tools an `always` scope may be granted for (`TOLLGATE_ALWAYS_ELIGIBLE_TOOLS`). The
/// console offers a scope beyond `once` only on runs whose `owner` is `sub`.
async fn config(State(deps): State<Deps>, creds: Credentials) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Operator)?;
    let mut response = Json(tollgate_protocol::console::ConsoleConfig {
        sub: claims.sub,
        project_id: claims.project_id,
        always_eligible: deps.gate.config().always_eligible.clone(),
    })
    .into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ` on<letters>=` attribute anywhere in the markup.
    fn has_inline_handler(page: &str) -> bool {
        page.match_indices(" on").any(|(i, _)| {
            let rest = &page[i + 3..];
            let name = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
            name > 0 && rest[name..].starts_with('=')
        })
    }

    #[test]
    fn the_policy_allows_exactly_the_inline_style_and_nothing_external() {
        let style = inline_style(PAGE);
        assert!(style.contains("--console-css"), "the page has its style");
        assert!(PAGE_CSP.contains(&csp_hash(style)));
        assert!(!PAGE_CSP.contains("unsafe"));
        assert!(!PAGE_CSP.contains("http"));
        // With a token endpoint, exactly its origin is added to connect-src.
        let with = page_csp(csp_origin("https://idp.example.com:8443"));
        assert!(with.contains("; connect-src 'self' https://idp.example.com:8443; "));
        assert_eq!(csp_origin("https://a.example; script-src *"), None);
        assert_eq!(csp_origin("javascript:alert(1)"), None);
        // One <style>, no inline script, no inline handlers or style attributes.
        assert_eq!(PAGE.matches("<style>").count(), 1);
        assert_eq!(PAGE.matches("<script").count(), 1);
        assert!(PAGE.contains(r#"<script src="console.js" defer></script>"#));
        assert!(!PAGE.contains(" style="));
        assert!(!has_inline_handler(PAGE), "no on…= attributes");
        // No external addresses anywhere in what the console serves.
        for text in [PAGE, SCRIPT] {
            assert!(!text.contains("http://") && !text.contains("https://"));
        }
        // The script writes text, never HTML.
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
        ] {
            assert!(!SCRIPT.contains(sink), "{sink}");
        }
    }
}
