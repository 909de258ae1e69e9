import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import { after, before, describe, test } from "node:test";
import { Client, Decision, NotFound, RunEnded, type Event, type ReconnectInfo } from "../src/index.js";
import { cuttingProxy } from "./proxy.js";
import { decide, recordingFetch, startServer, Waiter, type Sent, type Server } from "./server.js";

describe("gate", () => {
  let server: Server;
  before(async () => {
    // Windows long enough that only the proxy's cuts end the drop test's connections.
    server = await startServer({ TOLLGATE_SSE_WINDOW_SECONDS: "60" });
  });
  after(async () => {
    await server?.stop();
  });

  test("the stream cut 20 times while waiting: the gate resumes with Last-Event-ID and returns the one decision", async () => {
    const CUTS = 20;
    const proxy = await cuttingProxy(server.port, CUTS, 700);
    try {
      const client = new Client(server.url, {
        websocket: false, // the SSE stream's own behaviour
        token: server.agentToken,
        streamUrl: proxy.url,
        reconnect: { maxDelayMs: 50 },
      });
      const run = await client.createRun({ owner: "ts-operator" });
      const requestId = randomUUID();
      const seen: Event[] = [];
      const reconnects: ReconnectInfo[] = [];
      const appended: number[] = [];
      const writes: Promise<unknown>[] = [];
      let decided: Promise<unknown> | undefined;
      // Each stream connection gets three padded events to carry (so each of the first 20
      // is cut mid-frame, after at least one whole frame); the first one the proxy lets
      // through gets the operator's approval.
      proxy.onRequest = (r) => {
        if (r.connection <= CUTS) {
          const pad = "x".repeat(300);
          writes.push(
            run
              .append(
                { type: "agent.message", text: `a${r.connection} ${pad}` },
                { type: "agent.message", text: `b${r.connection} ${pad}` },
                { type: "agent.message", text: `c${r.connection} ${pad}` },
              )
              .then((s) => appended.push(...s)),
          );
        } else if (decided === undefined) {
          decided = Promise.all(writes).then(() => decide(server, run.id, requestId, "approve"));
        }
      };
      const decision = await run.gate("web_fetch", {
        requestId,
        url: "https://example.com/docs",
        message: "fetch the docs",
        arguments: { url: "https://example.com/docs" },
        onEvent: (e) => seen.push(e),
        onReconnect: (info) => reconnects.push(info),
      });
      await decided;

      assert.ok(decision instanceof Decision);
      assert.equal(decision.approved, true);
      assert.equal(decision.state, "approved");
      assert.equal(decision.scope, "once");
      assert.equal(decision.decidedBy, "ts-operator");
      assert.equal(decision.auto, false);

      // Twenty cuts, each followed by a reconnect; the 21st connection carried the decision.
      assert.equal(proxy.cut(), CUTS);
      const dropped = reconnects.filter((r) => r.reason === "dropped");
      assert.equal(dropped.length, CUTS, JSON.stringify(reconnects.map((r) => r.reason)));
      assert.equal(reconnects.length, CUTS);
      const streams = proxy.requests.filter((r) => r.path.endsWith("/stream"));
      assert.equal(streams.length, CUTS + 1);

      // Every request named the last whole event it had: the first the card's own
      // sequence, each later one what the client had when it reconnected.
      const armSeq = Number(streams[0]!.lastEventId);
      assert.ok(armSeq >= 2, `the first request resumes after the card (${streams[0]!.lastEventId})`);
      for (let i = 1; i < streams.length; i++) {
        assert.equal(streams[i]!.lastEventId, String(reconnects[i - 1]!.after), `request ${i + 1}`);
        assert.ok(Number(streams[i]!.lastEventId) > Number(streams[i - 1]!.lastEventId), `request ${i + 1} made progress`);
      }

      // Nothing missed, nothing twice: exactly the run's events after the card, in order,
      // up to the resolution.
      const seqs = seen.map((e) => e.sequence);
      assert.deepEqual(seqs, Array.from({ length: seqs.length }, (_, i) => armSeq + 1 + i));
      const last = seen[seen.length - 1]!;
      assert.equal(last.type, "tool.approval_resolved");
      assert.equal(last.requestId, requestId);
      const page = await run.events(armSeq, 1000);
      const upTo = page.events.filter((e) => e.sequence <= last.sequence);
      assert.deepEqual(
        seen.map((e) => [e.sequence, e.type, e.event_id]),
        upTo.map((e) => [e.sequence, e.type, e.event_id]),
      );
      assert.equal(appended.length, 3 * CUTS);
      for (const s of appended) assert.ok(seqs.includes(s), `appended event ${s} was seen`);
    } finally {
      await proxy.close();
    }
  });

  test("a denial arrives as a decision with who denied", async () => {
    const sent: Sent[] = [];
    const requestId = randomUUID();
    let run: Awaited<ReturnType<Client["createRun"]>> | undefined;
    let decided: Promise<unknown> | undefined;
    const client = new Client(server.url, {
      websocket: false, // the SSE stream's own behaviour
      token: server.agentToken,
      fetch: recordingFetch(sent, (s) => {
        if (s.path.endsWith("/stream") && decided === undefined) decided = decide(server, run!.id, requestId, "deny");
      }),
    });
    run = await client.createRun({ owner: "ts-operator" });
    const decision = await run.gate("web_fetch", { requestId, url: "https://example.com" });
    await decided;
    assert.equal(decision.approved, false);
    assert.equal(decision.state, "denied");
    assert.equal(decision.decidedBy, "ts-operator");
    assert.equal(decision.scope, undefined);
  });

  test("an argument preview reaches the card, secrets redacted by the server", async () => {
    const requestId = randomUUID();
    let run: Awaited<ReturnType<Client["createRun"]>> | undefined;
    let seen: Promise<unknown> | undefined;
    // The decision is made once the gate's live stream is asked for: over SSE here.
    const client = new Client(server.url, {
      token: server.agentToken,
      websocket: false,
      fetch: recordingFetch([], (s) => {
        if (s.path.endsWith("/stream") && seen === undefined) {
          seen = (async () => {
            const resp = await fetch(`${server.url}/api/runs/${encodeURIComponent(run!.id)}/approvals`, {
              headers: { authorization: `Bearer ${server.operatorToken}` },
            });
            const body = (await resp.json()) as { approvals: Record<string, unknown>[] };
            await decide(server, run!.id, requestId, "deny");
            return body.approvals[0]?.arguments_preview;
          })();
        }
      }),
    });
    run = await client.createRun({ owner: "ts-operator" });
    const decision = await run.gate("send_email", {
      requestId,
      arguments: { to: "ops@example.com", password: "hunter2" },
      argumentsPreview: { to: "ops@example.com", password: "hunter2" },
    });
    assert.equal(decision.state, "denied");
    assert.deepEqual(await seen, { to: "ops@example.com", password: "[redacted]" });
  });

  test("a card nobody decides expires at its timeout", async () => {
    const client = new Client(server.url, { token: server.agentToken });
    const run = await client.createRun({ owner: "ts-operator" });
    const started = Date.now();
    const decision = await run.gate("web_fetch", { timeoutMs: 1000 });
    assert.equal(decision.state, "expired");
    assert.equal(decision.approved, false);
    assert.ok(Date.now() - started >= 900, "not before its timeout");
    const card = await run.approval(decision.requestId);
    assert.equal(card.state, "expired");
  });

  test("the signal aborts the wait and leaves the card pending", async () => {
    const ctrl = new AbortController();
    const client = new Client(server.url, {
      websocket: false, // the SSE stream's own behaviour
      token: server.agentToken,
      fetch: recordingFetch([], (s) => {
        if (s.path.endsWith("/stream")) setImmediate(() => ctrl.abort(new Error("stop waiting")));
      }),
    });
    const run = await client.createRun({});
    const requestId = randomUUID();
    await assert.rejects(run.gate("web_fetch", { requestId, signal: ctrl.signal }), /stop waiting/);
    assert.equal((await run.approval(requestId)).state, "pending");
  });

  test("the run ending while a gate waits is RunEnded", async () => {
    let run: Awaited<ReturnType<Client["createRun"]>> | undefined;
    let appended: Promise<unknown> | undefined;
    const client = new Client(server.url, {
      websocket: false, // the SSE stream's own behaviour
      token: server.agentToken,
      fetch: recordingFetch([], (s) => {
        // Once the gate waits on the stream, the agent says something...
        if (s.path.endsWith("/stream") && appended === undefined) appended = run!.append({ type: "agent.message", text: "still here" });
      }),
    });
    run = await client.createRun({});
    const requestId = randomUUID();
    const seen: string[] = [];
    const waiting = run.gate("web_fetch", {
      requestId,
      onEvent: (e) => {
        seen.push(e.type);
        // ...and, seeing it on the stream, the run is cancelled under the waiting gate.
        if (e.type === "agent.message") void run!.cancel({ reason: "user left" });
      },
    });
    await assert.rejects(waiting, RunEnded);
    await appended;
    // The run's end announces the card it closes, then the terminal event.
    assert.deepEqual(seen, ["agent.message", "tool.approval_resolved", "run_cancelled"]);
    const card = await run.approval(requestId);
    assert.equal(card.state, "expired");
    assert.equal(card.reason, "run_ended");
  });

  test("where the live stream is not offered, the gate polls the event pages", async () => {
    // A stream endpoint that answers 404, as an API without the streaming route does.
    let streamRequests = 0;
    let run: Awaited<ReturnType<Client["createRun"]>> | undefined;
    const requestId = randomUUID();
    let decided: Promise<unknown> | undefined;
    const noStream = createServer((req, res) => {
      streamRequests += 1;
      res.writeHead(404, { "content-type": "application/json" }).end('{"error":"no such route"}');
    });
    await new Promise<void>((r) => noStream.listen(0, "127.0.0.1", () => r()));
    const addr = noStream.address();
    const streamUrl = `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`;
    try {
      const sent: Sent[] = [];
      const client = new Client(server.url, {
        websocket: false, // the SSE stream's own behaviour
        token: server.agentToken,
        streamUrl,
        pollIntervalMs: 50,
        fetch: recordingFetch(sent, (s) => {
          // The first page read means the gate has fallen back to polling.
          if (s.path.endsWith("/events") && s.method === "GET" && decided === undefined) {
            decided = decide(server, run!.id, requestId, "approve");
          }
        }),
      });
      run = await client.createRun({ owner: "ts-operator" });
      const decision = await run.gate("web_fetch", { requestId });
      await decided;
      assert.equal(decision.state, "approved");
      assert.equal(streamRequests, 1, "the stream was tried once");
      assert.ok(sent.filter((s) => s.path.endsWith("/events") && s.method === "GET").length >= 1);
    } finally {
      await new Promise<void>((r) => noStream.close(() => r()));
    }
  });

  test("an unknown card is NotFound with the server's state, code and request id", async () => {
    const client = new Client(server.url, { token: server.agentToken });
    const run = await client.createRun({});
    const err = await run.approval("no-such-card").then(
      () => assert.fail("expected NotFound"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof NotFound);
    assert.equal(err.status, 404);
    assert.equal(err.state, "unknown");
    assert.equal(err.code, "not_found");
    assert.match(err.requestId ?? "", /^[A-Za-z0-9._-]{1,64}$/);
  });
});

describe("gate across windows", () => {
  let server: Server;
  before(async () => {
    server = await startServer({ TOLLGATE_SSE_WINDOW_SECONDS: "1" });
  });
  after(async () => {
    await server?.stop();
  });

  test("a wait longer than the stream's window resumes after each window's end", async () => {
    // The SSE stream's windows (over WebSocket there are none).
    const client = new Client(server.url, { token: server.agentToken, websocket: false, reconnect: { maxDelayMs: 100 } });
    const run = await client.createRun({ owner: "ts-operator" });
    const requestId = randomUUID();
    const reconnects = new Waiter<ReconnectInfo>();
    const seen: Event[] = [];
    reconnects
      .until((items) => items.filter((r) => r.reason === "window_end").length >= 2)
      .then(() => decide(server, run.id, requestId, "approve"));
    const decision = await run.gate("web_fetch", {
      requestId,
      onReconnect: (r) => reconnects.push(r),
      onEvent: (e) => seen.push(e),
    });
    assert.equal(decision.state, "approved");
    assert.ok(reconnects.items.length >= 2);
    assert.ok(reconnects.items.every((r) => r.reason === "window_end"), JSON.stringify(reconnects.items));
    // The resolution came once at most (the card itself may have said it first).
    assert.ok(seen.filter((e) => e.type === "tool.approval_resolved").length <= 1);
  });
});
