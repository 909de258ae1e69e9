// Tollgate operator console. Vanilla JS, no build step, no dependencies.
//
// Seed 003's card lifecycle:
//   tool.approval_required  -> a card with live Approve / Deny buttons
//   tool.approval_resolved  -> the card shows approved / denied / expired and who
//                              decided (decidedBy) briefly, then it is removed
//   a resolved decision answer (200 resolved:true) -> the card is no longer offered
//   404 {state:"unknown"}                          -> the card is hidden
//   503 {state:"agenthost_unreachable"}            -> retry offered, card stays pending
//
// Where cards come from: GET /api/approvals?state=pending on load and every 750 ms
// (so a new run's first card is on screen within a second)
// (reattach, and new runs' cards without a reload), and the live streams of the runs
// the console knows (fetch() with a streaming reader: EventSource cannot send an
// Authorization header). A stream resumes with Last-Event-ID after its window ends or
// a drop. The token lives in sessionStorage only; it is never put in a URL or logged.
//
// Signing in: a pasted operator token, or — when GET /api/console/sign-in names an
// identity provider — "Sign in with <provider>": the authorization code flow with PKCE
// (RFC 7636, S256) as a public client. The code verifier, `state` and `nonce` wait in
// sessionStorage during the round trip; on return `state` must match (else nothing is
// exchanged), the code is exchanged at the token endpoint with the verifier, and the ID
// token (its `aud` is the client id, the audience the API verifies) is kept — after its
// `nonce`, `iss` and `aud` are checked — like a pasted token. `code` and `state` are
// removed from the address at once. When the token expires the console signs out.
'use strict';

(() => {
  const TOKEN_KEY = 'tollgate.operatorToken';
  // The sign-in with the identity provider under way (verifier, state, nonce, …).
  const OIDC_PENDING_KEY = 'tollgate.oidcPending';
  const POLL_MS = 750;
  const RESOLVED_LINGER_MS = 4000;
  // Browsers open at most 6 HTTP/1.1 connections per origin: streams take at most 3
  // (plus the audit view's one), leaving room for the poll and decisions.
  const MAX_STREAMS = 3;
  const MAX_BACKOFF_MS = 15000;
  const STREAM_HELD_MS = 2000;
  const MAX_RUNS_KEPT = 200;
  // A card's URL longer than this (in code points) is shown shortened, its host kept.
  const URL_SHOWN_MAX = 160;
  // Longest SSE line (and a frame's data) the console accepts, in characters: a stream
  // that sends more is broken (it is dropped and resumed after a backoff).
  const MAX_SSE_LINE = 1024 * 1024;
  const SCOPE_LABELS = {
    once: 'once — this call only',
    tool: 'tool — this tool, this run',
    run: 'run — this run and its siblings',
    always: "always — all the owner's runs",
  };

  // Outside a browser (node's unit tests: console.test.js) the pure helpers are
  // exported and nothing starts.
  const inBrowser = typeof window !== 'undefined' && typeof document !== 'undefined';

  // The API lives beside the page: /console -> /, /stage/console -> /stage/.
  const base = inBrowser ? new URL('.', window.location.href) : null;
  const $ = (id) => document.getElementById(id);

  const state = {
    token: null,
    me: null,
    alwaysEligible: [],
    runs: new Map(), // run id -> Run
    cards: new Map(), // "run_id request_id" -> Card
    resolved: new Set(), // keys of cards that ended: never shown again
    pollTimer: null,
    polling: false,
    generation: 0, // bumped on sign-out: late answers of the old session are dropped
    lastPollOk: true,
    nextCardId: 1,
    signInConfig: null, // GET /api/console/sign-in's `oidc`, when the provider is offered
    expiryTimer: null,
  };

  const keyOf = (runId, requestId) => runId + ' ' + requestId;
  const sleep = (ms, signal) =>
    new Promise((resolve) => {
      const t = setTimeout(resolve, ms);
      if (signal) signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
    });

  // Characters that are invisible or reorder the text around them: bidi embeddings,
  // overrides and isolates (U+202A–U+202E, U+2066–U+2069), zero-width and other
  // invisible characters (U+200B–U+200F, U+2060, U+FEFF, …) and controls. Text from
  // agents (tool names, URLs, intentions, messages, who decided) could use them to show
  // a URL in another order than the one it is used in, so every text the page shows
  // has each of them replaced by a visible marker such as <U+202E>.
  // (Control and combining characters in the class are the point: they are what it finds.)
  // eslint-disable-next-line no-control-regex, no-misleading-character-class
  const HIDDEN_CHARS = /[\u0000-\u0008\u000B\u000C\u000E-\u001F\u007F-\u009F\u00AD\u034F\u061C\u115F\u1160\u17B4\u17B5\u180E\u200B-\u200F\u2028-\u202E\u2060-\u2064\u2066-\u206F\u3164\uFEFF\uFFA0\uFFF9-\uFFFB\u{E0000}-\u{E007F}]/gu;
  const markerOf = (ch) => '<U+' + ch.codePointAt(0).toString(16).toUpperCase().padStart(4, '0') + '>';
  const asText = (v) => (v === null || v === undefined ? '' : String(v));

  // A text as nodes: its visible runs as text, each hidden character as a marker.
  function shownNodes(value) {
    const text = asText(value);
    const nodes = [];
    let last = 0;
    for (const m of text.matchAll(HIDDEN_CHARS)) {
      if (m.index > last) nodes.push(text.slice(last, m.index));
      const marker = document.createElement('span');
      marker.className = 'hidden-char';
      marker.title = 'hidden character';
      marker.textContent = markerOf(m[0]);
      nodes.push(marker);
      last = m.index + m[0].length;
    }
    if (last < text.length) nodes.push(text.slice(last));
    return nodes;
  }

  // Sets a node's text (never HTML), hidden characters as markers.
  function setText(node, value) {
    node.replaceChildren(...shownNodes(value));
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') node.className = v;
      else if (k === 'text') node.append(...shownNodes(v));
      else if (k.startsWith('data-')) node.dataset[k.slice(5).replace(/-([a-z])/g, (_, c) => c.toUpperCase())] = v;
      else if (k === 'hidden') node.hidden = true;
      else node.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children) {
      if (typeof c === 'string') node.append(...shownNodes(c));
      else if (c !== null && c !== undefined) node.append(c);
    }
    return node;
  }

  function announce(text) {
    const region = $('announcer');
    const line = el('p', { text });
    region.append(line);
    while (region.childElementCount > 5) region.firstElementChild.remove();
  }

  function setConnection(text, level) {
    const c = $('connection');
    setText(c, text);
    if (level) c.dataset.level = level;
    else delete c.dataset.level;
  }

  // ---- Sign-in with the identity provider: PKCE helpers (pure; unit-tested) ------------

  // base64url without padding (RFC 7636 Appendix A) of bytes.
  function base64url(bytes) {
    let bin = '';
    for (const b of new Uint8Array(bytes)) bin += String.fromCharCode(b);
    return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  }

  // A code verifier: 48 random bytes, base64url — 64 characters of [A-Za-z0-9_-], within
  // RFC 7636's 43–128 unreserved characters. Also used for `state` and `nonce`.
  function randomVerifier(cryptoApi) {
    const bytes = new Uint8Array(48);
    cryptoApi.getRandomValues(bytes);
    return base64url(bytes);
  }

  const isVerifier = (v) => typeof v === 'string' && /^[A-Za-z0-9\-._~]{43,128}$/.test(v);

  // The S256 code challenge of a verifier: base64url(SHA-256(ASCII(verifier))).
  async function pkceChallenge(verifier, subtle) {
    if (!isVerifier(verifier)) throw new Error('not a code verifier');
    const digest = await subtle.digest('SHA-256', new TextEncoder().encode(verifier));
    return base64url(digest);
  }

  // The authorization request's address (the provider's endpoint, its own query kept).
  function authorizationUrl(cfg, { redirectUri, state, nonce, challenge }) {
    const url = new URL(cfg.authorization_endpoint);
    const params = {
      response_type: 'code',
      client_id: cfg.client_id,
      redirect_uri: redirectUri,
      scope: cfg.scopes,
      state,
      nonce,
      code_challenge: challenge,
      code_challenge_method: 'S256',
    };
    for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);
    return url.toString();
  }

  // A JWT's payload, decoded (not verified: the API verifies the token's signature).
  function jwtPayload(token) {
    const part = String(token).split('.')[1];
    if (!part) return null;
    try {
      const b64 = part.replace(/-/g, '+').replace(/_/g, '/');
      const bin = atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4));
      const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
      const v = JSON.parse(new TextDecoder().decode(bytes));
      return v && typeof v === 'object' && !Array.isArray(v) ? v : null;
    } catch (_) {
      return null;
    }
  }

  // Why an ID token from the code exchange is not this sign-in's (null: it is): its
  // nonce must be the one sent, its issuer and audience the configured ones, and it must
  // not have expired. (Its signature is the API's to verify.)
  function idTokenProblem(token, { nonce, issuer, clientId, nowSeconds }) {
    const p = jwtPayload(token);
    if (!p) return 'the provider answered no ID token';
    if (p.nonce !== nonce) return "the ID token's nonce is not this sign-in's";
    if (p.iss !== issuer) return "the ID token's issuer is not the configured one";
    const aud = Array.isArray(p.aud) ? p.aud : [p.aud];
    if (!aud.includes(clientId)) return "the ID token's audience is not the console";
    if (typeof p.exp !== 'number' || p.exp <= nowSeconds) return 'the ID token has expired';
    return null;
  }

  // ---- HTTP ---------------------------------------------------------------------------

  class Unauthorized extends Error {}

  async function api(path, { method = 'GET', body, signal } = {}) {
    const generation = state.generation;
    const headers = { Authorization: 'Bearer ' + state.token, Accept: 'application/json' };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const resp = await fetch(new URL(path, base), {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      credentials: 'omit',
      referrerPolicy: 'no-referrer',
      signal,
    });
    let data;
    try { data = await resp.json(); } catch (_) { data = null; }
    if (generation !== state.generation) throw new DOMException('signed out', 'AbortError');
    if (resp.status === 401) { unauthorized(data && data.error); throw new Unauthorized(); }
    // A success that is not JSON (say a proxy's HTML page) is no answer from Tollgate:
    // read as one, an empty listing would take the open cards for ended.
    if (resp.ok && !/^application\/json\s*(;|$)/i.test((resp.headers.get('content-type') || '').trim())) {
      throw new Error('not a JSON answer (HTTP ' + resp.status + ')');
    }
    return { status: resp.status, ok: resp.ok, body: data || {} };
  }

  // ---- Server-sent events over fetch ----------------------------------------------------

  // A stream that cannot be read as one: an answer that is not an event stream, or a
  // line or frame over MAX_SSE_LINE. Dropped and resumed after a backoff.
  class BrokenStream extends Error {}

  const isEventStream = (resp) =>
    /^text\/event-stream\s*(;|$)/i.test((resp.headers.get('content-type') || '').trim());

  // Reads one SSE response: calls onFrame({id, event, data, retry}) per dispatched frame.
  // A line (or a frame's data) over MAX_SSE_LINE characters throws BrokenStream; the
  // response is cancelled however the reading ends.
  async function readSse(body, onFrame) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    let frame = { id: null, event: null, data: [], retry: null };
    let frameSize = 0;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buf += value;
        for (;;) {
          const m = /\r\n|\r|\n/.exec(buf);
          if (!m) break;
          if (m[0] === '\r' && m.index === buf.length - 1) break; // maybe \r\n split across chunks
          const line = buf.slice(0, m.index);
          buf = buf.slice(m.index + m[0].length);
          if (line.length > MAX_SSE_LINE) throw new BrokenStream('an SSE line over the limit');
          if (line === '') {
            if (frame.data.length || frame.event || frame.retry !== null) onFrame(frame);
            frame = { id: null, event: null, data: [], retry: null };
            frameSize = 0;
            continue;
          }
          if (line[0] === ':') continue; // comment (keep-alive)
          const i = line.indexOf(':');
          const field = i < 0 ? line : line.slice(0, i);
          let v = i < 0 ? '' : line.slice(i + 1);
          if (v[0] === ' ') v = v.slice(1);
          if (field === 'data') {
            frameSize += v.length + 1;
            if (frameSize > MAX_SSE_LINE) throw new BrokenStream('an SSE frame over the limit');
            frame.data.push(v);
          } else if (field === 'event') frame.event = v;
          else if (field === 'id') frame.id = v;
          else if (field === 'retry' && /^\d+$/.test(v)) frame.retry = Number(v);
        }
        // What is left is the start of a line with no end yet.
        if (buf.length > MAX_SSE_LINE) throw new BrokenStream('an SSE line over the limit');
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  // Follows a run's stream from `cursor.lastSeq` until the run ends or `signal` aborts,
  // resuming with Last-Event-ID after each window's end or a drop. A failure (an error
  // status, an answer that is not text/event-stream — say a proxy's HTML page —, a broken
  // or oversized stream) waits a backoff that doubles up to MAX_BACKOFF_MS; only a stream
  // that delivered an event or ended cleanly starts it over.
  //   onEvent(event) for each event; onDone() after the terminal `done` frame;
  //   onGone(status) for 403/404 (not visible to this token);
  //   onRestart() for a 400 to a resume (Last-Event-ID past the run's last event: the
  //   run id names a new run now, its old events expired): the stream ends, the caller
  //   starts the run over from sequence 0 — retrying the old id would fail for ever.
  async function followStream(runId, cursor, signal, { onEvent, onDone, onGone, onRestart, onStatus }) {
    let backoff = 1000;
    while (!signal.aborted) {
      let wait = 1000;
      try {
        const headers = { Authorization: 'Bearer ' + state.token, Accept: 'text/event-stream' };
        if (cursor.lastSeq > 0) headers['Last-Event-ID'] = String(cursor.lastSeq);
        const resp = await fetch(new URL('api/runs/' + encodeURIComponent(runId) + '/events', base), {
          headers, signal, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer',
        });
        if (resp.status === 401) { unauthorized(); return; }
        if (resp.status === 403 || resp.status === 404) { onGone(resp.status); return; }
        if (resp.status === 400 && cursor.lastSeq > 0) {
          resp.body && resp.body.cancel().catch(() => {});
          onRestart();
          return;
        }
        if (!resp.ok || !resp.body) throw new Error('HTTP ' + resp.status);
        if (!isEventStream(resp)) {
          resp.body.cancel().catch(() => {});
          throw new BrokenStream('not an event stream: ' + (resp.headers.get('content-type') || 'no content type'));
        }
        if (onStatus) onStatus('live');
        const opened = performance.now();
        let done = false;
        await readSse(resp.body, (f) => {
          if (f.data.length) backoff = 1000; // the stream works: a later drop starts over at 1 s
          if (f.retry !== null) wait = f.retry;
          if (f.event === 'done' && f.id === null) { done = true; return; }
          if (!f.data.length) return;
          let event;
          try { event = JSON.parse(f.data.join('\n')); } catch (_) { return; }
          onEvent(event);
        });
        backoff = 1000;
        if (done) { onDone(); return; }
        // The window ended cleanly. After a long-lived window (tollgate serve, the
        // streaming Function URL) resume at once, so no event waits; a short one (a
        // buffered answer: what was there, then the end) resumes after the retry hint.
        if (performance.now() - opened >= STREAM_HELD_MS) wait = 0;
      } catch (e) {
        if (signal.aborted) return;
        if (onStatus) onStatus('retrying');
        wait = backoff;
        backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
      }
      await sleep(wait, signal);
    }
  }

  // ---- Runs ------------------------------------------------------------------------------

  class Run {
    constructor(id) {
      this.id = id;
      this.owner = undefined; // undefined: not known yet; null: the run has no owner
      this.lastSeq = 0;
      this.caughtUp = false;
      this.catchUp = null; // promise of a replay in progress
      this.terminal = false;
      this.gone = false;
      this.stream = null; // AbortController of the live stream
      this.live = false; // the stream is connected (cards carry data-stream="live")
      this.touched = Date.now();
      this.failures = 0; // catch-ups failed in a row (a broken answer, Tollgate unreachable)
      this.notBefore = 0; // no new stream before this time (ms since the epoch)
    }
  }

  function ensureRun(runId) {
    let run = state.runs.get(runId);
    if (!run) {
      run = new Run(runId);
      state.runs.set(runId, run);
    }
    return run;
  }

  // One event of a run, in sequence order; each sequence is applied once whichever way
  // (replay or stream) it arrives. `live`: from the stream (a new card shows at once);
  // replayed cards are collected in `found` and shown once the replay is complete.
  function applyEvent(run, ev, found) {
    const seq = Number(ev.sequence);
    if (!(seq > run.lastSeq)) return;
    run.lastSeq = seq;
    run.touched = Date.now();
    switch (ev.type) {
      case 'run_started':
        run.owner = typeof ev.owner === 'string' ? ev.owner : null;
        for (const card of state.cards.values()) if (card.runId === run.id) card.refreshScopes();
        break;
      case 'tool.approval_required': {
        const data = {
          runId: run.id,
          requestId: ev.requestId,
          displayId: ev.displayId,
          toolName: ev.toolName,
          url: ev.url,
          intention: ev.intention,
          message: ev.message,
          argumentsPreview: ev.argumentsPreview,
          expiresAt: null,
        };
        if (found) found.set(keyOf(run.id, ev.requestId), data);
        else showCard(data);
        break;
      }
      case 'tool.approval_resolved': {
        const key = keyOf(run.id, ev.requestId);
        if (found) found.delete(key);
        const outcome = ev.approved ? 'approved' : ev.expired ? 'expired' : 'denied';
        resolveCard(key, { state: outcome, by: ev.decidedBy, scope: ev.scope, reason: ev.decisionReason });
        break;
      }
      case 'run_completed':
      case 'run_failed':
      case 'run_cancelled':
        run.terminal = true;
        break;
      default:
        break; // heartbeats and everything else: nothing to show on a card
    }
  }

  // Replays a run from its last applied sequence (JSON pages): what happened while the
  // console was not listening. Cards still open at the end are shown.
  function catchUp(run) {
    if (run.catchUp) return run.catchUp;
    run.catchUp = (async () => {
      const found = new Map();
      try {
        for (let pages = 0; pages < 100; pages++) {
          const r = await api('api/runs/' + encodeURIComponent(run.id) + '/events?after=' + run.lastSeq + '&limit=1000');
          if (r.status === 403 || r.status === 404) { run.gone = true; break; }
          if (!r.ok) break;
          for (const ev of r.body.events || []) applyEvent(run, ev, found);
          if (r.body.terminal) run.terminal = true;
          if (!r.body.has_more) { run.caughtUp = true; break; }
        }
        for (const [key, data] of found) if (!state.resolved.has(key)) showCard(data);
      } finally {
        run.catchUp = null;
      }
    })();
    return run.catchUp;
  }

  function startStream(run) {
    const ctrl = new AbortController();
    run.stream = ctrl;
    (async () => {
      try {
        if (!run.caughtUp) await catchUp(run);
        run.failures = 0;
        if (ctrl.signal.aborted || run.terminal || run.gone) return;
        await followStream(run.id, run, ctrl.signal, {
          onEvent: (ev) => applyEvent(run, ev, null),
          onDone: () => { run.terminal = true; },
          onGone: () => { run.gone = true; },
          // Replayed from the start by the next catch-up (the reschedule below).
          onRestart: () => { run.lastSeq = 0; run.caughtUp = false; run.owner = undefined; },
          onStatus: (s) => setRunLive(run, s === 'live'),
        });
      } catch (e) {
        if (!(e instanceof Unauthorized) && !ctrl.signal.aborted) {
          // The catch-up failed: retried after a backoff (the poll does not hurry it).
          run.caughtUp = false;
          run.failures++;
          run.notBefore = Date.now() + Math.min(1000 * 2 ** (run.failures - 1), MAX_BACKOFF_MS);
        }
      } finally {
        setRunLive(run, false);
        if (run.stream === ctrl) run.stream = null;
        if (!ctrl.signal.aborted) setTimeout(reschedule, Math.max(1000, run.notBefore - Date.now()));
      }
    })();
  }

  function stopStream(run) {
    if (run.stream) {
      run.stream.abort();
      run.stream = null;
    }
    setRunLive(run, false);
  }

  function setRunLive(run, live) {
    run.live = live;
    for (const card of state.cards.values()) {
      if (card.runId !== run.id) continue;
      if (live) card.node.dataset.stream = 'live';
      else delete card.node.dataset.stream;
    }
  }

  // Streams the runs that matter most: those with open cards (soonest deadline first),
  // then the most recently active ones; the rest are covered by the poll.
  function reschedule() {
    if (!state.token) return;
    const pendingBy = new Map();
    for (const card of state.cards.values()) {
      if (card.state !== 'pending') continue;
      const due = card.expiresAt || Number.MAX_SAFE_INTEGER;
      pendingBy.set(card.runId, Math.min(pendingBy.get(card.runId) ?? Infinity, due));
    }
    const candidates = [...state.runs.values()].filter((r) => !r.terminal && !r.gone);
    candidates.sort((a, b) => {
      const pa = pendingBy.has(a.id) ? 0 : 1;
      const pb = pendingBy.has(b.id) ? 0 : 1;
      if (pa !== pb) return pa - pb;
      if (pa === 0) return pendingBy.get(a.id) - pendingBy.get(b.id);
      return b.touched - a.touched;
    });
    const want = new Set(candidates.slice(0, MAX_STREAMS).map((r) => r.id));
    for (const run of state.runs.values()) {
      if (want.has(run.id)) { if (!run.stream && Date.now() >= run.notBefore) startStream(run); }
      else stopStream(run);
    }
    // Forget the oldest quiet runs.
    if (state.runs.size > MAX_RUNS_KEPT) {
      const quiet = [...state.runs.values()]
        .filter((r) => !pendingBy.has(r.id) && !r.stream)
        .sort((a, b) => a.touched - b.touched);
      for (const r of quiet.slice(0, state.runs.size - MAX_RUNS_KEPT)) state.runs.delete(r.id);
    }
    const streams = [...state.runs.values()].filter((r) => r.stream).length;
    if (state.lastPollOk) {
      setConnection('Live · checking every ' + POLL_MS / 1000 + ' s · following ' + streams + (streams === 1 ? ' run' : ' runs'));
    }
  }

  // ---- Cards -------------------------------------------------------------------------------

  // A text with its middle left out when longer than `max` code points (a surrogate
  // pair is never split): nodes, the gap as a marker saying how much is left out.
  function elided(text, max) {
    const points = Array.from(text);
    if (points.length <= max) return shownNodes(text);
    const head = Math.max(1, Math.ceil(max * 2 / 3));
    const tail = Math.max(1, max - head);
    const gap = points.length - head - tail;
    return [
      ...shownNodes(points.slice(0, head).join('')),
      el('span', { class: 'elided', title: gap + ' characters left out' }, '…'),
      ...shownNodes(points.slice(points.length - tail).join('')),
    ];
  }

  // A card's URL as two rows. `Host`: the host a browser's URL parser finds in it (what
  // the call would reach), shown apart and prominently, so a URL that only starts like
  // a trusted name (user info before an "@", a long first part) cannot pass for it; or
  // that the URL has no host or does not parse. `URL`: the URL as the agent wrote it;
  // when long, shortened around its host (the parts before and after the host lose
  // their middle, the host never), with the whole of it one click away.
  function urlRows(value) {
    const raw = asText(value);
    let parsed;
    try { parsed = new URL(raw); } catch (_) { parsed = null; }
    const host = el('dd', { class: 'host' });
    if (!parsed) {
      host.append(el('span', { class: 'url-warning', text: 'The URL does not parse: it names no host.' }));
    } else if (!parsed.host) {
      host.append(el('span', { class: 'url-warning', text: 'No host: a “' + parsed.protocol + '” URL.' }));
    } else {
      host.append(el('strong', { class: 'url-host', text: parsed.host }));
      if (parsed.protocol !== 'https:' && parsed.protocol !== 'http:') host.append(' (' + parsed.protocol + ')');
      if (parsed.username || parsed.password) {
        host.append(el('span', { class: 'url-warning', text: 'The URL has user info: what comes before its “@” is not the host.' }));
      }
    }
    const url = el('code', { class: 'url' });
    const length = Array.from(raw).length;
    let full = null;
    if (length <= URL_SHOWN_MAX) {
      url.append(...shownNodes(raw));
    } else {
      if (parsed && parsed.host) {
        const userinfo = parsed.username + (parsed.password ? ':' + parsed.password : '');
        const rest = parsed.pathname + parsed.search + parsed.hash;
        url.append(parsed.protocol + '//');
        if (userinfo) url.append(...elided(userinfo, 24), '@');
        url.append(el('span', { class: 'url-host' }, parsed.host));
        url.append(...elided(rest, Math.max(40, URL_SHOWN_MAX - 40 - Array.from(parsed.host).length)));
      } else {
        url.append(...elided(raw, URL_SHOWN_MAX));
      }
      full = el('details', { class: 'full-url' },
        el('summary', { text: 'Whole URL (' + length + ' characters)' }),
        el('code', { text: raw }));
    }
    return [['Host', host], ['URL', el('dd', {}, url, full)]];
  }

  class Card {
    constructor(data) {
      this.key = keyOf(data.runId, data.requestId);
      this.runId = data.runId;
      this.requestId = data.requestId;
      this.toolName = data.toolName;
      this.expiresAt = data.expiresAt;
      this.state = 'pending';
      this.shownAt = performance.now();
      this.busy = false;
      const n = state.nextCardId++;
      const titleId = 'card-' + n + '-title';
      const scopeId = 'card-' + n + '-scope';
      const hintId = 'card-' + n + '-scope-hint';
      const reasonId = 'card-' + n + '-reason';
      this.title = el('h3', { id: titleId, tabindex: '-1' },
        el('span', { class: 'tool', text: data.toolName || 'tool' }),
        el('span', { class: 'display-id', text: data.displayId || String(data.requestId).slice(0, 8) }),
        data.heldBy === 'pod' ? el('span', { class: 'held-by', text: 'held by its pod' }) : null);
      this.owner = el('dd', { class: 'owner', text: '…' });
      this.time = el('time', { class: 'expires' });
      // The URL's host first (what the call would reach), then the URL itself.
      const rows = data.url ? urlRows(data.url) : [];
      rows.push(
        ['Run', el('dd', {}, el('code', { class: 'run-id', text: data.runId }))],
        ['Owner', this.owner],
        ['Request', el('dd', {}, el('code', { class: 'request-id', text: data.requestId }))],
      );
      if (data.intention) rows.push(['Intention', el('dd', { class: 'intention', text: data.intention })]);
      // What the agent chose to show of the arguments, as the server stored it (secrets
      // redacted there). Display only: the approval binds the arguments' hash.
      const preview = data.argumentsPreview;
      if (preview && typeof preview === 'object' && !Array.isArray(preview) && Object.keys(preview).length) {
        rows.push(['Arguments', el('dd', {}, el('pre', { class: 'arguments', text: JSON.stringify(preview, null, 2) }))]);
      }
      rows.push(['Expires', el('dd', {}, this.time)]);
      const dl = el('dl', {});
      for (const [k, v] of rows) dl.append(el('dt', { text: k }), v);
      this.scope = el('select', { id: scopeId, class: 'scope', 'aria-describedby': hintId });
      this.scopeHint = el('p', { id: hintId, class: 'scope-hint' });
      this.reason = el('input', { id: reasonId, class: 'reason', type: 'text', maxlength: '1024', autocomplete: 'off', placeholder: 'optional' });
      this.approveBtn = el('button', { type: 'button', class: 'approve', text: 'Approve' });
      this.denyBtn = el('button', { type: 'button', class: 'deny', text: 'Deny' });
      this.approveBtn.addEventListener('click', () => this.decide('approve'));
      this.denyBtn.addEventListener('click', () => this.decide('deny'));
      this.actions = el('div', { class: 'actions' },
        el('label', { for: scopeId, text: 'Scope' }), this.scope,
        el('label', { for: reasonId, text: 'Reason' }), this.reason,
        this.approveBtn, this.denyBtn, this.scopeHint);
      this.outcome = el('p', { class: 'outcome', role: 'status' });
      this.node = el('li', {
        class: 'card',
        'data-state': 'pending',
        'data-run-id': data.runId,
        'data-request-id': data.requestId,
        'aria-labelledby': titleId,
      }, el('article', {}, this.title, dl,
        data.message ? el('p', { class: 'message', text: data.message }) : null,
        this.actions, this.outcome));
      this.refreshScopes();
      this.tick();
    }

    // The scopes this operator may grant: beyond `once` only on the operator's own runs
    // (the run's `owner` from run_started), `always` only for always-eligible tools.
    refreshScopes() {
      const run = state.runs.get(this.runId);
      const owner = run ? run.owner : undefined;
      setText(this.owner, owner === undefined ? '…' : owner === null ? '(none)' : owner);
      const scopes = ['once'];
      let hint;
      if (owner === undefined) hint = "Checking the run's owner…";
      else if (owner !== null && owner === state.me) {
        scopes.push('tool', 'run');
        if (state.alwaysEligible.includes(this.toolName)) scopes.push('always');
        else hint = '“always” is not allowed for ' + this.toolName + '.';
      } else {
        hint = owner === null
          ? 'This run has no owner: only “once” can be granted.'
          : 'Only the run’s owner (' + owner + ') can grant a scope beyond “once”.';
      }
      const current = this.scope.value || 'once';
      const have = [...this.scope.options].map((o) => o.value).join(',');
      if (have !== scopes.join(',')) {
        this.scope.replaceChildren(...scopes.map((s) => el('option', { value: s, text: SCOPE_LABELS[s] })));
        this.scope.value = scopes.includes(current) ? current : 'once';
      }
      setText(this.scopeHint, hint || '');
      this.scopeHint.hidden = !hint;
    }

    tick() {
      if (!this.expiresAt) { setText(this.time, '—'); return; }
      const left = Math.round((this.expiresAt - Date.now()) / 1000);
      this.time.dateTime = new Date(this.expiresAt).toISOString();
      if (left > 0) {
        const m = Math.floor(left / 60);
        const s = left % 60;
        setText(this.time, 'in ' + (m ? m + ' min ' : '') + s + ' s');
      } else {
        setText(this.time, 'now (waiting for the server)');
      }
      this.time.classList.toggle('soon', left <= 30);
    }

    setBusy(busy) {
      this.busy = busy;
      this.approveBtn.disabled = busy;
      this.denyBtn.disabled = busy;
      this.scope.disabled = busy;
      this.reason.disabled = busy;
    }

    async decide(verb, scopeOverride) {
      if (this.state !== 'pending' || this.busy) return;
      const scope = scopeOverride || this.scope.value || 'once';
      this.setBusy(true);
      setText(this.outcome, verb === 'approve' ? 'Approving…' : 'Denying…');
      const path = 'api/runs/' + encodeURIComponent(this.runId) + (verb === 'approve' ? '/tool-approvals' : '/tool-denials');
      // The tool goes with the decision: the server refuses it if the card is for another.
      const body = verb === 'approve' ? { request_id: this.requestId, scope } : { request_id: this.requestId };
      if (this.toolName) body.tool_name = this.toolName;
      // Control characters are refused by the server; a pasted line break is a space.
      // eslint-disable-next-line no-control-regex
      const reason = this.reason.value.replace(/[\u0000-\u001f\u007f-\u009f]/g, ' ').trim();
      if (reason) body.reason = reason;
      let r;
      try {
        r = await api(path, { method: 'POST', body });
      } catch (e) {
        if (e instanceof Unauthorized || (e && e.name === 'AbortError')) return;
        this.offerRetry(verb, scope, 'Could not reach Tollgate; the card is still pending.');
        return;
      }
      if (this.state !== 'pending') return; // the stream resolved it meanwhile
      const b = r.body;
      if (r.status === 200 && b.resolved) {
        // The decision won, or the card had already ended: no longer offered.
        const mine = verb === 'approve' && b.state === 'approved' && b.decided_by === state.me;
        resolveCard(this.key, { state: b.state, by: b.decided_by, scope: mine ? scope : undefined, reason: b.decision_reason, grant: mine ? b.grant : undefined });
      } else if (r.status === 404 && b.state === 'unknown') {
        hideCard(this.key, 'Request ' + this.requestId.slice(0, 8) + ' no longer exists.');
      } else if (r.status === 503 && b.state === 'agenthost_unreachable') {
        this.offerRetry(verb, scope, 'The agent host is unreachable; the card is still pending.');
      } else if (r.status === 409 && b.state === 'pending') {
        this.setBusy(false);
        setText(this.outcome, 'The card cannot be decided now; it stays pending. Try again.');
      } else if (r.status >= 500 || r.status === 429) {
        this.offerRetry(verb, scope, 'Tollgate answered ' + r.status + (b.error ? ' (' + b.error + ')' : '') + '; the card is still pending.');
      } else {
        this.setBusy(false);
        setText(this.outcome, (b.error || 'Refused (' + r.status + ')') + '');
      }
    }

    offerRetry(verb, scope, text) {
      this.setBusy(false);
      const retry = el('button', { type: 'button', class: 'retry', text: verb === 'approve' ? 'Retry approve' : 'Retry deny' });
      retry.addEventListener('click', () => this.decide(verb, scope));
      this.outcome.replaceChildren(...shownNodes(text + ' '), retry);
      retry.focus();
    }

    // The decision is known: no more buttons; the outcome and who decided, then removal.
    showResolved(info) {
      this.state = info.state || 'resolved';
      const hadFocus = this.node.contains(document.activeElement);
      this.actions.remove();
      this.node.dataset.state = this.state;
      const by = info.by ? ' by ' + info.by : '';
      let text;
      if (this.state === 'approved') text = 'Approved' + by + (info.scope ? ' (scope ' + info.scope + ')' : '');
      else if (this.state === 'denied') text = 'Denied' + by;
      else if (this.state === 'expired') text = 'Expired — nobody decided in time';
      else text = 'Resolved' + by;
      if (info.reason && this.state !== 'expired') text += ': “' + info.reason + '”';
      // What later cards this approval approves without a human, as the server says.
      if (info.grant && info.grant.tool_name) text += ' — standing grant: ' + info.grant.tool_name + ' within scope ' + info.grant.scope;
      setText(this.outcome, text);
      setText(this.time, '—');
      announce(this.toolName + ' ' + this.requestId.slice(0, 8) + ': ' + text + '.');
      if (hadFocus) this.title.focus();
      setTimeout(() => removeCard(this.key), RESOLVED_LINGER_MS);
    }
  }

  function showCard(data) {
    if (!data.requestId) return;
    const key = keyOf(data.runId, data.requestId);
    if (state.resolved.has(key)) return;
    const existing = state.cards.get(key);
    if (existing) {
      if (data.expiresAt && !existing.expiresAt) { existing.expiresAt = data.expiresAt; existing.tick(); }
      return;
    }
    const run = ensureRun(data.runId);
    run.touched = Date.now();
    const card = new Card(data);
    if (run.live) card.node.dataset.stream = 'live';
    state.cards.set(key, card);
    $('cards').append(card.node);
    renderCount();
    announce('New approval request: ' + card.toolName + ' ' + card.requestId.slice(0, 8) + ' on run ' + card.runId + '.');
    reschedule();
  }

  function resolveCard(key, info) {
    state.resolved.add(key);
    const card = state.cards.get(key);
    if (!card) return;
    if (card.state === 'pending') {
      card.showResolved(info);
      renderCount();
      reschedule();
    } else if (info.by && card.outcome.textContent.indexOf(' by ') < 0 && card.state === info.state) {
      card.outcome.append(...shownNodes(' by ' + info.by));
    }
  }

  function hideCard(key, why) {
    state.resolved.add(key);
    if (!state.cards.has(key)) return;
    removeCard(key);
    if (why) announce(why);
  }

  function removeCard(key) {
    const card = state.cards.get(key);
    if (!card) return;
    const hadFocus = card.node.contains(document.activeElement);
    const next = card.node.nextElementSibling || card.node.previousElementSibling;
    card.node.remove();
    state.cards.delete(key);
    renderCount();
    if (hadFocus) {
      const target = next && next.querySelector('h3');
      (target || $('cards-heading')).focus();
    }
    reschedule();
  }

  function renderCount() {
    const pending = [...state.cards.values()].filter((c) => c.state === 'pending').length;
    setText($('count'), pending ? '(' + pending + ')' : '');
    $('empty').hidden = state.cards.size > 0;
    document.title = (pending ? '(' + pending + ') ' : '') + 'Tollgate — operator console';
  }

  function clearCards() {
    for (const card of state.cards.values()) card.node.remove();
    state.cards.clear();
    state.resolved.clear();
    for (const run of state.runs.values()) stopStream(run);
    state.runs.clear();
    renderCount();
  }

  // ---- Polling the open cards ------------------------------------------------------------

  async function poll() {
    if (!state.token || state.polling) return;
    state.polling = true;
    const started = performance.now();
    try {
      const r = await api('api/approvals?state=pending');
      if (!r.ok) {
        state.lastPollOk = false;
        setConnection('Tollgate answered ' + r.status + ' — retrying', 'warn');
        return;
      }
      state.lastPollOk = true;
      const listed = new Set();
      for (const c of r.body.approvals || []) {
        const key = keyOf(c.run_id, c.request_id);
        listed.add(key);
        const expiresAt = Date.parse(c.expires_at) || null;
        showCard({
          runId: c.run_id,
          requestId: c.request_id,
          displayId: c.display_id,
          toolName: c.tool_name,
          heldBy: c.held_by,
          url: c.url,
          intention: c.intention,
          message: c.message,
          argumentsPreview: c.arguments_preview,
          expiresAt,
        });
      }
      if (!r.body.has_more) {
        // Shown before this listing was asked for, yet not in it: it ended. Its run's
        // events tell how (and who decided); failing that, hide it.
        for (const card of [...state.cards.values()]) {
          if (card.state !== 'pending' || listed.has(card.key) || card.shownAt >= started) continue;
          const run = ensureRun(card.runId);
          catchUp(run).then(() => {
            const still = state.cards.get(card.key);
            if (still && still.state === 'pending') hideCard(card.key, 'Request ' + card.requestId.slice(0, 8) + ' is no longer pending.');
          }).catch(() => {});
        }
      }
      reschedule();
    } catch (e) {
      if (!(e instanceof Unauthorized) && !(e && e.name === 'AbortError')) {
        state.lastPollOk = false;
        setConnection('Tollgate unreachable — retrying', 'warn');
      }
    } finally {
      state.polling = false;
    }
  }

  function schedulePoll() {
    clearTimeout(state.pollTimer);
    if (!state.token) return;
    state.pollTimer = setTimeout(async () => {
      await poll();
      schedulePoll();
    }, POLL_MS);
  }

  // ---- Token and session -----------------------------------------------------------------

  function unauthorized(why) {
    signOut();
    setText($('token-error'), 'The token was refused' + (why ? ' (' + why + ')' : '') + '. Paste an operator token.');
  }

  function signOut() {
    state.generation++;
    state.token = null;
    state.me = null;
    try {
      sessionStorage.removeItem(TOKEN_KEY);
      sessionStorage.removeItem(OIDC_PENDING_KEY);
    } catch (_) { /* storage unavailable */ }
    clearTimeout(state.pollTimer);
    clearTimeout(state.expiryTimer);
    clearCards();
    stopAudit();
    resetScreens();
    $('session').hidden = true;
    $('token-form').hidden = false;
    setConnection('Not connected');
  }

  async function signIn(token) {
    state.token = token;
    setText($('token-error'), '');
    setConnection('Connecting…');
    let r;
    try {
      r = await api('api/console/config');
    } catch (e) {
      if (!(e instanceof Unauthorized)) {
        setConnection('Tollgate unreachable — retrying', 'warn');
        setTimeout(() => { if (state.token === token) signIn(token); }, 2000);
      }
      return;
    }
    if (!r.ok) {
      signOut();
      setText($('token-error'), r.status === 403
        ? 'This token is not an operator token.'
        : 'Tollgate answered ' + r.status + '.');
      return;
    }
    watchExpiry(token);
    state.me = r.body.sub;
    state.alwaysEligible = Array.isArray(r.body.always_eligible) ? r.body.always_eligible : [];
    setText($('me'), state.me);
    setText($('project'), r.body.project_id ? ' · project ' + r.body.project_id : '');
    $('token-form').hidden = true;
    $('session').hidden = false;
    for (const card of state.cards.values()) card.refreshScopes();
    await poll();
    schedulePoll();
  }

  // Signs out when the token expires (back to the sign-in).
  function watchExpiry(token) {
    clearTimeout(state.expiryTimer);
    const p = jwtPayload(token);
    if (!p || typeof p.exp !== 'number') return;
    const generation = state.generation;
    // (setTimeout's longest delay is about 24.8 days.)
    const ms = Math.min(Math.max(p.exp * 1000 - Date.now(), 0), 2 ** 31 - 1);
    state.expiryTimer = setTimeout(() => {
      if (state.generation !== generation || state.token !== token) return;
      signOut();
      setText($('token-error'), 'Your sign-in has expired. Sign in again.');
    }, ms);
  }

  // ---- Sign-in with the identity provider --------------------------------------------------

  function oidcFailed(why) {
    try { sessionStorage.removeItem(OIDC_PENDING_KEY); } catch (_) { /* storage unavailable */ }
    setText($('token-error'), 'Sign-in with the identity provider failed: ' + why + '. Not signed in.');
    setConnection('Not connected');
  }

  // "Sign in with …": a fresh verifier, state and nonce into sessionStorage, then to the
  // provider's authorization endpoint.
  async function startOidcSignIn() {
    const cfg = state.signInConfig;
    if (!cfg) return;
    setText($('token-error'), '');
    try {
      const verifier = randomVerifier(crypto);
      const pending = {
        verifier,
        state: randomVerifier(crypto),
        nonce: randomVerifier(crypto),
        redirectUri: cfg.redirect_uri || window.location.origin + window.location.pathname,
        tokenEndpoint: cfg.token_endpoint,
        clientId: cfg.client_id,
        issuer: cfg.issuer,
      };
      const challenge = await pkceChallenge(verifier, crypto.subtle);
      sessionStorage.setItem(OIDC_PENDING_KEY, JSON.stringify(pending));
      window.location.assign(authorizationUrl(cfg, { ...pending, challenge }));
    } catch (e) {
      oidcFailed('this browser cannot start it (' + (e && e.message ? e.message : e) + ')');
    }
  }

  // The provider sent the browser back (`code` and `state`, or `error`): answers whether
  // this was such a return (then handled: signed in, or an error shown).
  async function finishOidcSignIn() {
    const params = new URLSearchParams(window.location.search);
    if (!params.has('state') && !params.has('code') && !params.has('error')) return false;
    // Out of the address at once (history, screenshots, the next page's referrer).
    const clean = new URL(window.location.href);
    for (const k of ['code', 'state', 'error', 'error_description', 'error_uri', 'iss', 'session_state']) {
      clean.searchParams.delete(k);
    }
    window.history.replaceState(null, '', clean.toString());
    let pending;
    try { pending = JSON.parse(sessionStorage.getItem(OIDC_PENDING_KEY) || 'null'); } catch (_) { pending = null; }
    try { sessionStorage.removeItem(OIDC_PENDING_KEY); } catch (_) { /* storage unavailable */ }
    if (!pending || typeof pending.state !== 'string' || params.get('state') !== pending.state) {
      oidcFailed("the answer's state is not this tab's sign-in");
      return true;
    }
    if (params.has('error')) {
      oidcFailed('the provider answered ' + params.get('error'));
      return true;
    }
    setConnection('Signing in…');
    let answer;
    try {
      const body = new URLSearchParams({
        grant_type: 'authorization_code',
        code: params.get('code') || '',
        redirect_uri: pending.redirectUri,
        client_id: pending.clientId,
        code_verifier: pending.verifier,
      });
      const resp = await fetch(pending.tokenEndpoint, {
        method: 'POST',
        headers: { 'Content-Type': 'application/x-www-form-urlencoded', Accept: 'application/json' },
        body,
        cache: 'no-store',
        credentials: 'omit',
        referrerPolicy: 'no-referrer',
      });
      answer = await resp.json().catch(() => null);
      if (!resp.ok) {
        oidcFailed('the token endpoint answered ' + resp.status + (answer && answer.error ? ' (' + answer.error + ')' : ''));
        return true;
      }
    } catch (_) {
      oidcFailed('the token endpoint cannot be reached');
      return true;
    }
    const token = answer && typeof answer.id_token === 'string' ? answer.id_token : '';
    const problem = idTokenProblem(token, {
      nonce: pending.nonce, issuer: pending.issuer, clientId: pending.clientId, nowSeconds: Date.now() / 1000,
    });
    if (problem) {
      oidcFailed(problem);
      return true;
    }
    try { sessionStorage.setItem(TOKEN_KEY, token); } catch (_) { /* storage unavailable */ }
    signIn(token);
    return true;
  }

  // Offers "Sign in with …" when the server names an identity provider.
  async function loadSignIn() {
    let cfg = null;
    try {
      const resp = await fetch(new URL('api/console/sign-in', base), {
        headers: { Accept: 'application/json' }, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer',
      });
      if (resp.ok) cfg = ((await resp.json()) || {}).oidc || null;
    } catch (_) {
      cfg = null;
    }
    state.signInConfig = cfg;
    const button = $('oidc-sign-in');
    if (cfg && button) {
      setText(button, 'Sign in with ' + cfg.provider);
      button.hidden = false;
    }
    return cfg;
  }

  // ---- Audit view ----------------------------------------------------------------------------

  let audit = null;

  function stopAudit() {
    if (audit) audit.ctrl.abort();
    audit = null;
  }

  function auditRow(ev) {
    const details = {};
    for (const [k, v] of Object.entries(ev)) {
      if (!['protocol_version', 'run_id', 'sequence', 'type', 'timestamp_utc'].includes(k)) details[k] = v;
    }
    let text = JSON.stringify(details);
    if (text === '{}') text = '';
    return el('tr', { 'data-sequence': String(ev.sequence) },
      el('td', { class: 'seq', text: String(ev.sequence) }),
      el('td', { class: 'type' }, el('code', { text: ev.type })),
      el('td', { class: 'time', text: ev.timestamp_utc || '' }),
      el('td', {}, el('code', { text })));
  }

  function startAudit(runId, restarted) {
    stopAudit();
    const ctrl = new AbortController();
    const cursor = { lastSeq: 0 };
    audit = { ctrl, runId };
    const tbody = $('audit-events');
    tbody.replaceChildren();
    setText($('audit-caption'), 'Events of run ' + runId + ', in sequence order');
    $('audit-table').hidden = false;
    const status = $('audit-status');
    setText(status, restarted ? 'Run ' + runId + ' was created anew (its earlier events expired); loading it…' : 'Loading run ' + runId + '…');
    followStream(runId, cursor, ctrl.signal, {
      onEvent: (ev) => {
        const seq = Number(ev.sequence);
        if (!(seq > cursor.lastSeq)) return;
        cursor.lastSeq = seq;
        tbody.append(auditRow(ev));
        setText(status, cursor.lastSeq + ' events · following live');
      },
      onDone: () => { setText(status, cursor.lastSeq + ' events · the run has ended'); },
      onGone: (code) => {
        $('audit-table').hidden = true;
        setText(status, code === 404 ? 'No run ' + runId + ' (or not visible to this token).' : 'Not allowed to read run ' + runId + '.');
      },
      onRestart: () => { if (audit && audit.ctrl === ctrl) startAudit(runId, true); },
      onStatus: (s) => {
        if (s === 'retrying') setText(status, cursor.lastSeq + ' events · reconnecting…');
        else if (s === 'live' && cursor.lastSeq === 0) setText(status, 'Following run ' + runId + '…');
      },
    }).catch(() => {});
  }

  // ---- Screens: runs, policies, reconcile ----------------------------------------------------
  //
  // Each screen is a <section data-screen> shown by the tab bar; each loads when shown
  // (and on its own buttons), through the same api() as the cards, and shows every answer
  // as text. Runs: GET /api/runs (one project's, newest first, a cursor for "more");
  // a run's detail: its events (replay pages), pending cards and tool-call records.
  // Policies: GET /api/policies, DELETE /api/policies/{id} after a confirm step.
  // Reconcile: a run's records in outcome_unknown, each settled by what the operator
  // observed (POST …/reconcile {observed: applied | not_applied}) after a confirm step.

  const RUNS_PAGE = 50;
  const POLICIES_PAGE = 100;
  // Events of one run the detail view reads at most (replay pages of 1000).
  const DETAIL_EVENTS_MAX = 5000;
  const OBSERVED_LABELS = { applied: 'Mark succeeded', not_applied: 'Mark failed' };
  const OBSERVED_QUESTIONS = {
    applied: 'The call took effect at the tool?',
    not_applied: 'The call did not take effect at the tool?',
  };

  // The path and query of GET /api/runs for the runs screen's filters (blank ones left out).
  function runsQuery(filters, after, limit) {
    const params = new URLSearchParams();
    params.set('limit', String(limit || RUNS_PAGE));
    for (const k of ['status', 'owner', 'q', 'project_id']) {
      const v = filters && typeof filters[k] === 'string' ? filters[k].trim() : '';
      if (v) params.set(k, v);
    }
    if (after) params.set('after', after);
    return 'api/runs?' + params.toString();
  }

  // A time (milliseconds since the epoch, or RFC 3339) as "YYYY-MM-DD HH:MM:SS" UTC; ''
  // when absent or not a time.
  function utc(t) {
    if (t === null || t === undefined || t === '') return '';
    const ms = typeof t === 'number' ? t : Date.parse(String(t));
    if (!Number.isFinite(ms)) return '';
    const d = new Date(ms);
    if (Number.isNaN(d.getTime())) return '';
    return d.toISOString().slice(0, 19).replace('T', ' ');
  }

  // The records a reconcile applies to: those whose outcome is unknown.
  const unknownOutcomes = (mutations) =>
    (Array.isArray(mutations) ? mutations : []).filter((m) => m && m.state === 'outcome_unknown');

  // What a policy's expiry column says: grants have no expiry, they last until revoked.
  function policyExpiry(p) {
    if (p.revoked_at) return 'revoked ' + utc(p.revoked_at) + (p.revoked_by ? ' by ' + p.revoked_by : '');
    if (p.covers_nothing) return 'covers nothing (an older key form)';
    return 'none — until revoked';
  }

  // An answer that is not a success, as one line of text.
  function refusal(r) {
    const b = (r && r.body) || {};
    return 'Tollgate answered ' + r.status + (typeof b.error === 'string' && b.error ? ': ' + b.error : '') + '.';
  }

  const quiet = (e) => e instanceof Unauthorized || (e && e.name === 'AbortError');

  const views = {
    runs: { generation: 0, cursor: null, filters: {}, loaded: false, selected: null, detail: 0 },
    policies: { generation: 0, cursor: null },
    reconcile: { generation: 0 },
  };

  function showScreen(name) {
    for (const b of document.querySelectorAll('#screens button')) {
      if (b.dataset.screen === name) b.setAttribute('aria-current', 'page');
      else b.removeAttribute('aria-current');
    }
    for (const section of document.querySelectorAll('main > section[data-screen]')) {
      section.hidden = section.dataset.screen !== name;
    }
    if (!state.token) return;
    if (name === 'runs' && !views.runs.loaded) loadRuns(false);
    if (name === 'policies') loadPolicies(false);
  }

  // A confirm step in `cell`: the question, then Confirm (runs `act`) or Cancel
  // (runs `cancel`). Focus moves to Cancel, the safe choice.
  function confirmIn(cell, question, confirmLabel, act, cancel) {
    const yes = el('button', { type: 'button', class: 'confirm', text: confirmLabel });
    const no = el('button', { type: 'button', class: 'cancel', text: 'Cancel' });
    yes.addEventListener('click', () => { yes.disabled = true; no.disabled = true; act(); });
    no.addEventListener('click', cancel);
    cell.replaceChildren(el('span', { text: question + ' ' }), yes, no);
    no.focus();
  }

  // ---- Runs screen ----

  async function loadRuns(more) {
    const view = views.runs;
    const generation = ++view.generation;
    const message = $('runs-message');
    if (!more) {
      view.filters = {
        status: $('runs-status').value,
        owner: $('runs-owner').value,
        q: $('runs-q').value,
        project_id: $('runs-project').value,
      };
      view.cursor = null;
    }
    setText(message, 'Loading runs…');
    $('runs-more').disabled = true;
    let r;
    try {
      r = await api(runsQuery(view.filters, more ? view.cursor : null));
    } catch (e) {
      if (generation === view.generation && !quiet(e)) setText(message, 'Could not reach Tollgate.');
      return;
    } finally {
      if (generation === view.generation) $('runs-more').disabled = false;
    }
    if (generation !== view.generation) return;
    if (!r.ok) { setText(message, refusal(r)); return; }
    const rows = $('runs-rows');
    if (!more) rows.replaceChildren();
    for (const run of Array.isArray(r.body.runs) ? r.body.runs : []) rows.append(runRow(run));
    view.loaded = true;
    view.cursor = r.body.has_more && typeof r.body.next_cursor === 'string' ? r.body.next_cursor : null;
    $('runs-table').hidden = false;
    $('runs-more').hidden = !view.cursor;
    const n = rows.childElementCount;
    let text;
    if (n === 0) text = view.cursor ? 'No matching run yet; more runs to search.' : 'No runs match.';
    else text = n + (n === 1 ? ' run' : ' runs') + ' shown' + (view.cursor ? '; more available.' : '.');
    setText(message, text);
  }

  function runRow(run) {
    const open = el('button', { type: 'button', class: 'run-link', 'aria-label': 'Show run ' + run.run_id, text: run.run_id });
    open.addEventListener('click', () => showRun(run.run_id));
    return el('tr', { 'data-run-id': run.run_id, 'data-status': run.status },
      el('td', {}, open),
      el('td', { class: 'status', text: run.status }),
      el('td', { text: run.owner || '' }),
      el('td', { text: run.channel_id || '' }),
      el('td', { class: 'time', text: utc(run.created_at) }),
      el('td', { class: 'time', text: utc(run.ended_at) }));
  }

  // A run's detail: its events, pending cards and tool-call records, each read once.
  function showRun(runId) {
    const view = views.runs;
    const generation = ++view.detail;
    view.selected = runId;
    $('run-detail').hidden = false;
    setText($('run-detail-heading'), 'Run ' + runId);
    $('run-detail-heading').focus();
    const path = 'api/runs/' + encodeURIComponent(runId);
    const current = () => generation === view.detail && state.token !== null;
    loadRunEvents(path, current).catch(() => {});
    loadRunCards(path, current).catch(() => {});
    loadRunMutations(path, current).catch(() => {});
  }

  async function loadRunEvents(path, current) {
    const message = $('run-events-message');
    const rows = $('run-events');
    rows.replaceChildren();
    $('run-events-table').hidden = true;
    setText(message, 'Loading events…');
    let after = 0;
    let read = 0;
    for (;;) {
      let r;
      try {
        r = await api(path + '/events?after=' + after + '&limit=1000');
      } catch (e) {
        if (current() && !quiet(e)) setText(message, 'Could not reach Tollgate.');
        return;
      }
      if (!current()) return;
      if (!r.ok) { setText(message, refusal(r)); return; }
      const events = Array.isArray(r.body.events) ? r.body.events : [];
      for (const ev of events) rows.append(auditRow(ev));
      read += events.length;
      $('run-events-table').hidden = read === 0;
      const next = Number(r.body.next_after);
      if (!r.body.has_more || !(next > after) || read >= DETAIL_EVENTS_MAX) {
        let text = read + (read === 1 ? ' event' : ' events');
        if (r.body.terminal) text += ' · the run has ended';
        else if (r.body.has_more) text += ' · more not shown';
        setText(message, text + '.');
        return;
      }
      after = next;
    }
  }

  async function loadRunCards(path, current) {
    const message = $('run-cards-message');
    const list = $('run-cards');
    list.replaceChildren();
    setText(message, 'Loading cards…');
    let r;
    try { r = await api(path + '/approvals?state=pending'); } catch (e) {
      if (current() && !quiet(e)) setText(message, 'Could not reach Tollgate.');
      return;
    }
    if (!current()) return;
    if (!r.ok) { setText(message, refusal(r)); return; }
    const cards = Array.isArray(r.body.approvals) ? r.body.approvals : [];
    for (const c of cards) {
      list.append(el('li', { 'data-request-id': c.request_id },
        el('code', { text: c.tool_name }), ' · request ' + c.request_id + (c.expires_at ? ' · expires ' + utc(c.expires_at) + ' UTC' : '')));
    }
    setText(message, cards.length ? cards.length + ' pending (decide them under Approvals).' : 'No pending cards.');
  }

  async function loadRunMutations(path, current) {
    const message = $('run-mutations-message');
    const rows = $('run-mutations');
    rows.replaceChildren();
    $('run-mutations-table').hidden = true;
    setText(message, 'Loading records…');
    let r;
    try { r = await api(path + '/mutations'); } catch (e) {
      if (current() && !quiet(e)) setText(message, 'Could not reach Tollgate.');
      return;
    }
    if (!current()) return;
    if (!r.ok) { setText(message, refusal(r)); return; }
    const records = Array.isArray(r.body.mutations) ? r.body.mutations : [];
    for (const m of records) {
      rows.append(el('tr', { 'data-tool-call-id': m.tool_call_id, 'data-approval-id': m.approval_id, 'data-state': m.state },
        el('td', {}, el('code', { text: m.tool_name })),
        el('td', {}, el('code', { text: m.tool_call_id })),
        el('td', {}, el('code', { text: m.approval_id })),
        el('td', { text: m.state }),
        el('td', { text: m.reason || '' })));
    }
    $('run-mutations-table').hidden = records.length === 0;
    const unknown = unknownOutcomes(records).length;
    setText(message, records.length
      ? records.length + (records.length === 1 ? ' record' : ' records') + (unknown ? ', ' + unknown + ' with an unknown outcome (Reconcile this run).' : '.')
      : 'No tool-call records.');
  }

  // ---- Policies screen ----

  async function loadPolicies(more) {
    const view = views.policies;
    const generation = ++view.generation;
    const message = $('policies-message');
    if (!more) view.cursor = null;
    setText(message, 'Loading policies…');
    let query = 'api/policies?limit=' + POLICIES_PAGE;
    if (more && view.cursor) query += '&cursor=' + encodeURIComponent(view.cursor);
    let r;
    try { r = await api(query); } catch (e) {
      if (generation === view.generation && !quiet(e)) setText(message, 'Could not reach Tollgate.');
      return;
    }
    if (generation !== view.generation) return;
    if (!r.ok) { setText(message, refusal(r)); return; }
    const rows = $('policies-rows');
    if (!more) rows.replaceChildren();
    for (const p of Array.isArray(r.body.policies) ? r.body.policies : []) rows.append(policyRow(p));
    view.cursor = r.body.has_more && typeof r.body.next_cursor === 'string' ? r.body.next_cursor : null;
    $('policies-table').hidden = rows.childElementCount === 0;
    $('policies-more').hidden = !view.cursor;
    const n = rows.childElementCount;
    setText(message, n ? n + (n === 1 ? ' grant' : ' grants') + ' shown' + (view.cursor ? '; more available.' : '.') : 'No grants.');
  }

  function policyRow(p) {
    const action = el('td', { class: 'actions' });
    const expiry = el('td', { class: 'expiry', text: policyExpiry(p) });
    const row = el('tr', { 'data-policy-id': p.policy_id, 'data-state': p.revoked_at ? 'revoked' : 'live' },
      el('td', {}, el('code', { text: p.tool_name })),
      el('td', { text: p.scope }),
      el('td', { text: p.owner || '' }),
      el('td', { text: p.granted_by }),
      el('td', { class: 'time', text: utc(p.granted_at) }),
      expiry,
      action);
    if (!p.revoked_at) offerRevoke(p, row, action, expiry);
    return row;
  }

  function offerRevoke(p, row, action, expiry, note) {
    const what = p.tool_name + ' (scope ' + p.scope + ')';
    const button = el('button', { type: 'button', class: 'revoke', 'aria-label': 'Revoke the grant of ' + what, text: 'Revoke' });
    button.addEventListener('click', () => {
      confirmIn(action, 'Revoke ' + what + '?', 'Confirm revoke',
        () => revokePolicy(p, row, action, expiry),
        () => { offerRevoke(p, row, action, expiry); action.querySelector('button').focus(); });
    });
    action.replaceChildren(button);
    if (note) action.append(el('span', { class: 'error', role: 'alert', text: ' ' + note }));
  }

  async function revokePolicy(p, row, action, expiry) {
    let r;
    try {
      r = await api('api/policies/' + encodeURIComponent(p.policy_id), { method: 'DELETE' });
    } catch (e) {
      if (!quiet(e)) offerRevoke(p, row, action, expiry, 'No answer from Tollgate: the revoke may or may not have been recorded. Reload the list to see.');
      return;
    }
    if (!r.ok) {
      offerRevoke(p, row, action, expiry, refusal(r));
      return;
    }
    const revoked = r.body && r.body.revoked_at ? r.body : Object.assign({}, p, { revoked_at: new Date().toISOString() });
    row.dataset.state = 'revoked';
    setText(expiry, policyExpiry(revoked));
    action.replaceChildren(el('span', { class: 'result', role: 'status', text: 'Revoked' }));
    announce('Revoked the grant of ' + p.tool_name + ' (scope ' + p.scope + ').');
  }

  // ---- Reconcile screen ----

  async function loadReconcile(runId) {
    const view = views.reconcile;
    const generation = ++view.generation;
    const message = $('reconcile-message');
    const rows = $('reconcile-rows');
    rows.replaceChildren();
    $('reconcile-table').hidden = true;
    setText(message, 'Loading the records of run ' + runId + '…');
    let r;
    try { r = await api('api/runs/' + encodeURIComponent(runId) + '/mutations'); } catch (e) {
      if (generation === view.generation && !quiet(e)) setText(message, 'Could not reach Tollgate.');
      return;
    }
    if (generation !== view.generation) return;
    if (!r.ok) {
      setText(message, r.status === 404 ? 'No run ' + runId + ' (or not visible to this token).' : refusal(r));
      return;
    }
    const unknown = unknownOutcomes(r.body.mutations);
    for (const m of unknown) rows.append(reconcileRow(runId, m));
    setText($('reconcile-caption'), 'Calls of run ' + runId + ' whose outcome is unknown');
    $('reconcile-table').hidden = unknown.length === 0;
    setText(message, unknown.length
      ? unknown.length + (unknown.length === 1 ? ' call' : ' calls') + ' with an unknown outcome.'
      : 'Run ' + runId + ' has no call with an unknown outcome.');
  }

  function reconcileRow(runId, m) {
    const action = el('td', { class: 'actions' });
    const row = el('tr', { 'data-tool-call-id': m.tool_call_id, 'data-approval-id': m.approval_id, 'data-state': m.state },
      el('td', {}, el('code', { text: m.tool_name })),
      el('td', {}, el('code', { text: m.tool_call_id })),
      el('td', {}, el('code', { text: m.approval_id })),
      el('td', {}, el('code', { text: m.error === undefined || m.error === null ? '' : JSON.stringify(m.error) })),
      action);
    offerReconcile(runId, m, row, action);
    return row;
  }

  function offerReconcile(runId, m, row, action, note) {
    const buttons = Object.keys(OBSERVED_LABELS).map((observed) => {
      const b = el('button', {
        type: 'button',
        class: observed === 'applied' ? 'mark-succeeded' : 'mark-failed',
        'aria-label': OBSERVED_LABELS[observed] + ': ' + m.tool_name + ' call ' + m.tool_call_id + ', attempt ' + m.approval_id,
        text: OBSERVED_LABELS[observed],
      });
      b.addEventListener('click', () => {
        confirmIn(action, OBSERVED_QUESTIONS[observed], 'Confirm ' + OBSERVED_LABELS[observed].toLowerCase(),
          () => reconcileOne(runId, m, observed, row, action),
          () => { offerReconcile(runId, m, row, action); action.querySelector('button').focus(); });
      });
      return b;
    });
    action.replaceChildren(...buttons);
    if (note) action.append(el('span', { class: 'error', role: 'alert', text: ' ' + note }));
  }

  async function reconcileOne(runId, m, observed, row, action) {
    const path = 'api/runs/' + encodeURIComponent(runId) + '/mutations/' + encodeURIComponent(m.tool_call_id) +
      '/' + encodeURIComponent(m.approval_id) + '/reconcile';
    let r;
    try {
      r = await api(path, { method: 'POST', body: { observed } });
    } catch (e) {
      if (!quiet(e)) offerReconcile(runId, m, row, action, 'No answer from Tollgate: the reconcile may or may not have been recorded. Reload the run to see.');
      return;
    }
    if (!r.ok) {
      offerReconcile(runId, m, row, action, refusal(r));
      return;
    }
    const now = typeof r.body.state === 'string' ? r.body.state : 'recorded';
    row.dataset.state = now;
    const text = 'Recorded: now ' + now + (r.body.reason ? ' (' + r.body.reason + ')' : '') + '.';
    action.replaceChildren(el('span', { class: 'result', role: 'status', text }));
    announce(m.tool_name + ' call ' + m.tool_call_id + ': ' + text);
  }

  // Signed out: every screen forgets what it showed.
  function resetScreens() {
    for (const view of Object.values(views)) view.generation++;
    views.runs.detail++;
    views.runs.loaded = false;
    views.runs.cursor = null;
    views.runs.selected = null;
    views.policies.cursor = null;
    for (const id of ['runs-rows', 'run-events', 'run-cards', 'run-mutations', 'policies-rows', 'reconcile-rows']) $(id).replaceChildren();
    for (const id of ['runs-table', 'runs-more', 'run-detail', 'policies-table', 'policies-more', 'reconcile-table']) $(id).hidden = true;
    for (const id of ['runs-message', 'policies-message', 'reconcile-message']) setText($(id), '');
  }

  function initScreens() {
    for (const b of document.querySelectorAll('#screens button')) {
      b.addEventListener('click', () => showScreen(b.dataset.screen));
    }
    $('runs-form').addEventListener('submit', (e) => {
      e.preventDefault();
      if (!state.token) { setText($('runs-message'), 'Paste an operator token first.'); return; }
      loadRuns(false);
    });
    $('runs-more').addEventListener('click', () => loadRuns(true));
    $('policies-refresh').addEventListener('click', () => {
      if (!state.token) { setText($('policies-message'), 'Paste an operator token first.'); return; }
      loadPolicies(false);
    });
    $('policies-more').addEventListener('click', () => loadPolicies(true));
    $('run-detail-reconcile').addEventListener('click', () => {
      const runId = views.runs.selected;
      if (!runId) return;
      $('reconcile-run').value = runId;
      showScreen('reconcile');
      loadReconcile(runId);
    });
    $('reconcile-form').addEventListener('submit', (e) => {
      e.preventDefault();
      const runId = $('reconcile-run').value.trim();
      if (!runId) return;
      if (!state.token) { setText($('reconcile-message'), 'Paste an operator token first.'); return; }
      loadReconcile(runId);
    });
  }

  // ---- Start-up ----------------------------------------------------------------------------------

  async function init() {
    $('token-form').addEventListener('submit', (e) => {
      e.preventDefault();
      const input = $('token');
      const token = input.value.trim().replace(/^bearer\s+/i, '');
      input.value = '';
      if (!token) return;
      try { sessionStorage.setItem(TOKEN_KEY, token); } catch (_) { /* storage unavailable */ }
      signIn(token);
    });
    $('sign-out').addEventListener('click', () => {
      signOut();
      $('token').focus();
    });
    $('audit-form').addEventListener('submit', (e) => {
      e.preventDefault();
      const runId = $('audit-run').value.trim();
      if (!runId) return;
      if (!state.token) { setText($('audit-status'), 'Paste an operator token first.'); return; }
      startAudit(runId);
    });
    initScreens();
    setInterval(() => { for (const card of state.cards.values()) if (card.state === 'pending') card.tick(); }, 1000);
    renderCount();
    const oidcButton = $('oidc-sign-in');
    if (oidcButton) oidcButton.addEventListener('click', () => { startOidcSignIn(); });
    await loadSignIn();
    if (await finishOidcSignIn()) return;
    if (state.token) return; // a token was pasted meanwhile
    let saved;
    try { saved = sessionStorage.getItem(TOKEN_KEY); } catch (_) { saved = null; }
    if (saved) signIn(saved);
    else {
      setConnection('Not connected');
      $('token').focus();
    }
  }

  if (!inBrowser) {
    module.exports = {
      readSse, BrokenStream, isEventStream, keyOf, markerOf, HIDDEN_CHARS, MAX_SSE_LINE,
      runsQuery, utc, unknownOutcomes, policyExpiry, refusal,
      base64url, randomVerifier, isVerifier, pkceChallenge, authorizationUrl, jwtPayload, idTokenProblem,
    };
    return;
  }
  init();
})();
