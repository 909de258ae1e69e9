import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { Client, InvalidRequest, Operator } from "../src/index.js";
import { startServer, type Server } from "./server.js";

describe("the runs listing", () => {
  let server: Server;
  before(async () => {
    server = await startServer();
  });
  after(async () => {
    await server?.stop();
  });

  test("an operator pages through runs newest first, narrowed by owner, status and run-id prefix", async () => {
    const owner = `owner-${randomUUID().slice(0, 12)}`;
    const client = new Client(server.url, { token: server.agentToken });
    const runs = [];
    for (let i = 0; i < 3; i++) runs.push(await client.createRun({ owner }));
    await runs[1]!.complete({});
    const op = new Operator(server.url, { token: server.operatorToken });
    const listed = [];
    let cursor: string | undefined;
    for (;;) {
      const page = await op.listRuns({ owner, limit: 2, after: cursor });
      assert.ok(page.runs.length <= 2);
      listed.push(...page.runs);
      if (!page.has_more) break;
      cursor = page.next_cursor ?? undefined;
    }
    assert.deepEqual(new Set(listed.map((r) => r.run_id)), new Set(runs.map((r) => r.id)));
    assert.equal(listed.length, 3);
    const times = listed.map((r) => r.created_at);
    assert.deepEqual(times, [...times].sort((a, b) => b - a), "newest first");
    const done = await op.listRuns({ owner, status: "completed" });
    assert.deepEqual(done.runs.map((r) => r.run_id), [runs[1]!.id]);
    assert.ok((done.runs[0]!.ended_at ?? 0) >= done.runs[0]!.created_at);
    const one = await op.listRuns({ q: runs[2]!.id });
    assert.deepEqual(one.runs.map((r) => r.run_id), [runs[2]!.id]);
    await assert.rejects(op.listRuns({ status: "paused" as "running" }), InvalidRequest);
  });
});
