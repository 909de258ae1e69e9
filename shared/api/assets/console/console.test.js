// Unit tests of the operator console's pure helpers, with node's test runner:
//   node --test shared/api/assets/console/
// (The page itself is driven in a real browser by tests/browser.rs.)
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const {
  readSse, BrokenStream, isEventStream, keyOf, markerOf, HIDDEN_CHARS, MAX_SSE_LINE,
  base64url, randomVerifier, isVerifier, pkceChallenge, authorizationUrl, jwtPayload, idTokenProblem,
} = require('./console.js');
const { webcrypto } = require('node:crypto');

// A response body that delivers `chunks` (strings) one read at a time.
function body(chunks) {
  const encoder = new TextEncoder();
  let i = 0;
  return new ReadableStream({
    pull(controller) {
      if (i < chunks.length) controller.enqueue(encoder.encode(chunks[i++]));
      else controller.close();
    },
  });
}

async function frames(chunks) {
  const seen = [];
  await readSse(body(chunks), (f) => seen.push(f));
  return seen;
}

test('frames are dispatched at a blank line, whatever the chunking', async () => {
  const seen = await frames([
    'retry: 2000\n\n',
    ': keep-alive\n',
    'id: 1\nevent: tool.approval_required\nda',
    'ta: {"sequence":1}\r',
    '\n\r\n',
    'id: 2\ndata: a\ndata: b\n\n',
    'event: done\ndata: {}\n\n',
  ]);
  assert.deepEqual(seen, [
    { id: null, event: null, data: [], retry: 2000 },
    { id: '1', event: 'tool.approval_required', data: ['{"sequence":1}'], retry: null },
    { id: '2', event: null, data: ['a', 'b'], retry: null },
    { id: null, event: 'done', data: ['{}'], retry: null },
  ]);
});

test('a retry hint that is not a number is ignored', async () => {
  const seen = await frames(['retry: soon\ndata: x\n\n']);
  assert.equal(seen[0].retry, null);
});

test('a line over the limit is a broken stream, not unbounded memory', async () => {
  const endless = 'data: ' + 'x'.repeat(MAX_SSE_LINE + 10);
  await assert.rejects(frames([endless]), BrokenStream);
  await assert.rejects(frames([endless + '\n\n']), BrokenStream);
});

test('a frame whose data adds up over the limit is a broken stream', async () => {
  const line = 'data: ' + 'y'.repeat(MAX_SSE_LINE / 4) + '\n';
  await assert.rejects(frames([line, line, line, line, line, '\n']), BrokenStream);
});

test('only text/event-stream answers are streams', () => {
  const resp = (type) => ({ headers: { get: () => type } });
  assert.ok(isEventStream(resp('text/event-stream')));
  assert.ok(isEventStream(resp('text/event-stream; charset=utf-8')));
  assert.ok(!isEventStream(resp('text/html')));
  assert.ok(!isEventStream(resp('text/event-streamx')));
  assert.ok(!isEventStream(resp(null)));
});

test('hidden characters are named, never shown as they act', () => {
  const text = 'https://example.com/\u202Egnp.exe';
  const found = [...text.matchAll(HIDDEN_CHARS)].map((m) => markerOf(m[0]));
  assert.deepEqual(found, ['<U+202E>']);
  assert.equal(markerOf('\u{E0041}'), '<U+E0041>');
  assert.equal([...'plain text'.matchAll(HIDDEN_CHARS)].length, 0);
});

test('cards are keyed by run and request', () => {
  // Run and request ids never hold a space ([A-Za-z0-9_.:-]), so the key is one pair's.
  assert.equal(keyOf('run-1', 'req-1'), 'run-1 req-1');
  assert.notEqual(keyOf('run-1', 'req-12'), keyOf('run-1r', 'eq-12'));
});

// ---- Sign-in with the identity provider (PKCE) ----------------------------------------

test("the S256 challenge of RFC 7636 Appendix B's verifier is the RFC's", async () => {
  // RFC 7636 Appendix B: code_verifier and code_challenge, as printed there.
  const verifier = 'dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk';
  assert.equal(await pkceChallenge(verifier, webcrypto.subtle), 'E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM');
});

test("base64url is RFC 7636 Appendix A's: no padding, - and _", () => {
  // Appendix B's verifier is the base64url of these 32 octets.
  const octets = [116, 24, 223, 180, 151, 153, 224, 37, 79, 250, 96, 125, 216, 173,
    187, 186, 22, 212, 37, 77, 105, 214, 191, 240, 91, 88, 5, 88, 83, 132, 141, 121];
  assert.equal(base64url(new Uint8Array(octets)), 'dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk');
  assert.equal(base64url(new Uint8Array([0xfb, 0xff])), '-_8');
});

test('verifiers are 43–128 unreserved characters, fresh each time', () => {
  const a = randomVerifier(webcrypto);
  const b = randomVerifier(webcrypto);
  assert.ok(isVerifier(a), a);
  assert.ok(a.length >= 43 && a.length <= 128, String(a.length));
  assert.notEqual(a, b);
  assert.ok(!isVerifier('x'.repeat(42)));
  assert.ok(!isVerifier('x'.repeat(129)));
  assert.ok(!isVerifier('a'.repeat(42) + '+'));
});

test('a challenge is never made of something that is not a verifier', async () => {
  await assert.rejects(pkceChallenge('short', webcrypto.subtle));
});

test('the authorization request carries the PKCE challenge, state and nonce', () => {
  const url = new URL(authorizationUrl(
    { authorization_endpoint: 'https://idp.example.com/authorize?tenant=t1', client_id: 'console', scopes: 'openid email' },
    { redirectUri: 'https://tollgate.example.com/console', state: 's1', nonce: 'n1', challenge: 'c1' },
  ));
  assert.equal(url.origin + url.pathname, 'https://idp.example.com/authorize');
  assert.deepEqual(Object.fromEntries(url.searchParams), {
    tenant: 't1',
    response_type: 'code',
    client_id: 'console',
    redirect_uri: 'https://tollgate.example.com/console',
    scope: 'openid email',
    state: 's1',
    nonce: 'n1',
    code_challenge: 'c1',
    code_challenge_method: 'S256',
  });
});

// An unsigned JWT with `claims` (the console reads claims; the API verifies signatures).
const jwt = (claims) => ['{"alg":"ES256"}', JSON.stringify(claims)]
  .map((p) => base64url(new TextEncoder().encode(p))).join('.') + '.sig';

test('an ID token is taken only with its nonce, issuer, audience and a future expiry', () => {
  const want = { nonce: 'n1', issuer: 'https://idp.example.com', clientId: 'console', nowSeconds: 1000 };
  const good = { nonce: 'n1', iss: 'https://idp.example.com', aud: 'console', exp: 1600, sub: 'ü-1' };
  assert.equal(jwtPayload(jwt(good)).sub, 'ü-1');
  assert.equal(idTokenProblem(jwt(good), want), null);
  assert.equal(idTokenProblem(jwt({ ...good, aud: ['other', 'console'] }), want), null);
  assert.match(idTokenProblem(jwt({ ...good, nonce: 'n2' }), want), /nonce/);
  assert.match(idTokenProblem(jwt({ ...good, nonce: undefined }), want), /nonce/);
  assert.match(idTokenProblem(jwt({ ...good, iss: 'https://evil.example.com' }), want), /issuer/);
  assert.match(idTokenProblem(jwt({ ...good, aud: 'other' }), want), /audience/);
  assert.match(idTokenProblem(jwt({ ...good, exp: 999 }), want), /expired/);
  assert.match(idTokenProblem('', want), /no ID token/);
  assert.match(idTokenProblem('a.!!!.c', want), /no ID token/);
});

// ---- The screens' helpers ----

const { runsQuery, utc, unknownOutcomes, policyExpiry, refusal } = require('./console.js');

test('the runs query carries the filters given, trimmed, and the cursor', () => {
  assert.equal(runsQuery({}, null), 'api/runs?limit=50');
  assert.equal(runsQuery({ status: 'running', owner: ' alice ', q: '' }, null, 3), 'api/runs?limit=3&status=running&owner=alice');
  // Encoded, so an owner or a prefix with & = + # cannot add parameters.
  assert.equal(runsQuery({ owner: 'a&b=c', q: 'run+1#x' }, 'abc'), 'api/runs?limit=50&owner=a%26b%3Dc&q=run%2B1%23x&after=abc');
  assert.equal(runsQuery({ status: '   ' }, ''), 'api/runs?limit=50');
  assert.equal(runsQuery({ project_id: 'acme' }, null, 5), 'api/runs?limit=5&project_id=acme');
});

test('times are shown in UTC to the second, blank when absent or not a time', () => {
  assert.equal(utc(0), '1970-01-01 00:00:00');
  assert.equal(utc(1767225661000), '2026-01-01 00:01:01');
  assert.equal(utc('2026-01-01T00:01:01.500Z'), '2026-01-01 00:01:01');
  for (const none of [null, undefined, '', 'soon', NaN]) assert.equal(utc(none), '');
});

test('only records whose outcome is unknown are offered for reconcile', () => {
  const records = [
    { tool_call_id: 'a', state: 'completed' },
    { tool_call_id: 'b', state: 'outcome_unknown' },
    { tool_call_id: 'c', state: 'dispatched' },
    null,
    { tool_call_id: 'd', state: 'outcome_unknown' },
  ];
  assert.deepEqual(unknownOutcomes(records).map((m) => m.tool_call_id), ['b', 'd']);
  assert.deepEqual(unknownOutcomes(undefined), []);
  assert.deepEqual(unknownOutcomes({ state: 'outcome_unknown' }), []);
});

test("a policy's expiry says it lasts until revoked, or when and by whom it was", () => {
  assert.equal(policyExpiry({}), 'none — until revoked');
  assert.equal(policyExpiry({ covers_nothing: true }), 'covers nothing (an older key form)');
  assert.equal(
    policyExpiry({ revoked_at: '2026-01-01T00:00:05Z', revoked_by: 'bob' }),
    'revoked 2026-01-01 00:00:05 by bob',
  );
});

test('a refusal is one line with the status and the error text', () => {
  assert.equal(refusal({ status: 403, body: { error: 'forbidden' } }), 'Tollgate answered 403: forbidden.');
  assert.equal(refusal({ status: 503, body: {} }), 'Tollgate answered 503.');
  assert.equal(refusal({ status: 400, body: { error: { nested: 1 } } }), 'Tollgate answered 400.');
});
