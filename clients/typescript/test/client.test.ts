import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { inspect } from "node:util";
import {
  Client,
  Conflict,
  InvalidRequest,
  NotFound,
  Unauthorized,
  Unavailable,
  argumentsHash,
  canonicalJson,
  type EventInput,
} from "../src/index.js";
import { recordingFetch, startServer, type Sent, type Server } from "./server.js";

describe("runs and appends", () => {
  let server: Server;
  before(async () => {
    server = await startServer();
  });
  after(async () => {
    await server?.stop();
  });

  test("a run is created, appended to, replayed and completed; its token is never shown", async () => {
    const client = new Client(server.url, { token: server.agentToken });
    const run = await client.createRun({ owner: "alice", channel_id: "C1", budget: { tools: { web_fetch: 1 }, call_ceiling: 5 } });
    assert.equal(run.created, true);
    assert.match(run.id, /^run-[0-9a-f]{32}$/);
    const seqs = await run.append({ type: "agent.message", text: "looking this up" }, { type: "tool.call", tool: "web_fetch" });
    assert.deepEqual(seqs, [2, 3]);
    const page = await run.events(0);
    assert.deepEqual(page.events.map((e) => e.type), ["run_started", "agent.message", "tool.call"]);
    for (const e of page.events.slice(1)) assert.match(String(e.event_id), /^[0-9a-f-]{36}$/, "an automatic event_id");
    assert.equal(page.events[0]!.owner, "alice");
    const ended = await run.complete({ summary: "done" });
    assert.deepEqual(ended, { run_id: run.id, status: "completed", sequence: 4 });
    assert.deepEqual(await run.complete({ summary: "done" }), ended, "completing again answers the same");
    const shown = `${inspect(run)} ${JSON.stringify(run)} ${inspect(client)}`;
    assert.ok(!shown.includes(run.token), "the run token is not shown");
    assert.ok(!shown.includes(server.agentToken), "the agent token is not shown");
  });

  test("a null run_id or event_id counts as not given: the client's own id makes a retry after a lost answer safe", async () => {
    // The first answer of the create and of the append is lost after the server acted on it.
    const lose = new Set(["/api/runs", "/events"]);
    const bodies: { path: string; body: Record<string, unknown> }[] = [];
    const client = new Client(server.url, {
      token: server.agentToken,
      retry: { baseDelayMs: 1 },
      fetch: async (input, init) => {
        const path = new URL(input instanceof Request ? input.url : String(input)).pathname;
        if (init?.method === "POST") bodies.push({ path, body: JSON.parse(String(init.body)) as Record<string, unknown> });
        const resp = await fetch(input, init);
        const lost = [...lose].find((suffix) => init?.method === "POST" && path.endsWith(suffix));
        if (lost === undefined) return resp;
        lose.delete(lost);
        await resp.body?.cancel();
        throw new TypeError("fetch failed");
      },
    });
    const run = await client.createRun({ run_id: null, delivery_id: null, owner: "alice" });
    const creates = bodies.filter((b) => b.path === "/api/runs").map((b) => b.body);
    assert.equal(creates.length, 2, "the create was retried");
    assert.match(String(creates[0]!.run_id), /^run-[0-9a-f]{32}$/);
    assert.equal(creates[1]!.run_id, creates[0]!.run_id);
    assert.ok(!("delivery_id" in creates[0]!), "null fields are left out");
    assert.equal(run.id, creates[0]!.run_id);
    assert.equal(run.created, false, "the retry found the run the first attempt made");

    const event = { type: "agent.message", text: "once", event_id: null } as unknown as EventInput;
    const seqs = await run.append(event);
    const appends = bodies.filter((b) => b.path.endsWith("/events")).map((b) => (b.body.events as { event_id: unknown }[])[0]!.event_id);
    assert.equal(appends.length, 2, "the append was retried");
    assert.match(String(appends[0]), /^[0-9a-f-]{36}$/);
    assert.equal(appends[1], appends[0]);
    const messages = (await run.events(0)).events.filter((e) => e.type === "agent.message");
    assert.deepEqual(
      messages.map((e) => e.sequence),
      seqs,
      "appended once",
    );
  });

  test("more than 99 events go in several requests, in order", async () => {
    const sent: Sent[] = [];
    const client = new Client(server.url, { token: server.agentToken, fetch: recordingFetch(sent) });
    const run = await client.createRun({});
    const events = Array.from({ length: 150 }, (_, i) => ({ type: "agent.message", n: i }));
    const seqs = await run.append(events);
    assert.deepEqual(seqs, Array.from({ length: 150 }, (_, i) => i + 2));
    assert.equal(sent.filter((s) => s.method === "POST" && s.path.endsWith("/events")).length, 2);
  });

  test("an append whose answer is lost is retried with the same event ids: nothing twice", async () => {
    let lose = 1;
    const sent: Sent[] = [];
    const real = recordingFetch(sent);
    // The request reaches the server and is carried out; its answer is lost on the way back.
    const lossy: typeof fetch = async (input, init) => {
      const resp = await real(input, init);
      if (init?.method === "POST" && String(input).endsWith("/events") && lose-- > 0) {
        await resp.body?.cancel();
        throw new TypeError("fetch failed", { cause: new Error("other side closed") });
      }
      return resp;
    };
    const client = new Client(server.url, { token: server.agentToken, fetch: lossy, retry: { baseDelayMs: 10 } });
    const run = await client.createRun({});
    const seqs = await run.append({ type: "agent.message", text: "once" }, { type: "tool.call", event_id: "call-1", tool: "x" });
    assert.deepEqual(seqs, [2, 3]);
    assert.equal(sent.filter((s) => s.method === "POST" && s.path.endsWith("/events")).length, 2, "sent twice");
    const page = await run.events(0);
    assert.deepEqual(page.events.map((e) => e.sequence), [1, 2, 3], "appended once");
  });

  test("429 and 5xx are retried after Retry-After; 4xx never", async () => {
    const sent: Sent[] = [];
    let busy = 1;
    const real = recordingFetch(sent);
    const busyOnce: typeof fetch = async (input, init) => {
      if (init?.method === "POST" && String(input).endsWith("/events") && busy-- > 0) {
        sent.push({ method: "POST", path: "(answered 503 by the test)", status: 503 });
        return new Response('{"error":"busy","code":"unavailable","request_id":"r-1"}', {
          status: 503,
          headers: { "retry-after": "1", "content-type": "application/json" },
        });
      }
      return real(input, init);
    };
    const client = new Client(server.url, { token: server.agentToken, fetch: busyOnce, retry: { baseDelayMs: 10 } });
    const run = await client.createRun({});
    const started = Date.now();
    assert.deepEqual(await run.append({ type: "agent.message" }), [2]);
    assert.ok(Date.now() - started >= 1000, "waited the Retry-After second");

    const before = sent.length;
    const err = await run.append({ type: "run_started" }).then(
      () => assert.fail("expected InvalidRequest"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof InvalidRequest, String(err));
    assert.equal(err.status, 400);
    assert.equal(err.code, "invalid_request");
    assert.match(err.requestId ?? "", /^[A-Za-z0-9._-]{1,64}$/);
    assert.equal(sent.length - before, 1, "a 400 is not retried");
  });

  test("503 after every attempt is Unavailable (retryable) with the server's code", async () => {
    let attempts = 0;
    const down: typeof fetch = async () => {
      attempts += 1;
      return new Response('{"error":"down","code":"unavailable","request_id":"r-9"}', { status: 503, headers: { "retry-after": "0" } });
    };
    const client = new Client(server.url, { token: server.agentToken, fetch: down, retry: { maxAttempts: 3, baseDelayMs: 1 } });
    const err = await client.createRun({}).then(
      () => assert.fail("expected Unavailable"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof Unavailable);
    assert.equal(err.retryable, true);
    assert.equal(err.code, "unavailable");
    assert.equal(err.requestId, "r-9");
    assert.equal(attempts, 3);
  });

  test("a delivery_id finds the same run again, and its receipt", async () => {
    const client = new Client(server.url, { token: server.agentToken });
    const deliveryId = `dlv-test-${randomUUID()}`;
    const first = await client.createRun({ delivery_id: deliveryId, owner: "alice" });
    const again = await client.createRun({ delivery_id: deliveryId, owner: "alice" });
    assert.equal(first.created, true);
    assert.equal(again.created, false);
    assert.equal(again.id, first.id);
    const found = await client.receipt(deliveryId);
    assert.equal(found.id, first.id);
    assert.equal(found.status, "running");
    assert.deepEqual(await found.append({ type: "agent.message" }), [2], "the receipt's token works");
    await assert.rejects(client.receipt(`dlv-none-${randomUUID()}`), NotFound);
  });

  test("appending after the end is a Conflict with the server's state", async () => {
    const client = new Client(server.url, { token: server.agentToken });
    const run = await client.createRun({});
    await run.fail({ reason: "gave up" });
    const err = await run.append({ type: "agent.message" }).then(
      () => assert.fail("expected Conflict"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof Conflict);
    assert.equal(err.status, 409);
    assert.equal(err.state, "run_terminal");
    assert.equal(err.code, "run_terminal");
    await assert.rejects(run.cancel(), (e: unknown) => e instanceof Conflict && e.state === "run_terminal");
  });

  test("a bad token is Unauthorized", async () => {
    const client = new Client(server.url, { token: "not-a-jwt" });
    await assert.rejects(client.createRun({}), (e: unknown) => e instanceof Unauthorized && e.code === "unauthorized");
  });
});

describe("arguments hash", () => {
  test("canonical JSON sorts keys at every depth, by UTF-16 code units, without whitespace", () => {
    const v = JSON.parse('{ "b": [ {"z": 1, "a": null} ], "a": "x\\"y", "c": 1.5 }');
    assert.equal(canonicalJson(v), '{"a":"x\\"y","b":[{"a":null,"z":1}],"c":1.5}');
    assert.equal(canonicalJson({ "\u{1F600}": 1, "\uFF61": 2 }), '{"\u{1F600}":1,"\uFF61":2}');
    assert.equal(argumentsHash({ b: 1, a: 2 }), argumentsHash({ a: 2, b: 1 }));
    assert.notEqual(argumentsHash({ a: 1 }), argumentsHash({ a: 2 }));
    // The Rust client's known vector: sha256("{}").
    assert.equal(argumentsHash({}), "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a");
  });
});
