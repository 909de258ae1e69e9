//! Operators signed in through an OpenID Connect identity provider, as a client sees it:
//! a test IdP on loopback (`tollgate_tests::idp`) publishes its discovery document and
//! JWKS (an ECDSA P-256 key generated here, a fixed RSA test key from `fixtures/oidc/`),
//! the tokens are signed here, and every check is made over HTTP against `tollgate serve`'s app (and the
//! operators-only stream function) on the embedded store and on DynamoDB (`dynamo::`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate_api::oidc::{ConsoleClient, Oidc, OidcConfig, OidcProjects};
use tollgate_api::{Auth, Deps, GateConfig, Role};
use tollgate_tests::idp::{b64, hs256, now, Idp, SigningKey, AUDIENCE, OPERATORS};
use tollgate_tests::{store_for, Backend, TestServer, TEST_SECRET};

async fn server(backend: Backend, config: OidcConfig) -> TestServer {
    let auth = Auth::new(TEST_SECRET.as_bytes()).with_oidc(Oidc::new(config));
    TestServer::with_deps(Deps::embedded(
        store_for(backend).await,
        GateConfig::default(),
        auth,
    ))
    .await
}

/// A run (of `project`, when given) with one pending card; `(run_id, request_id)`.
async fn pending_card(srv: &TestServer, project: Option<&str>) -> (String, String) {
    let agent = srv
        .auth
        .mint_jwt("agent", Role::Agent, 600, project.map(Into::into));
    let body = match project {
        Some(p) => json!({"project_id": p}),
        None => json!({}),
    };
    let (status, run) = srv.post("/api/runs", &agent, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let token = run["run_token"].as_str().unwrap();
    let rid = uuid::Uuid::new_v4().to_string();
    let (status, v) = srv
        .post(
            &format!("/api/runs/{run_id}/approval-requests"),
            token,
            &json!({"request_id": rid, "tool_name": "shell"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    (run_id, rid)
}

async fn approve(srv: &TestServer, run: &str, rid: &str, token: &str) -> (StatusCode, Value) {
    srv.post(
        &format!("/api/runs/{run}/tool-approvals"),
        token,
        &json!({"request_id": rid, "reason": "checked"}),
    )
    .await
}

/// The card's state as the agent's coordinator of record (an HS256 operator) reads it,
/// and the run's event count.
async fn standing(srv: &TestServer, run: &str) -> (Vec<String>, usize) {
    let (_, cards) = srv
        .get(&format!("/api/runs/{run}/approvals"), &srv.operator_token)
        .await;
    let pending = cards["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["request_id"].as_str().unwrap().to_owned())
        .collect();
    let events = srv.replay_all(run, &srv.operator_token, 100).await;
    (pending, events.len())
}

/// GIVEN an IdP found by discovery WHEN operators present its ES256 and RS256 tokens
/// (the role claim an array, or a string) THEN they decide cards as themselves; the
/// stack's own HS256 operator tokens keep working beside them; the same tokens open the
/// live stream and the replay.
async fn valid_tokens_decide(backend: Backend) {
    let (ec, rsa) = (SigningKey::ec("ec-1"), SigningKey::rsa("rsa-1"));
    let idp = Idp::start(&[&ec, &rsa]).await;
    let srv = server(backend, idp.config(OidcProjects::All)).await;
    let (run, rid) = pending_card(&srv, None).await;
    let token = ec.token(&idp.claims("alice", json!(["staff", OPERATORS])));
    let (status, v) = approve(&srv, &run, &rid, &token).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (
            v["state"].as_str(),
            v["decided_by"].as_str(),
            v["decision_reason"].as_str()
        ),
        (Some("approved"), Some("oidc:alice"), Some("checked"))
    );
    let events = srv.replay_all(&run, &token, 100).await;
    assert_eq!(events.last().unwrap()["decidedBy"], "oidc:alice");
    let (run, rid) = pending_card(&srv, None).await;
    let mut claims = idp.claims("bob", json!(OPERATORS));
    claims["aud"] = json!(["other-app", AUDIENCE]);
    let (status, v) = approve(&srv, &run, &rid, &rsa.token(&claims)).await;
    assert_eq!(
        (status, v["decided_by"].as_str()),
        (StatusCode::OK, Some("oidc:bob")),
        "{v}"
    );
    let (run, rid) = pending_card(&srv, None).await;
    let (status, v) = approve(&srv, &run, &rid, &srv.operator_token).await;
    assert_eq!(
        (status, v["decided_by"].as_str()),
        (StatusCode::OK, Some("test-operator")),
        "{v}"
    );
    // One discovery, one JWKS fetch for all of it (the keys are cached).
    assert_eq!(idp.fetches(), 1);
    // The operators-only stream function admits the same token, and refuses a forged one.
    let deps = Deps::embedded(
        store_for(backend).await,
        GateConfig::default(),
        Auth::new(TEST_SECRET.as_bytes()).with_oidc(Oidc::new(idp.config(OidcProjects::All))),
    );
    let router = tollgate_api::functions::OPERATOR_STREAM
        .router(deps)
        .expect("an HTTP function");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let http = reqwest::Client::new();
    let events = |token: String| {
        http.get(format!("{base}/api/runs/no-such-run/events"))
            .bearer_auth(token)
            .send()
    };
    let ok = events(token.clone()).await.unwrap();
    assert_eq!(
        ok.status(),
        StatusCode::NOT_FOUND,
        "past the operators' check"
    );
    let mut forged = token.clone();
    forged.push('A');
    assert_eq!(
        events(forged).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
}

/// GIVEN a project claim WHEN an operator of one project decides THEN only that
/// project's cards, as with an HS256 token's `project_id`; the subject may be `email`.
async fn project_and_subject_claims(backend: Backend) {
    let ec = SigningKey::ec("ec-p");
    let idp = Idp::start(&[&ec]).await;
    let mut config = idp.config(OidcProjects::Claim {
        claim: "custom:project".into(),
        allowed: None,
    });
    config.subject_claim = "email".into();
    let srv = server(backend, config).await;
    let (mine, mine_rid) = pending_card(&srv, Some("p-1")).await;
    let (theirs, their_rid) = pending_card(&srv, Some("p-2")).await;
    let mut claims = idp.claims("carol", json!([OPERATORS]));
    claims["custom:project"] = json!("p-1");
    let token = ec.token(&claims);
    let (status, v) = approve(&srv, &theirs, &their_rid, &token).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let (status, v) = approve(&srv, &mine, &mine_rid, &token).await;
    assert_eq!(
        (status, v["decided_by"].as_str()),
        (StatusCode::OK, Some("oidc:carol@example.com")),
        "{v}"
    );
    // Without the project claim, no project: refused, not every project.
    let (run, rid) = pending_card(&srv, Some("p-1")).await;
    let token = ec.token(&idp.claims("carol", json!([OPERATORS])));
    let (status, v) = approve(&srv, &run, &rid, &token).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(standing(&srv, &run).await.0, [rid]);
}

/// GIVEN a pending card WHEN tokens that are not valid operator tokens of the issuer
/// try to approve it THEN 401 (not the issuer's valid token) or 403 (valid, but no
/// operator role), each with a JSON error, and nothing is decided or written.
async fn refused_tokens_decide_nothing(backend: Backend) {
    let (ec, rsa) = (SigningKey::ec("ec-1"), SigningKey::rsa("rsa-1"));
    let stranger = SigningKey::ec("ec-1");
    let idp = Idp::start(&[&ec, &rsa]).await;
    let srv = server(backend, idp.config(OidcProjects::All)).await;
    let (run, rid) = pending_card(&srv, None).await;
    // Warm the keys with a valid read, so each refusal below is the token's own fault.
    let good = idp.claims("alice", json!([OPERATORS]));
    let (status, _) = srv
        .get(&format!("/api/runs/{run}/approvals"), &ec.token(&good))
        .await;
    assert_eq!(status, StatusCode::OK);
    let before = standing(&srv, &run).await;
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut c = good.clone();
        edit(&mut c);
        c
    };
    let now = now();
    let ec_header = |alg: &str, kid: &str| json!({"alg": alg, "kid": kid, "typ": "JWT"});
    let tampered = {
        let t = ec.token(&good);
        let parts: Vec<&str> = t.split('.').collect();
        let evil = with(&|c| c["sub"] = json!("mallory"));
        format!(
            "{}.{}.{}",
            parts[0],
            b64(evil.to_string().as_bytes()),
            parts[2]
        )
    };
    let unsigned = format!(
        "{}.{}.",
        b64(json!({"alg": "none", "kid": "ec-1"}).to_string().as_bytes()),
        b64(good.to_string().as_bytes())
    );
    let cases: Vec<(&str, String, StatusCode)> = vec![
        (
            "wrong issuer",
            ec.token(&with(&|c| c["iss"] = json!("https://evil.example.com"))),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "wrong audience",
            ec.token(&with(&|c| c["aud"] = json!("another-app"))),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "audience array without ours",
            ec.token(&with(&|c| c["aud"] = json!(["a", "b"]))),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "no audience",
            ec.token(&with(&|c| {
                c.as_object_mut().unwrap().remove("aud");
            })),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "expired",
            ec.token(&with(&|c| {
                c["iat"] = json!(now - 7200);
                c["exp"] = json!(now - 3600);
            })),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "not yet valid",
            ec.token(&with(&|c| c["nbf"] = json!(now + 3600))),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "no exp",
            ec.token(&with(&|c| {
                c.as_object_mut().unwrap().remove("exp");
            })),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "RS256 header naming the EC key",
            rsa.token_with(ec_header("RS256", "ec-1"), &good),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "ES256 header naming the RSA key",
            ec.token_with(ec_header("ES256", "rsa-1"), &good),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "HS256 with the EC public key as the secret",
            hs256(ec_header("HS256", "ec-1"), &good, &ec.public_bytes()),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "HS256 with the RSA public key as the secret",
            hs256(ec_header("HS256", "rsa-1"), &good, &rsa.public_bytes()),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "HS256 with the JWKS entry as the secret",
            hs256(
                ec_header("HS256", "ec-1"),
                &good,
                ec.jwk().to_string().as_bytes(),
            ),
            StatusCode::UNAUTHORIZED,
        ),
        ("alg none", unsigned, StatusCode::UNAUTHORIZED),
        (
            "unknown kid",
            ec.token_with(ec_header("ES256", "nobody"), &good),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "a key the issuer never published",
            stranger.token(&good),
            StatusCode::UNAUTHORIZED,
        ),
        ("tampered payload", tampered, StatusCode::UNAUTHORIZED),
        (
            "no role claim",
            ec.token(&with(&|c| {
                c.as_object_mut().unwrap().remove("cognito:groups");
            })),
            StatusCode::FORBIDDEN,
        ),
        (
            "role claim without the operator role",
            ec.token(&with(&|c| {
                c["cognito:groups"] = json!(["staff", "tollgate-viewers"])
            })),
            StatusCode::FORBIDDEN,
        ),
        (
            "role claim a string, another role",
            ec.token(&with(&|c| c["cognito:groups"] = json!("staff"))),
            StatusCode::FORBIDDEN,
        ),
        (
            "role claim of the wrong type",
            ec.token(&with(&|c| {
                c["cognito:groups"] = json!({"tollgate-operators": true})
            })),
            StatusCode::FORBIDDEN,
        ),
        (
            "the issuer's token with HS256 under the stack's own secret",
            hs256(
                json!({"alg": "HS256", "typ": "JWT"}),
                &with(&|c| c["role"] = json!("operator")),
                TEST_SECRET.as_bytes(),
            ),
            StatusCode::UNAUTHORIZED,
        ),
    ];
    for (name, token, expected) in cases {
        let (status, v) = approve(&srv, &run, &rid, &token).await;
        assert_eq!(status, expected, "{name}: {v}");
        assert!(v["error"].is_string(), "{name}: {v}");
    }
    assert_eq!(standing(&srv, &run).await, before, "nothing decided");
    // An operator of the IdP is not an agent.
    let (status, _) = srv.post("/api/runs", &ec.token(&good), &json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// GIVEN keys cached WHEN the IdP rotates to a new key THEN a token under the new `kid`
/// fetches the keys again and verifies — but never more than once per refetch interval:
/// with a long interval, unknown kids do not reach the IdP again and are refused.
async fn jwks_rotation(backend: Backend) {
    let old = SigningKey::ec("old");
    let idp = Idp::start(&[&old]).await;
    let mut config = idp.config(OidcProjects::All);
    config.refetch_interval = Duration::ZERO;
    let srv = server(backend, config).await;
    let (run, rid) = pending_card(&srv, None).await;
    let listed = format!("/api/runs/{run}/approvals");
    let claims = idp.claims("dave", json!([OPERATORS]));
    let (status, _) = srv.get(&listed, &old.token(&claims)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(idp.fetches(), 1);
    let new = SigningKey::rsa("new");
    idp.publish(&new);
    let (status, v) = approve(&srv, &run, &rid, &new.token(&claims)).await;
    assert_eq!(
        (status, v["decided_by"].as_str()),
        (StatusCode::OK, Some("oidc:dave")),
        "{v}"
    );
    assert_eq!(idp.fetches(), 2);

    // A long refetch interval: the rotation is not seen until then.
    let old = SigningKey::ec("old");
    let idp = Idp::start(&[&old]).await;
    let mut config = idp.config(OidcProjects::All);
    config.refetch_interval = Duration::from_secs(3600);
    let srv = server(backend, config).await;
    let (run, rid) = pending_card(&srv, None).await;
    let claims = idp.claims("dave", json!([OPERATORS]));
    let (status, _) = srv
        .get(&format!("/api/runs/{run}/approvals"), &old.token(&claims))
        .await;
    assert_eq!(status, StatusCode::OK);
    let new = SigningKey::ec("new");
    idp.publish(&new);
    for _ in 0..5 {
        let (status, _) = approve(&srv, &run, &rid, &new.token(&claims)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(
        idp.fetches(),
        1,
        "unknown kids fetched nothing within the interval"
    );
    assert_eq!(standing(&srv, &run).await.0, [rid]);
}

/// GIVEN the IdP's JWKS endpoint down WHEN an operator presents a valid token THEN 503
/// (fail closed: the token can be neither verified nor refused; the client may retry)
/// and nothing is decided; HS256 operators are unaffected; once the endpoint is back,
/// the same token decides.
async fn jwks_down_fails_closed(backend: Backend) {
    let ec = SigningKey::ec("ec-1");
    let idp = Idp::start(&[&ec]).await;
    idp.down.store(true, Ordering::SeqCst);
    let mut config = idp.config(OidcProjects::All);
    config.refetch_interval = Duration::ZERO;
    let srv = server(backend, config).await;
    let (run, rid) = pending_card(&srv, None).await;
    let token = ec.token(&idp.claims("erin", json!([OPERATORS])));
    let (status, v) = approve(&srv, &run, &rid, &token).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert!(v["error"].is_string(), "{v}");
    assert_eq!(standing(&srv, &run).await.0, std::slice::from_ref(&rid));
    let (status, _) = srv
        .get(&format!("/api/runs/{run}/approvals"), &srv.operator_token)
        .await;
    assert_eq!(status, StatusCode::OK);
    // A token that names another issuer is refused outright, keys or not.
    let mut other = idp.claims("erin", json!([OPERATORS]));
    other["iss"] = json!("https://elsewhere.example.com");
    let (status, _) = approve(&srv, &run, &rid, &ec.token(&other)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    idp.down.store(false, Ordering::SeqCst);
    let (status, v) = approve(&srv, &run, &rid, &token).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("approved")),
        "{v}"
    );
}

/// GIVEN operators' projects configured without a claim (one project for all) or with a
/// claim and a list WHEN they decide THEN only that project's cards; a claimed project
/// outside the list is refused (403) and decides nothing.
async fn configured_projects(backend: Backend) {
    let ec = SigningKey::ec("ec-p");
    let idp = Idp::start(&[&ec]).await;
    let srv = server(backend, idp.config(OidcProjects::One("p-1".into()))).await;
    let (mine, mine_rid) = pending_card(&srv, Some("p-1")).await;
    let (theirs, their_rid) = pending_card(&srv, Some("p-2")).await;
    let token = ec.token(&idp.claims("dave", json!([OPERATORS])));
    let (status, v) = approve(&srv, &theirs, &their_rid, &token).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let (status, v) = approve(&srv, &mine, &mine_rid, &token).await;
    assert_eq!(
        (status, v["decided_by"].as_str()),
        (StatusCode::OK, Some("oidc:dave")),
        "{v}"
    );
    assert_eq!(standing(&srv, &theirs).await.0, [their_rid]);

    let srv = server(
        backend,
        idp.config(OidcProjects::Claim {
            claim: "custom:project".into(),
            allowed: Some(vec!["p-1".into(), "p-2".into()]),
        }),
    )
    .await;
    let (run, rid) = pending_card(&srv, Some("p-3")).await;
    let mut claims = idp.claims("dave", json!([OPERATORS]));
    claims["custom:project"] = json!("p-3");
    let (status, v) = approve(&srv, &run, &rid, &ec.token(&claims)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    assert!(v["error"].is_string(), "{v}");
    let (before, events) = standing(&srv, &run).await;
    assert_eq!(before, std::slice::from_ref(&rid));
    claims["custom:project"] = json!("p-2");
    let (run2, rid2) = pending_card(&srv, Some("p-2")).await;
    let (status, v) = approve(&srv, &run2, &rid2, &ec.token(&claims)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(standing(&srv, &run).await, (vec![rid], events));
}

/// GIVEN an IdP operator named `alice` WHEN Tollgate's own tokens (an HS256 operator's,
/// an agent's) name the subject `oidc:alice` THEN they are refused (401): the provider's
/// operators' namespace is theirs only; a local operator named `alice` stays another one.
async fn the_providers_namespace_is_its_own(backend: Backend) {
    let ec = SigningKey::ec("ec-n");
    let idp = Idp::start(&[&ec]).await;
    let srv = server(backend, idp.config(OidcProjects::All)).await;
    let (run, rid) = pending_card(&srv, None).await;
    let forged = srv.auth.mint_jwt("oidc:alice", Role::Operator, 600, None);
    let (status, v) = approve(&srv, &run, &rid, &forged).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    let agent = srv.auth.mint_jwt("oidc:alice", Role::Agent, 600, None);
    let (status, v) = srv.post("/api/runs", &agent, &json!({})).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(standing(&srv, &run).await.0, std::slice::from_ref(&rid));
    let local = srv.auth.mint_jwt("alice", Role::Operator, 600, None);
    let (status, v) = srv.get("/api/console/config", &local).await;
    assert_eq!((status, v["sub"].as_str()), (StatusCode::OK, Some("alice")));
    let theirs = ec.token(&idp.claims("alice", json!([OPERATORS])));
    let (status, v) = srv.get("/api/console/config", &theirs).await;
    assert_eq!(
        (status, v["sub"].as_str()),
        (StatusCode::OK, Some("oidc:alice"))
    );
}

/// GIVEN the console's sign-in configured WHEN a client reads `GET /api/console/sign-in`
/// and `GET /console` THEN the endpoints discovered from the issuer and a policy that lets
/// the page connect to exactly the token endpoint's origin; the code flow with PKCE at
/// the test IdP gives an ID token (a wrong verifier: 400, nothing issued) that decides a
/// card as `oidc:<sub>`. Without the console client: `oidc: null`, the policy unchanged.
async fn console_sign_in_with_pkce(backend: Backend) {
    let idp = Idp::start_login(SigningKey::ec("login"), "frank", json!([OPERATORS])).await;
    let plain = server(backend, idp.config(OidcProjects::All)).await;
    let (status, v) = plain
        .send(plain.http.get(plain.url("/api/console/sign-in")))
        .await;
    assert_eq!((status, &v), (StatusCode::OK, &json!({"oidc": null})));
    let mut config = idp.config(OidcProjects::All);
    config.console = Some(ConsoleClient::new(AUDIENCE, &idp.issuer));
    let srv = server(backend, config).await;
    let (status, v) = srv
        .send(srv.http.get(srv.url("/api/console/sign-in")))
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let host = idp.issuer.trim_start_matches("http://");
    assert_eq!(
        v["oidc"],
        json!({"provider": host.split(':').next().unwrap(), "issuer": idp.issuer,
               "authorization_endpoint": format!("{}/authorize", idp.issuer),
               "token_endpoint": format!("{}/token", idp.issuer),
               "client_id": AUDIENCE, "scopes": "openid profile email", "redirect_uri": null})
    );
    let page = srv.http.get(srv.url("/console")).send().await.unwrap();
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains(&format!("; connect-src 'self' {}; ", idp.issuer)),
        "{csp}"
    );
    let page = plain.http.get(plain.url("/console")).send().await.unwrap();
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("; connect-src 'self'; "), "{csp}");

    // The code flow, as the console runs it.
    let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    let redirect = srv.url("/console");
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let authorize = |nonce: &str| {
        no_redirects
            .get(format!("{}/authorize", idp.issuer))
            .query(&[
                ("response_type", "code"),
                ("client_id", AUDIENCE),
                ("redirect_uri", redirect.as_str()),
                ("scope", "openid"),
                ("state", "s-1"),
                ("nonce", nonce),
                (
                    "code_challenge",
                    "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
                ),
                ("code_challenge_method", "S256"),
            ])
            .send()
    };
    let code = |answer: reqwest::Response| {
        assert_eq!(answer.status(), StatusCode::FOUND);
        let back = reqwest::Url::parse(answer.headers()["location"].to_str().unwrap()).unwrap();
        let q: std::collections::HashMap<_, _> = back.query_pairs().into_owned().collect();
        assert_eq!(q["state"], "s-1");
        q["code"].clone()
    };
    let exchange = |code: String, verifier: &str| {
        no_redirects
            .post(format!("{}/token", idp.issuer))
            .form(&[
                ("grant_type", "authorization_code"),
                ("code", code.as_str()),
                ("redirect_uri", redirect.as_str()),
                ("client_id", AUDIENCE),
                ("code_verifier", verifier),
            ])
            .send()
    };
    let wrong = exchange(
        code(authorize("n-1").await.unwrap()),
        "another-verifier-of-the-right-length-0123456789",
    )
    .await
    .unwrap();
    assert_eq!(wrong.status(), StatusCode::BAD_REQUEST);
    assert_eq!(idp.refused_verifiers(), 1);
    let answer = exchange(code(authorize("n-2").await.unwrap()), verifier)
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let answer: Value = answer.json().await.unwrap();
    let id_token = answer["id_token"].as_str().unwrap();
    let (run, rid) = pending_card(&srv, None).await;
    let (status, v) = approve(&srv, &run, &rid, id_token).await;
    assert_eq!(
        (status, v["decided_by"].as_str()),
        (StatusCode::OK, Some("oidc:frank")),
        "{v}"
    );
}

tollgate_tests::for_each_backend! {
    configured_projects => super::configured_projects;
    the_providers_namespace_is_its_own => super::the_providers_namespace_is_its_own;
    console_sign_in_with_pkce => super::console_sign_in_with_pkce;
    valid_tokens_decide => super::valid_tokens_decide;
    project_and_subject_claims => super::project_and_subject_claims;
    refused_tokens_decide_nothing => super::refused_tokens_decide_nothing;
    jwks_rotation => super::jwks_rotation;
    jwks_down_fails_closed => super::jwks_down_fails_closed;
}
