import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer, type Server as HttpServer } from "node:http";
import { after, before, describe, test } from "node:test";
import { Client, Conflict, ExecutionTimeout, OutcomeUnknown, SendFailed, type Decision, type Run } from "../src/index.js";
import { decide, recordingFetch, startServer, type Sent, type Server } from "./server.js";

/** A tool on a loopback port: `ok` answers 200, `kill` destroys the connection once the request has arrived. */
async function toolServer(mode: "ok" | "kill"): Promise<{ url: string; received: () => number; close: () => Promise<void> }> {
  let received = 0;
  const srv: HttpServer = createServer((req, res) => {
    received += 1;
    req.resume();
    req.on("end", () => {
      if (mode === "kill") req.socket.destroy();
      else res.writeHead(200, { "content-type": "application/json" }).end('{"ok":true}');
    });
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", () => r()));
  const addr = srv.address();
  return {
    url: `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}/apply`,
    received: () => received,
    close: () =>
      new Promise<void>((r) => {
        srv.closeAllConnections();
        srv.close(() => r());
      }),
  };
}

describe("execution guard", () => {
  let server: Server;
  let sent: Sent[];
  let client: Client;
  /** Approves the card of the next gate as soon as it waits on the stream. */
  let decideNext: { runId: string; requestId: string; verb: "approve" | "deny"; scope?: string; done?: Promise<unknown> } | undefined;

  before(async () => {
    server = await startServer();
    sent = [];
    client = new Client(server.url, {
      websocket: false, // the SSE stream's own behaviour
      token: server.agentToken,
      fetch: recordingFetch(sent, (s) => {
        // The gate has armed its card when it opens the stream: decide it then.
        if (s.path.endsWith("/stream") && decideNext && decideNext.done === undefined) {
          decideNext.done = decide(server, decideNext.runId, decideNext.requestId, decideNext.verb, decideNext.scope);
        }
      }),
    });
  });
  after(async () => {
    await server?.stop();
  });

  async function approved(run: Run, toolCallId: string, args: unknown): Promise<Decision> {
    const requestId = randomUUID();
    decideNext = { runId: run.id, requestId, verb: "approve" };
    const decision = await run.gate("http_post", { requestId, toolCallId, arguments: args, url: "http://tool.local/apply" });
    await decideNext.done;
    decideNext = undefined;
    assert.equal(decision.state, "approved");
    return decision;
  }

  const newRun = () => client.createRun({ owner: "ts-operator", budget: { tools: { http_post: 5 }, call_ceiling: 10 } });

  test("a result is settled confirmed and the record is completed", async () => {
    const tool = await toolServer("ok");
    try {
      const run = await newRun();
      const decision = await approved(run, "call-ok", { n: 1 });
      const executed = await run.execute(decision, { toolCallId: "call-ok" }, async (ex) => {
        await ex.dispatch();
        const resp = await fetch(tool.url, { method: "POST", body: "{}", headers: { "idempotency-key": ex.idempotencyKey } });
        ex.result({ http_status: resp.status });
        return (await resp.json()) as { ok: boolean };
      });
      assert.deepEqual(executed.value, { ok: true });
      assert.equal(executed.evidence, "confirmed");
      assert.equal(executed.state, "completed");
      assert.equal(tool.received(), 1);
      const record = await run.mutation("call-ok", decision.approvalId);
      assert.equal(record.state, "completed");
      assert.deepEqual(record.result, { http_status: 200 });
      const types = (await run.events(0, 1000)).events.map((e) => e.type);
      assert.ok(types.includes("tool_execution_started"));
      const exec = (await run.events(0, 1000)).events.find((e) => e.type === "tool_execution");
      assert.equal(exec?.execution_status, "executed");
    } finally {
      await tool.close();
    }
  });

  test("a transport killed after dispatch is ambiguous, and a retry is refused without being sent", async () => {
    const tool = await toolServer("kill");
    try {
      const run = await newRun();
      const decision = await approved(run, "call-amb", { n: 2 });
      let calls = 0;
      const send = async (ex: { dispatch(): Promise<void> }) => {
        calls += 1;
        await ex.dispatch();
        const resp = await fetch(tool.url, { method: "POST", body: "{}" });
        return resp.status;
      };
      const err = await run.execute(decision, { toolCallId: "call-amb" }, send).then(
        () => assert.fail("expected OutcomeUnknown"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof OutcomeUnknown, String(err));
      assert.equal(err.state, "outcome_unknown");
      assert.ok(err.cause instanceof Error, "the transport's failure is its cause");
      assert.equal(tool.received(), 1, "the request reached the tool once");
      assert.equal(calls, 1);
      const record = await run.mutation("call-amb", decision.approvalId);
      assert.equal(record.state, "outcome_unknown");
      const settle = sent.filter((s) => s.path.endsWith("/tool-calls/call-amb/settle"));
      assert.equal(settle.length, 1);
      assert.equal(settle[0]!.status, 200);

      // The same attempt again: the server refuses it (409 outcome_unknown); nothing runs.
      let before = sent.length;
      await assert.rejects(run.execute(decision, { toolCallId: "call-amb" }, send), OutcomeUnknown);
      assert.deepEqual(
        sent.slice(before).map((s) => [s.path.split("/").pop(), s.status]),
        [["start", 409]],
        "one start, not retried; no dispatch, no settle",
      );

      // A fresh approval of the same tool call: the server refuses the start with the
      // outcome-unknown conflict (409), which is never retried; nothing is sent.
      const again = await approved(run, "call-amb", { n: 2 });
      before = sent.length;
      const refused = await run.execute(again, { toolCallId: "call-amb" }, send).then(
        () => assert.fail("expected OutcomeUnknown"),
        (e: unknown) => e,
      );
      assert.ok(refused instanceof OutcomeUnknown, String(refused));
      assert.equal(refused.status, 409);
      assert.equal(refused.state, "outcome_unknown");
      assert.equal(refused.approvalId, decision.approvalId, "the attempt that blocks");
      assert.match(refused.requestId ?? "", /^[A-Za-z0-9._-]{1,64}$/);
      assert.equal(typeof refused.code, "string");
      const tail = sent.slice(before);
      assert.deepEqual(tail.map((s) => [s.path.split("/").pop(), s.status]), [["start", 409]], "sent once, not retried");
      assert.equal(calls, 1, "the transport never ran again");
      assert.equal(tool.received(), 1);
    } finally {
      await tool.close();
    }
  });

  test("a throw before dispatch is settled not_sent and rethrown", async () => {
    const run = await newRun();
    const decision = await approved(run, "call-early", { n: 3 });
    const boom = new Error("could not build the request");
    await assert.rejects(
      run.execute(decision, async () => {
        throw boom;
      }),
      (e: unknown) => e === boom,
    );
    const record = await run.mutation(decision.toolCallId, decision.approvalId);
    assert.equal(record.state, "not_executed");
  });

  test("no response within the timeout after dispatch is ambiguous, and the transport is told to stop", async () => {
    const run = await newRun();
    const decision = await approved(run, "call-slow", { n: 4 });
    let aborted = false;
    const err = await run
      .execute(decision, { timeoutMs: 300 }, async (ex) => {
        await ex.dispatch();
        await new Promise((resolve) => ex.signal.addEventListener("abort", resolve, { once: true }));
        aborted = ex.signal.aborted;
        return "late";
      })
      .then(
        () => assert.fail("expected OutcomeUnknown"),
        (e: unknown) => e,
      );
    assert.ok(err instanceof OutcomeUnknown);
    assert.equal(aborted, true);
    assert.equal((await run.mutation(decision.toolCallId, decision.approvalId)).state, "outcome_unknown");
  });

  test("running past the timeout before dispatch is settled not_sent; a late dispatch is refused", async () => {
    const run = await newRun();
    const decision = await approved(run, "call-stuck", { n: 6 });
    let late: Promise<string> | undefined;
    await assert.rejects(
      run.execute(decision, { timeoutMs: 200 }, async (ex) => {
        await new Promise((resolve) => ex.signal.addEventListener("abort", resolve, { once: true }));
        late = ex.dispatch().then(
          () => "dispatched",
          (e: Error) => e.message,
        );
      }),
      ExecutionTimeout,
    );
    assert.equal((await run.mutation(decision.toolCallId, decision.approvalId)).state, "not_executed");
    assert.match(await late!, /too late to dispatch/);
    assert.ok(!sent.some((s) => s.path.endsWith("/tool-calls/call-stuck/dispatch")), "no dispatch was sent");
  });

  test("a dispatch refused (another holder dispatched the attempt) sends nothing and settles nothing", async () => {
    const run = await newRun();
    const decision = await approved(run, "call-twice", { n: 7 });
    let sentByUs = 0;
    const before = sent.length;
    const err = await run
      .execute(decision, async (ex) => {
        // Another holder of the same attempt dispatches it first.
        const other = await fetch(`${server.url}/api/runs/${run.id}/tool-calls/call-twice/dispatch`, {
          method: "POST",
          headers: { authorization: `Bearer ${run.token}`, "content-type": "application/json" },
          body: JSON.stringify({ approval_id: ex.approvalId }),
        });
        assert.equal(other.status, 200);
        await ex.dispatch();
        sentByUs += 1;
      })
      .then(
        () => assert.fail("expected Conflict"),
        (e: unknown) => e,
      );
    assert.ok(err instanceof Conflict && !(err instanceof OutcomeUnknown), String(err));
    assert.equal(err.status, 409);
    assert.equal(err.state, "dispatched");
    assert.equal(sentByUs, 0);
    assert.deepEqual(
      sent.slice(before).map((s) => s.path.split("/").pop()),
      ["start", "dispatch"],
      "no settle: the deadline settles what this process cannot know",
    );
    assert.equal((await run.mutation("call-twice", decision.approvalId)).state, "dispatched");
  });

  test("a call a policy approved runs without the ledger", async () => {
    const run = await newRun();
    // The run's owner approves with scope `tool`: later gates of that tool on this run
    // are approved at once by the policy.
    const scoped = randomUUID();
    decideNext = { runId: run.id, requestId: scoped, verb: "approve", scope: "tool" };
    const grant = await run.gate("http_post", { requestId: scoped });
    await decideNext.done;
    decideNext = undefined;
    assert.equal(grant.state, "approved");
    assert.equal(grant.scope, "tool");
    const before = sent.length;
    const auto = await run.gate("http_post", { arguments: { n: 5 } });
    assert.equal(auto.auto, true);
    assert.equal(auto.approved, true);
    assert.match(auto.decidedBy ?? "", /^policy:/);
    assert.deepEqual(sent.slice(before).map((s) => s.path.split("/").pop()), ["approval-requests"], "no wait");
    const executed = await run.execute(auto, async (ex) => {
      await ex.dispatch();
      return "sent";
    });
    assert.deepEqual(executed, { value: "sent", evidence: undefined, state: undefined });
    assert.ok(!sent.slice(before).some((s) => s.path.includes("/tool-calls/")), "nothing on the ledger");
  });

  test("a denied decision sends nothing", async () => {
    const run = await newRun();
    const requestId = randomUUID();
    decideNext = { runId: run.id, requestId, verb: "deny" };
    const denied = await run.gate("http_post", { requestId });
    await decideNext.done;
    decideNext = undefined;
    assert.equal(denied.state, "denied");
    let ran = false;
    await assert.rejects(
      run.execute(denied, async () => {
        ran = true;
      }),
      (e: unknown) => e instanceof Conflict && e.state === "denied",
    );
    assert.equal(ran, false);
  });

  test("an error's message never reaches the record; a SendFailed's does", async () => {
    const SECRET = "sk-live-0123456789abcdef";
    const url = `https://api.example.test/v1/charge?api_key=${SECRET}`;
    const run = await newRun();
    const after = await approved(run, "call-after", { n: 8 });
    await assert.rejects(
      run.execute(after, { toolCallId: "call-after" }, async (ex) => {
        await ex.dispatch();
        throw new Error(`connect ECONNRESET ${url}`);
      }),
      OutcomeUnknown,
    );
    const before = await approved(run, "call-before", { n: 9 });
    await assert.rejects(
      run.execute(before, { toolCallId: "call-before" }, async () => {
        throw new TypeError(`cannot build ${url}`);
      }),
      TypeError,
    );
    const worded = await approved(run, "call-worded", { n: 10 });
    await assert.rejects(
      run.execute(worded, { toolCallId: "call-worded" }, async (ex) => {
        await ex.dispatch();
        throw new SendFailed("the charge API reset the connection", { cause: new TypeError(`fetch failed: ${url}`) });
      }),
      OutcomeUnknown,
    );
    const records = [
      await run.mutation("call-after", after.approvalId),
      await run.mutation("call-before", before.approvalId),
      await run.mutation("call-worded", worded.approvalId),
    ];
    assert.deepEqual(
      records.map((r) => [r.state, r.error]),
      [
        ["outcome_unknown", { code: "transport", type: "Error" }],
        ["not_executed", { code: "not_sent", type: "TypeError" }],
        ["outcome_unknown", { code: "transport", type: "TypeError", message: "the charge API reset the connection" }],
      ],
    );
    const events = (await run.events(0, 1000)).events;
    assert.ok(events.some((e) => e.type === "tool_execution"));
    const shown = JSON.stringify(events) + JSON.stringify(records);
    assert.ok(!shown.includes(SECRET) && !shown.includes("api.example.test"), "no error message recorded");
  });

  test("facts that are not JSON are recorded as a stub and the call still settles", async () => {
    const run = await newRun();
    const big = await approved(run, "call-bigint", { n: 11 });
    const executed = await run.execute(big, { toolCallId: "call-bigint" }, async (ex) => {
      await ex.dispatch();
      ex.result({ http_status: 200, amount: 10n });
      return "ok";
    });
    assert.deepEqual([executed.evidence, executed.state], ["confirmed", "completed"]);
    assert.deepEqual((await run.mutation("call-bigint", big.approvalId)).result, { code: "facts_unserializable" });

    const cyclic = await approved(run, "call-cycle", { n: 12 });
    const facts: Record<string, unknown> = { http_status: 422 };
    facts.self = facts;
    const again = await run.execute(cyclic, { toolCallId: "call-cycle" }, async (ex) => {
      await ex.dispatch();
      ex.error(facts);
      return "refused";
    });
    assert.deepEqual([again.evidence, again.state], ["confirmed", "completed"]);
    assert.deepEqual((await run.mutation("call-cycle", cyclic.approvalId)).error, { code: "facts_unserializable" });
  });

  test("a dispatch answered after the guard timed out is withheld: the function sends nothing", async () => {
    const run = await newRun();
    const decision = await approved(run, "call-late", { n: 13 });
    // The dispatch's answer is held back until the guard has given up.
    let guardSignal: AbortSignal | undefined;
    const holding = new Client(server.url, {
      token: server.agentToken,
      fetch: async (input, init) => {
        const resp = await fetch(input, init);
        const path = new URL(input instanceof Request ? input.url : String(input)).pathname;
        const signal = guardSignal;
        if (path.endsWith("/dispatch") && signal !== undefined && !signal.aborted) {
          await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
        }
        return resp;
      },
    });
    let sentByUs = false;
    await assert.rejects(
      holding.run(run.id, run.token).execute(decision, { toolCallId: "call-late", timeoutMs: 200 }, async (ex) => {
        guardSignal = ex.signal;
        await ex.dispatch();
        sentByUs = true;
      }),
      ExecutionTimeout,
    );
    assert.equal(sentByUs, false, "the function was not permitted to send");
    const record = await run.mutation("call-late", decision.approvalId);
    assert.equal(record.state, "not_executed");
    assert.deepEqual(record.error, { code: "not_sent", type: "ExecutionTimeout", message: "no response within 200 ms" });
  });

  test("only the card's flag makes a decision automatic, whatever the decider's name", async () => {
    const run = await client.createRun({ owner: "alice" });
    const requestId = randomUUID();
    let decided: Promise<Response> | undefined;
    const first = await run.gate("http_post", {
      requestId,
      onArmed: () => {
        decided = fetch(`${server.url}/api/runs/${run.id}/tool-approvals`, {
          method: "POST",
          headers: { authorization: `Bearer ${server.operatorToken}`, "content-type": "application/json" },
          body: JSON.stringify({ request_id: requestId, scope: "once" }),
        });
      },
    });
    assert.equal((await decided)?.status, 200);
    assert.equal(first.auto, false);
    // The same gate again reads the decided card, whose decider this transport renames
    // `policy:night-shift` (a name the server refuses to mint into a decision): still a
    // human's decision, since the card does not say auto_approved.
    const renaming = new Client(server.url, {
      token: server.agentToken,
      fetch: async (input, init) => {
        const resp = await fetch(input, init);
        const url = new URL(input instanceof Request ? input.url : String(input));
        if ((init?.method ?? "GET") === "GET" && url.pathname.includes("/approval-requests/")) {
          const body = (await resp.json()) as Record<string, unknown>;
          if (body.decided_by) body.decided_by = "policy:night-shift";
          return new Response(JSON.stringify(body), { status: resp.status, headers: { "content-type": "application/json" } });
        }
        return resp;
      },
    });
    const again = await renaming.run(run.id, run.token).gate("http_post", { requestId });
    assert.deepEqual([again.state, again.decidedBy, again.auto], ["approved", "policy:night-shift", false]);
  });
});
