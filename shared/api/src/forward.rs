//! Pod-per-run forwarding (seed 003, docs/architecture.md §8): a run created with
//! `execution_mode: "pod"` keeps its pending cards in its AgentHost pod's memory. A
//! decision the durable gate knows nothing of is forwarded to the pod —
//! `POST {origin}/tool-approvals` `{runId, requestId, scope}` or `/tool-denials`
//! `{runId, requestId}` with `Authorization: Bearer <the run's pod credential>` — and its
//! answer mapped: a terminal state → 200, pod 404 → 404 `unknown`, pod 409 `{state:
//! "pending"}` → 409
//! `pending`, anything else (no answer in time, 5xx, 401, invalid JSON, another run's
//! answer) → 503 `agenthost_unreachable`.
//!
//! The API must not become a proxy to arbitrary hosts: an origin is `https` (plain
//! `http` only to loopback, and only with `TOLLGATE_ALLOW_LOOPBACK_ORIGINS=1`, for local
//! pods and tests), carries no credentials, query or fragment, and never names a
//! link-local, metadata, private-range or otherwise internal address — checked when the
//! run is created and again, on the addresses the name resolves to, when forwarding (the
//! connection goes to the address that was checked).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use serde_json::{json, Value};
use tollgate_domain::{ApprovalState, Scope};

/// Why an origin is refused (the 400's text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("agenthost_origin {0}")]
pub struct OriginRefused(&'static str);

/// A checked origin: the URL to post under and the host to resolve.
#[derive(Debug, Clone)]
pub struct Origin {
    url: reqwest::Url,
    host: String,
    port: u16,
    literal: Option<IpAddr>,
}

/// Host names that are internal whatever they resolve to.
fn internal_name(host: &str) -> bool {
    host == "metadata"
        || host == "instance-data"
        || host.ends_with(".internal")
        || host.ends_with(".local")
        || !host.contains('.')
}

fn loopback_name(host: &str) -> bool {
    host == "localhost" || host.ends_with(".localhost")
}

/// Addresses a pod may never be reached at: private, link-local (the cloud metadata
/// endpoint 169.254.169.254 among them), shared, unspecified, broadcast, multicast,
/// documentation, benchmarking and reserved ranges — and loopback unless allowed.
pub fn forbidden_ip(ip: IpAddr, allow_loopback: bool) -> bool {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4, allow_loopback),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden_v4(v4, allow_loopback);
            }
            forbidden_v6(v6, allow_loopback)
        }
    }
}

fn forbidden_v4(ip: Ipv4Addr, allow_loopback: bool) -> bool {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        return !allow_loopback;
    }
    ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || a >= 240 // reserved
        || (a == 192 && b == 0 && ip.octets()[2] == 0) // IETF protocol assignments
}

fn forbidden_v6(ip: Ipv6Addr, allow_loopback: bool) -> bool {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        return !allow_loopback;
    }
    ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local
        || (first & 0xffc0) == 0xfe80 // link-local
        || (first == 0x2001 && ip.segments()[1] == 0x0db8) // documentation
        || (first == 0x0064 && ip.segments()[1] == 0xff9b) // NAT64 (incl. local-use 64:ff9b:1::/48)
        || (first & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (first == 0x2001 && ip.segments()[1] == 0x0000) // Teredo: an IPv4 inside
        || (ip.segments()[..4] == [0, 0, 0, 0] && ip.segments()[4] == 0xffff) // SIIT ::ffff:0:a.b.c.d
        || first == 0x2002 // 6to4: an IPv4 inside
        || ip.to_ipv4().is_some() // IPv4-compatible
}

/// Checks an `agenthost_origin` (run creation and every forward).
pub fn check_origin(origin: &str, allow_loopback: bool) -> Result<Origin, OriginRefused> {
    check_url(origin, allow_loopback, false)
}

/// Checks a URL to post to under the same rules as an origin, a path allowed (a
/// notification webhook's target, docs/architecture.md §10).
pub fn check_target(url: &str, allow_loopback: bool) -> Result<Origin, OriginRefused> {
    check_url(url, allow_loopback, true)
}

impl OriginRefused {
    /// Why, without the name of the field.
    pub fn reason(&self) -> &'static str {
        self.0
    }
}

impl Origin {
    /// The checked URL.
    pub fn url(&self) -> &reqwest::Url {
        &self.url
    }
}

fn check_url(origin: &str, allow_loopback: bool, path: bool) -> Result<Origin, OriginRefused> {
    let url = reqwest::Url::parse(origin).map_err(|_| OriginRefused("must be an absolute URL"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(OriginRefused("must not carry credentials"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(OriginRefused("must not have a query or fragment"));
    }
    if !path && !matches!(url.path(), "" | "/") {
        return Err(OriginRefused(
            "must be an origin (scheme, host, port), without a path",
        ));
    }
    let literal = match url.host() {
        Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
        Some(url::Host::Domain(_)) => None,
        None => return Err(OriginRefused("must name a host")),
    };
    // A name's trailing dot (`localhost.`, `metadata.google.internal.`) names the same host.
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    let bare = host.trim_end_matches('.').to_owned();
    let loopback = match literal {
        Some(ip) => ip.is_loopback() || ip.to_canonical().is_loopback(),
        None => loopback_name(&bare),
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback && allow_loopback => {}
        "http" => {
            return Err(OriginRefused(
                "must be https (http only to loopback, with TOLLGATE_ALLOW_LOOPBACK_ORIGINS=1)",
            ))
        }
        _ => return Err(OriginRefused("must be an https URL")),
    }
    match literal {
        Some(ip) if forbidden_ip(ip, allow_loopback) => {
            return Err(OriginRefused(
                "must not be a private, link-local or internal address",
            ))
        }
        None if loopback && !allow_loopback => {
            return Err(OriginRefused("must not be a loopback host"))
        }
        None if !loopback && internal_name(&bare) => {
            return Err(OriginRefused("must be a public host name"))
        }
        _ => {}
    }
    let port = url.port_or_known_default().unwrap_or(443);
    Ok(Origin {
        url,
        host,
        port,
        literal,
    })
}

/// What the pod answered, mapped.
#[derive(Debug, Clone, PartialEq)]
pub enum PodAnswer {
    /// The card is ended: `applied` when this forward ended it.
    Terminal {
        state: ApprovalState,
        applied: bool,
        scope: Option<Scope>,
        decided_by: Option<String>,
        tool_name: Option<String>,
    },
    /// 404: the pod knows no such request.
    Unknown,
    /// 409: pending, but the pod cannot decide it now.
    Pending,
    /// Anything else: 503 `agenthost_unreachable` (the reason is logged).
    Unreachable(String),
}

/// A decision to forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Approve,
    Deny,
}

/// Decisions one process forwards at once, at most.
pub const MAX_IN_FLIGHT: usize = 256;

/// How far a forward may reach: its time limit and whether loopback origins are allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    pub timeout: Duration,
    pub allow_loopback: bool,
}

/// One decision to forward.
#[derive(Debug, Clone, Copy)]
pub struct Decision<'a> {
    pub verb: Verb,
    pub run_id: &'a str,
    pub request_id: &'a str,
    pub scope: Scope,
    /// The tool the operator named (sent as `toolName`: a pod refuses a card for another).
    pub tool_name: Option<&'a str>,
    /// `decisionId` ([`crate::Auth::pod_decision_id`]): the same for the same operator,
    /// card, verb and scope, so a pod can tell a decision sent again.
    pub decision_id: &'a str,
}

/// Forwards one decision (`credential`: the run's pod credential, never logged).
pub async fn forward(
    origin: &str,
    credential: &str,
    decision: Decision<'_>,
    reach: Reach,
) -> PodAnswer {
    let Decision {
        verb,
        run_id,
        request_id,
        scope,
        tool_name,
        decision_id: id,
    } = decision;
    let (client, base) = match connect(origin, reach).await {
        Ok(c) => c,
        Err(why) => return PodAnswer::Unreachable(why),
    };
    let (path, mut body) = match verb {
        Verb::Approve => (
            "tool-approvals",
            json!({"runId": run_id, "requestId": request_id, "scope": scope.as_str(),
                   "decisionId": id}),
        ),
        Verb::Deny => (
            "tool-denials",
            json!({"runId": run_id, "requestId": request_id, "decisionId": id}),
        ),
    };
    if let Some(tool) = tool_name {
        body["toolName"] = tool.into();
    }
    let url = match base.join(path) {
        Ok(u) => u,
        Err(_) => return PodAnswer::Unreachable("invalid origin".into()),
    };
    let (status, bytes) = match exchange(client.post(url).bearer_auth(credential).json(&body)).await
    {
        Ok(answer) => answer,
        Err(why) => return PodAnswer::Unreachable(why),
    };
    match status {
        200 => parse_terminal(&bytes, run_id, request_id),
        404 => PodAnswer::Unknown,
        // Only a 409 that says the card is pending is pending (AgentHost's other 409,
        // `run_mismatch`, is an answer nothing can be done with: unreachable, not a
        // reason for the operator to click again).
        409 if says_pending(&bytes) => PodAnswer::Pending,
        other => PodAnswer::Unreachable(format!("the pod answered {other}")),
    }
}

/// A client for one call to the pod at `origin` within `reach`'s time limit, and the URL
/// to join paths to: the origin is checked, resolved once, every address refused if
/// internal, and the client connects only to the checked addresses.
async fn connect(origin: &str, reach: Reach) -> Result<(reqwest::Client, reqwest::Url), String> {
    let origin = check_origin(origin, reach.allow_loopback).map_err(|e| e.to_string())?;
    connect_checked(origin, reach).await
}

/// [`connect`] for an origin or target already checked ([`check_target`]): resolves it,
/// refuses every internal address, and connects only to the checked addresses.
pub async fn connect_checked(
    origin: Origin,
    reach: Reach,
) -> Result<(reqwest::Client, reqwest::Url), String> {
    let Reach {
        timeout,
        allow_loopback,
    } = reach;
    // One deadline for all of it: resolving, connecting, sending and reading the answer.
    let deadline = tokio::time::Instant::now() + timeout;
    let addrs: Vec<SocketAddr> = match origin.literal {
        Some(ip) => vec![SocketAddr::new(ip, origin.port)],
        None => {
            let resolved = tokio::time::timeout_at(
                deadline,
                tokio::net::lookup_host((origin.host.as_str(), origin.port)),
            )
            .await;
            match resolved {
                Ok(Ok(addrs)) => addrs.collect(),
                Ok(Err(_)) => return Err("the origin does not resolve".into()),
                Err(_) => return Err("resolving the origin timed out".into()),
            }
        }
    };
    if addrs.is_empty() {
        return Err("the origin does not resolve".into());
    }
    if addrs.iter().any(|a| forbidden_ip(a.ip(), allow_loopback)) {
        return Err("the origin resolves to an internal address".into());
    }
    // Plain http carries the credential in the clear: loopback only, every address.
    if origin.url.scheme() == "http" && addrs.iter().any(|a| !a.ip().to_canonical().is_loopback()) {
        return Err("an http origin resolves beyond loopback".into());
    }
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(left)
        .resolve_to_addrs(&origin.host, &addrs)
        .no_proxy()
        .build()
        .map_err(|e| format!("http client: {e}"))?;
    Ok((client, origin.url))
}

/// What the pod says of a card Tollgate never saw (`GET {origin}/tool-approvals/{id}`,
/// as an AgentHost serves its server-captured context).
#[derive(Debug, Clone, PartialEq)]
pub enum CardContext {
    /// The card's tool (`toolName`), when the pod names one.
    Known { tool_name: Option<String> },
    /// 404: the pod knows no such request.
    Unknown,
    /// No usable answer (the reason is logged).
    Unreachable(String),
}

/// Reads a pod card's context (`credential`: the run's pod credential, never logged).
pub async fn card_context(
    origin: &str,
    credential: &str,
    run_id: &str,
    request_id: &str,
    reach: Reach,
) -> CardContext {
    let (client, base) = match connect(origin, reach).await {
        Ok(c) => c,
        Err(why) => return CardContext::Unreachable(why),
    };
    let mut url = base;
    match url.path_segments_mut() {
        Ok(mut segments) => {
            segments
                .pop_if_empty()
                .extend(["tool-approvals", request_id]);
        }
        Err(()) => return CardContext::Unreachable("invalid origin".into()),
    }
    let (status, bytes) = match exchange(client.get(url).bearer_auth(credential)).await {
        Ok(answer) => answer,
        Err(why) => return CardContext::Unreachable(why),
    };
    match status {
        200 => {}
        404 => return CardContext::Unknown,
        other => return CardContext::Unreachable(format!("the pod answered {other}")),
    }
    let Ok(Value::Object(v)) = serde_json::from_slice::<Value>(&bytes) else {
        return CardContext::Unreachable("the pod's answer is not a JSON object".into());
    };
    // A card of another run is no context for this one.
    if names_other(&v, "runId", run_id) || names_other(&v, "requestId", request_id) {
        return CardContext::Unreachable("the pod answered for another run or request".into());
    }
    CardContext::Known {
        tool_name: v
            .get("toolName")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_owned),
    }
}

/// Sends one request to a pod: its status and its (bounded: a pod answer is small)
/// body, or why there is none.
async fn exchange(request: reqwest::RequestBuilder) -> Result<(u16, Vec<u8>), String> {
    let response = match request.send().await {
        Ok(r) => r,
        Err(e) if e.is_timeout() => return Err("the pod did not answer in time".into()),
        Err(_) => return Err("the pod could not be reached".into()),
    };
    let status = response.status().as_u16();
    let bytes = read_bounded(response, 64 * 1024)
        .await
        .ok_or_else(|| "the pod's answer was unreadable or too large".to_owned())?;
    Ok((status, bytes))
}

/// Whether a pod's answer echoes `key` naming something other than `expected` (an
/// AgentHost need not echo ids; one it echoes must be this card's).
fn names_other(answer: &serde_json::Map<String, Value>, key: &str, expected: &str) -> bool {
    match answer.get(key) {
        None | Some(Value::Null) => false,
        Some(Value::String(got)) => got != expected,
        Some(_) => true,
    }
}

async fn read_bounded(mut response: reqwest::Response, max: usize) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await.ok()? {
        out.extend_from_slice(&chunk);
        if out.len() > max {
            return None;
        }
    }
    Some(out)
}

/// Whether a pod's 409 body says `state: "pending"`.
fn says_pending(bytes: &[u8]) -> bool {
    serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|v| {
            v.get("state")
                .and_then(Value::as_str)
                .map(|s| s == "pending")
        })
        .unwrap_or(false)
}

/// A 200 from the pod: a terminal state of this very card, or it is not an answer.
fn parse_terminal(bytes: &[u8], run_id: &str, request_id: &str) -> PodAnswer {
    let Ok(Value::Object(v)) = serde_json::from_slice::<Value>(bytes) else {
        return PodAnswer::Unreachable("the pod's answer is not a JSON object".into());
    };
    let named = |k: &str| v.get(k).and_then(Value::as_str);
    // An AgentHost answers `{resolved, applied, state, toolName?, url?}` without echoing
    // the ids (it answers the request it was sent). Ids it does echo must name this card:
    // an answer about another run or request decides nothing.
    if names_other(&v, "runId", run_id) || names_other(&v, "requestId", request_id) {
        return PodAnswer::Unreachable("the pod answered for another run or request".into());
    }
    if v.get("resolved").is_some_and(|r| r != &Value::Bool(true)) {
        return PodAnswer::Unreachable("the pod's answer is not resolved".into());
    }
    let state = match named("state") {
        Some("approved") => ApprovalState::Approved,
        Some("denied") => ApprovalState::Denied,
        Some("expired") => ApprovalState::Expired,
        _ => return PodAnswer::Unreachable("the pod's answer has no terminal state".into()),
    };
    PodAnswer::Terminal {
        state,
        applied: v.get("applied").and_then(Value::as_bool) == Some(true),
        scope: named("scope").map(|s| Scope::parse(Some(s))),
        decided_by: named("decidedBy").map(str::to_owned),
        tool_name: named("toolName").map(str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_public_https_or_allowed_loopback() {
        for ok in [
            "https://pod-1.agents.example.com",
            "https://pod-1.agents.example.com:8443/",
            "https://93.184.216.34",
        ] {
            assert!(check_origin(ok, false).is_ok(), "{ok}");
        }
        for bad in [
            "http://pod-1.agents.example.com",
            "ftp://pod.example.com",
            "https://user:pw@pod.example.com",
            "https://pod.example.com/?x=1",
            "https://pod.example.com/#f",
            "https://pod.example.com/api",
            "https://169.254.169.254",
            "http://169.254.169.254/latest/meta-data",
            "https://10.0.0.5",
            "https://172.16.3.4",
            "https://192.168.1.1",
            "https://100.64.0.1",
            "https://[fe80::1]",
            "https://[fd00::1]",
            "https://[::ffff:10.0.0.1]",
            "https://[::ffff:169.254.169.254]",
            "https://0.0.0.0",
            "https://127.0.0.1",
            "http://127.0.0.1:9000",
            "https://localhost",
            "https://metadata.google.internal",
            "https://metadata",
            "https://pod.local",
            "https://localhost.",
            "https://metadata.google.internal.",
            "https://pod.local.",
            "https://metadata.",
            "https://[64:ff9b:1::a00:1]",
            "https://[2001:0:4136:e378::1]",
            "https://[fec0::1]",
            "https://2130706433",
            "https://0x7f.1",
            "not a url",
            "",
        ] {
            assert!(check_origin(bad, false).is_err(), "{bad}");
        }
        // Loopback, for local pods and tests, only when allowed.
        for ok in [
            "http://127.0.0.1:9000",
            "http://localhost:9000",
            "http://[::1]:9000",
        ] {
            assert!(check_origin(ok, true).is_ok(), "{ok}");
        }
        assert!(check_origin("http://10.0.0.1:9000", true).is_err());
        assert!(check_origin("https://169.254.169.254", true).is_err());
    }

    #[test]
    fn only_a_409_saying_pending_is_pending() {
        assert!(says_pending(br#"{"state":"pending"}"#));
        assert!(!says_pending(br#"{"state":"run_mismatch"}"#));
        assert!(!says_pending(br#"{"error":"run_mismatch"}"#));
        assert!(!says_pending(b"not json"));
        assert!(!says_pending(b""));
    }

    #[test]
    fn a_pod_answer_must_be_this_cards_terminal_state() {
        let ok = br#"{"runId":"r","requestId":"q","state":"approved","applied":true,"scope":"tool","toolName":"web_fetch"}"#;
        assert_eq!(
            parse_terminal(ok, "r", "q"),
            PodAnswer::Terminal {
                state: ApprovalState::Approved,
                applied: true,
                scope: Some(Scope::Tool),
                decided_by: None,
                tool_name: Some("web_fetch".into()),
            }
        );
        // An AgentHost's own answer: no ids echoed.
        let agenthost = br#"{"resolved":true,"applied":true,"state":"denied","toolName":"web_fetch","url":"https://example.com"}"#;
        assert_eq!(
            parse_terminal(agenthost, "r", "q"),
            PodAnswer::Terminal {
                state: ApprovalState::Denied,
                applied: true,
                scope: None,
                decided_by: None,
                tool_name: Some("web_fetch".into()),
            }
        );
        for bad in [
            &br#"{"runId":"other","requestId":"q","state":"approved"}"#[..],
            br#"{"runId":"r","requestId":"other","state":"approved"}"#,
            br#"{"requestId":"other","state":"approved"}"#,
            br#"{"runId":7,"state":"approved"}"#,
            br#"{"resolved":false,"state":"approved"}"#,
            br#"{"runId":"r","requestId":"q","state":"pending"}"#,
            br#"{"state":"maybe"}"#,
            br#"[1]"#,
            b"not json",
        ] {
            assert!(
                matches!(parse_terminal(bad, "r", "q"), PodAnswer::Unreachable(_)),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
