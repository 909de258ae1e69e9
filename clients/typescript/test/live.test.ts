// Following runs over WebSocket against a real server: backlog, live events and the end
// on one connection; every sequence once and in order across repeated cuts and lost
// frames; refused credentials; SSE where no WebSocket is advertised or it cannot be
// opened; a gate's decision arriving over WebSocket.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";
import {
  Client,
  Forbidden,
  LiveConnection,
  resolveWebSocketUrl,
  Unauthorized,
  WsUnavailable,
  type Event,
  type LiveEvent,
  type Run,
} from "../src/index.js";
import { decide, startServer, type Server } from "./server.js";
import { wsProxy } from "./wsproxy.js";

async function collect(live: LiveConnection, runId: string, after = 0): Promise<LiveEvent[]> {
  const out: LiveEvent[] = [];
  for await (const e of live.follow(runId, after)) out.push(e);
  return out;
}

/** Appends `count` messages, `batch` per request, then completes the run. */
async function writer(run: Run, count: number, batch = 1): Promise<void> {
  for (let written = 0; written < count; ) {
    const n = Math.min(batch, count - written);
    await run.append(Array.from({ length: n }, (_, i) => ({ type: "agent.message", text: `m${written + i}` })));
    written += n;
  }
  await run.complete();
}

async function until(what: string, check: () => boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function lastSequence(run: Run): Promise<number> {
  const page = await run.events(0, 1000);
  return page.events[page.events.length - 1]!.sequence;
}

const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

describe("live over WebSocket", () => {
  let server: Server;
  before(async () => {
    server = await startServer();
  });
  after(async () => {
    await server?.stop();
  });

  test("the advertised endpoint resolves against the base URL", () => {
    assert.equal(resolveWebSocketUrl("http://127.0.0.1:8080", "/api/ws"), "ws://127.0.0.1:8080/api/ws");
    assert.equal(resolveWebSocketUrl("https://api.example.com/prod/", "/api/ws"), "wss://api.example.com/prod/api/ws");
    assert.equal(resolveWebSocketUrl("https://a.example", "wss://ws.example.com/live"), "wss://ws.example.com/live");
    assert.equal(resolveWebSocketUrl("https://a.example", "https://ws.example.com/x"), "wss://ws.example.com/x");
    assert.equal(resolveWebSocketUrl("https://a.example", "ftp://x"), undefined);
    assert.equal(resolveWebSocketUrl("https://a.example", "not a url"), undefined);
  });

  test("two runs on one connection: backlog, live events and the end, each sequence once and in order", async () => {
    const proxy = await wsProxy(server.port);
    try {
      const client = new Client(proxy.url, { token: server.agentToken });
      const a = await client.createRun({ owner: "alice" });
      const b = await client.createRun({ owner: "alice" });
      for (const run of [a, b]) await run.append(range(0, 4).map((i) => ({ type: "agent.message", text: String(i) })));
      const live = await client.live();
      try {
        const followA = collect(live, a.id);
        const followB = collect(live, b.id, 3);
        await Promise.all([writer(a, 20), writer(b, 7)]);
        const [gotA, gotB] = await Promise.all([followA, followB]);
        assert.equal(live.connections, 1);
        assert.equal(proxy.upgrades, 1);
        const pageA = await a.events(0, 1000);
        const pageB = await b.events(0, 1000);
        assert.deepEqual(gotA.map((e) => e.sequence), pageA.events.map((e) => e.sequence));
        assert.deepEqual(gotA.map((e) => e.sequence), range(1, gotA.length));
        assert.deepEqual(gotB.map((e) => e.sequence), pageB.events.filter((e) => e.sequence > 3).map((e) => e.sequence));
        assert.deepEqual(gotA.map((e) => e.data), pageA.events); // as replay serves them
        assert.equal(gotA[gotA.length - 1]!.type, "run_completed");
        assert.equal(gotB[gotB.length - 1]!.type, "run_completed");
        assert.equal(gotA.filter((e) => e.type === "agent.message").length, 25);
      } finally {
        live.close();
      }
    } finally {
      await proxy.close();
    }
  });

  for (const [cuts, drops] of [
    [12, 0],
    [8, 6],
  ] as const) {
    test(`300 appends, cut ${cuts} times mid-frame and ${drops} frames lost: 1..=N exactly once and in order`, async () => {
      const proxy = await wsProxy(server.port, { cutEvery: 23, maxCuts: cuts, dropEvery: 17, maxDrops: drops });
      try {
        const client = new Client(proxy.url, { token: server.agentToken });
        const run = await client.createRun({ owner: "alice" });
        const live = await client.live();
        try {
          const follow = collect(live, run.id);
          await writer(run, 300, 3);
          const got = await follow;
          assert.deepEqual(got.map((e) => e.sequence), range(1, await lastSequence(run)));
          assert.equal(got[got.length - 1]!.type, "run_completed");
          assert.equal(proxy.cuts, cuts);
          assert.equal(proxy.drops, drops);
          assert.equal(live.connections, cuts + 1);
          if (drops > 0) assert.ok(live.skips >= drops, `skips ${live.skips}`);
        } finally {
          live.close();
        }
      } finally {
        await proxy.close();
      }
    });
  }

  test("run.follow() with the run token (?run_id=), cut five times while the run lives", async () => {
    const proxy = await wsProxy(server.port, { cutEvery: 9, maxCuts: 5 });
    try {
      const client = new Client(proxy.url, { token: server.agentToken });
      const run = await client.createRun({ owner: "alice" });
      await run.append(range(0, 39).map((i) => ({ type: "agent.message", text: String(i) })));
      const seen: number[] = [];
      const follow = (async () => {
        for await (const e of run.follow()) seen.push(e.sequence);
      })();
      for (let i = 0; i < 60; i++) {
        await run.append([{ type: "agent.message", text: `m${i}` }]);
        await new Promise((r) => setTimeout(r, 10));
      }
      // The run ends only after the fifth cut (a run token of an ended run connects no more).
      await until("five cuts", () => proxy.cuts >= 5, 60_000);
      await run.complete();
      await follow;
      assert.deepEqual(seen, range(1, await lastSequence(run)));
      assert.equal(proxy.cuts, 5);
      const ws = proxy.targets.filter((t) => t.startsWith("/api/ws"));
      assert.equal(ws.length, 6);
      assert.ok(ws.every((t) => t.includes(`run_id=${run.id}`)));
      assert.ok(!proxy.paths.some((p) => p.endsWith("/stream")));
    } finally {
      await proxy.close();
    }
  });

  test("a follow cut as its run ends reads the rest from the pages (409 run_terminal at the upgrade)", async () => {
    const proxy = await wsProxy(server.port, { cutEvery: 5, maxCuts: 1 });
    try {
      const client = new Client(proxy.url, { token: server.agentToken });
      const run = await client.createRun({ owner: "alice" });
      await run.append(range(0, 2).map((i) => ({ type: "agent.message", text: String(i) })));
      const seen: number[] = [];
      const follow = (async () => {
        for await (const e of run.follow()) seen.push(e.sequence);
      })();
      await until("the first four events", () => seen.length >= 4);
      // The fifth event frame, the run's terminal event, is cut mid-frame.
      await run.complete();
      await follow;
      assert.equal(proxy.cuts, 1);
      assert.deepEqual(seen, range(1, await lastSequence(run)));
      const ws = proxy.targets.filter((t) => t.startsWith("/api/ws"));
      assert.equal(ws.length, 2, "the first upgrade and the refused one: no retry loop");
      assert.ok(proxy.targets.some((t) => t.includes("/events?")));
    } finally {
      await proxy.close();
    }
  });

  test("refused credentials are errors, not retries", async () => {
    const client = new Client(server.url, { token: server.agentToken });
    const run = await client.createRun({ owner: "alice" });
    const other = await client.createRun({ owner: "alice" });
    const url = `ws://127.0.0.1:${server.port}/api/ws`;
    const t = server.agentToken;
    const forged = t.slice(0, -4) + (t.endsWith("AAAA") ? "BBBB" : "AAAA");
    const cases: [LiveConnection, string, (err: unknown) => boolean, number][] = [
      // A forged JWT: the upgrade is refused (401), once.
      [new LiveConnection(url, forged), run.id, (e) => e instanceof Unauthorized, 0],
      // A run token opened for another run: refused at the upgrade (403).
      [new LiveConnection(url, run.token, { runId: other.id }), other.id, (e) => e instanceof Forbidden, 0],
      // A run token on its own run's connection subscribing to another run: refused.
      [new LiveConnection(url, run.token, { runId: run.id }), other.id, (e) => e instanceof Forbidden, 1],
      // An agent that may not read the run.
      [new LiveConnection(url, server.token("someone-else", "agent")), run.id, (e) => e instanceof Forbidden || e instanceof Unauthorized, 1],
    ];
    for (const [live, runId, refused, connections] of cases) {
      try {
        await assert.rejects(collect(live, runId), (err: unknown) => {
          assert.ok(refused(err), String(err));
          assert.ok(!String(err).includes(run.token) && !String(err).includes(t));
          return true;
        });
        assert.equal(live.connections, connections);
      } finally {
        live.close();
      }
    }
  });

  for (const how of ["not_advertised", "upgrade_fails", "turned_off"] as const) {
    test(`the gate falls back to SSE (${how})`, async () => {
      const proxy = await wsProxy(server.port, { advertise: how !== "not_advertised", wsStatus: how === "upgrade_fails" ? 404 : undefined });
      try {
        const client = new Client(proxy.url, { token: server.agentToken, websocket: how !== "turned_off" });
        const run = await client.createRun({ owner: "alice" });
        const requestId = randomUUID();
        const gate = run.gate("web_fetch", { requestId });
        await until("the SSE stream", () => proxy.paths.some((p) => p.endsWith("/stream")));
        await decide(server, run.id, requestId, "approve");
        const decision = await gate;
        assert.ok(decision.approved);
        assert.equal(proxy.paths.filter((p) => p === "/api/live").length, how === "turned_off" ? 0 : 1);
        assert.equal(proxy.paths.filter((p) => p === "/api/ws").length, how === "upgrade_fails" ? 1 : 0);
        assert.equal(proxy.upgrades, 0);
      } finally {
        await proxy.close();
      }
    });
  }

  for (const sse of [true, false]) {
    test(`no WebSocket advertised: run.follow() reads ${sse ? "the SSE stream" : "the pages (no SSE either)"}; client.live() says so`, async () => {
      const proxy = await wsProxy(server.port, { advertise: false, streamStatus: sse ? undefined : 404 });
      try {
        const client = new Client(proxy.url, { token: server.agentToken, pollIntervalMs: 50 });
        const run = await client.createRun({ owner: "alice" });
        await run.append({ type: "agent.message" });
        const seen: Event[] = [];
        const follow = (async () => {
          for await (const e of run.follow()) seen.push(e);
        })();
        await until("the first events", () => seen.length >= 2);
        await writer(run, 5);
        await follow;
        const page = await run.events(0, 1000);
        assert.deepEqual(seen, page.events);
        assert.deepEqual(seen.map((e) => e.sequence), range(1, 8));
        assert.ok(!proxy.paths.includes("/api/ws"));
        assert.ok(proxy.paths.some((p) => p.endsWith("/stream")));
        // Page reads: the test's own, and the follower's where it polled.
        const pages = proxy.targets.filter((t) => t.includes("/events?"));
        assert.equal(pages.length === 1, sse);
        await assert.rejects(client.live(), WsUnavailable);
      } finally {
        await proxy.close();
      }
    });
  }

  test("a gate's wait resolves over WebSocket across three cuts, every event once and in order", async () => {
    const proxy = await wsProxy(server.port, { cutEvery: 4, maxCuts: 3 });
    try {
      const client = new Client(proxy.url, { token: server.agentToken });
      const run = await client.createRun({ owner: "alice" });
      const requestId = randomUUID();
      const seen: Event[] = [];
      let armed = false;
      const gate = run.gate("web_fetch", { requestId, onArmed: () => (armed = true), onEvent: (e) => seen.push(e) });
      await until("the WebSocket", () => armed && proxy.upgrades >= 1);
      let written = 0;
      while (proxy.cuts < 3) {
        await run.append({ type: "agent.message", text: `step ${written}` });
        written += 1;
        await new Promise((r) => setTimeout(r, 10));
        assert.ok(written < 500, "the proxy never cut");
      }
      await decide(server, run.id, requestId, "approve");
      const decision = await gate;
      assert.ok(decision.approved);
      assert.ok(!proxy.paths.some((p) => p.endsWith("/stream")));
      assert.equal(proxy.paths.filter((p) => p === "/api/live").length, 1);
      assert.equal(proxy.upgrades, 4); // the first connection and three reconnects
      const sequences = seen.map((e) => e.sequence);
      assert.deepEqual(sequences, range(sequences[0]!, sequences[0]! + sequences.length - 1));
      assert.equal(seen[seen.length - 1]!.type, "tool.approval_resolved");
      assert.equal(seen.filter((e) => e.type === "agent.message").length, written);
    } finally {
      await proxy.close();
    }
  });
});
