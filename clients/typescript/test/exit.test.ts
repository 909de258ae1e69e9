// A script that never closes its client still exits: a gate decided (an Operator made
// too), a live follow abandoned after one event, a gate wait nobody answers and nobody
// awaits; and a script that awaits a gate, or reads a follow to the run's end, still
// waits for it (no early exit, no "unsettled top-level await", code 13). Each script runs
// as a subprocess (`node` on an .mjs importing the built package) against the real
// server, over WebSocket and over the SSE stream, within a time limit (killed past it).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { decide, startServer, type Server } from "./server.js";

const HERE = dirname(fileURLToPath(import.meta.url));
/** The package as built next to the tests (build/src; the harness builds it first). */
const PACKAGE = pathToFileURL(resolve(HERE, "../src/index.js")).href;
const LIMIT_MS = 20_000;
const LAST = "done; the client was never closed";

const PRELUDE = `
import { Client, Operator } from ${JSON.stringify(PACKAGE)};
const URL_ = process.env.TOLLGATE_URL;
const websocket = process.env.WEBSOCKET === "1";
const client = new Client(URL_, { token: process.env.AGENT_TOKEN, websocket });
`;

const SCRIPTS: Record<string, string> = {
  // A gate an operator approves (over HTTP, from the script), an Operator's read; nothing closed.
  decided: `
const run = await client.createRun({ owner: "alice", budget: { tools: { shell: 1 } } });
await run.append({ type: "agent.message", text: "asking before a shell call" });
let approving;
const decision = await run.gate("shell", {
  message: "ls build/",
  timeoutMs: 60_000,
  onArmed: (card) => {
    approving = fetch(URL_ + "/api/runs/" + encodeURIComponent(run.id) + "/tool-approvals", {
      method: "POST",
      headers: { authorization: "Bearer " + process.env.OPERATOR_TOKEN, "content-type": "application/json" },
      body: JSON.stringify({ request_id: card.requestId, scope: "once" }),
    }).then((r) => r.status);
  },
});
const operator = new Operator(URL_, { token: process.env.OPERATOR_TOKEN });
const runs = await operator.listRuns({ q: run.id });
console.log("decided", decision.state, await approving, runs.runs.length);
console.log(${JSON.stringify(LAST)});
`,
  // run.follow(): one event read, the iterator left as it is (no return(), no close).
  follow: `
const run = await client.createRun({ owner: "alice" });
await run.append({ type: "agent.message", text: "following myself" });
const follow = run.follow();
const first = await follow.next();
console.log("followed", first.value.sequence, first.value.type);
console.log(${JSON.stringify(LAST)});
`,
  // client.live(): one LiveConnection following a run, one event read, never closed.
  live: `
const run = await client.createRun({ owner: "alice" });
await run.append({ type: "agent.message", text: "following myself" });
const live = await client.live();
const first = await live.follow(run.id).next();
console.log("followed", first.value.sequence, first.value.type);
console.log(${JSON.stringify(LAST)});
`,
  // A gate nobody answers (300 s) and nobody awaits: the script ends once it is pending.
  abandoned: `
const run = await client.createRun({ owner: "alice" });
let armed;
const seen = new Promise((resolve) => (armed = resolve));
const gate = run.gate("shell", {
  message: "nobody answers",
  timeoutMs: 300_000,
  onArmed: (card) => {
    console.log("pending", run.id, card.requestId);
    armed();
  },
});
await seen;
await new Promise((resolve) => setTimeout(resolve, 1000)); // the wait has its stream open
console.log(${JSON.stringify(LAST)});
`,
  // A gate awaited: decided from outside ~3 s after it is pending; the script waits for it.
  awaited: `
const run = await client.createRun({ owner: "alice" });
const decision = await run.gate("shell", {
  message: "someone answers",
  timeoutMs: 60_000,
  onArmed: (card) => console.log("pending", run.id, card.requestId),
});
console.log("decided", decision.state, decision.decidedBy);
console.log(${JSON.stringify(LAST)});
`,
  // run.follow() read to the run's end, which comes ~3 s on from a timer that alone would
  // not keep the process alive: the follow holds it open while it waits.
  following: `
const run = await client.createRun({ owner: "alice" });
setTimeout(() => void run.complete(), 3000).unref();
const types = [];
for await (const event of run.follow()) types.push(event.type);
console.log("followed", types.join(","));
console.log(${JSON.stringify(LAST)});
`,
  // The same on a LiveConnection.
  liveFollowing: `
const run = await client.createRun({ owner: "alice" });
setTimeout(() => void run.complete(), 3000).unref();
const live = await client.live();
const types = [];
for await (const event of live.follow(run.id)) types.push(event.type);
console.log("followed", types.join(","));
console.log(${JSON.stringify(LAST)});
`,
};

let server: Server;
let dir: string;
before(async () => {
  server = await startServer();
  dir = mkdtempSync(join(tmpdir(), "tollgate-exit-"));
});
after(async () => {
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

interface Outcome {
  /** The exit code; null when it was still running at the limit (then killed) or died of a signal. */
  code: number | null;
  timedOut: boolean;
  lines: string[];
  stderr: string;
  elapsedMs: number;
}

/** Runs one script as `node <file>` with the server's URL and tokens; `onLine` sees each line it prints. */
function runScript(name: string, websocket: boolean, onLine: (line: string) => void = () => {}): Promise<Outcome> {
  const file = join(dir, `${name}-${websocket ? "ws" : "sse"}.mjs`);
  writeFileSync(file, PRELUDE + SCRIPTS[name]);
  const started = Date.now();
  const child = spawn(process.execPath, [file], {
    env: {
      ...process.env,
      TOLLGATE_URL: server.url,
      AGENT_TOKEN: server.agentToken,
      OPERATOR_TOKEN: server.operatorToken,
      WEBSOCKET: websocket ? "1" : "0",
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines: string[] = [];
  let partial = "";
  let stderr = "";
  child.stdout.on("data", (d: Buffer) => {
    partial += d.toString();
    const parts = partial.split("\n");
    partial = parts.pop() ?? "";
    for (const line of parts) {
      lines.push(line);
      onLine(line);
    }
  });
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  return new Promise((res) => {
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill("SIGKILL");
    }, LIMIT_MS);
    child.once("close", (code) => {
      clearTimeout(timer);
      if (partial !== "") lines.push(partial);
      res({ code: timedOut ? null : code, timedOut, lines, stderr, elapsedMs: Date.now() - started });
    });
  });
}

function assertExited(o: Outcome): void {
  assert.ok(!o.timedOut, `still running ${LIMIT_MS / 1000} s on (killed), after printing ${JSON.stringify(o.lines)}\n${o.stderr}`);
  assert.equal(o.code, 0, `exit code ${o.code}: ${JSON.stringify(o.lines)}\n${o.stderr}`);
  assert.equal(o.lines.at(-1), LAST, o.stderr);
}

for (const websocket of [true, false]) {
  const over = websocket ? "over WebSocket" : "over SSE";

  test(`an unclosed client exits after a gate an operator approved (${over})`, async () => {
    const o = await runScript("decided", websocket);
    assertExited(o);
    assert.equal(o.lines.at(-2), "decided approved 200 1");
  });

  test(`an unclosed client exits after run.follow() was left after one event (${over})`, async () => {
    const o = await runScript("follow", websocket);
    assertExited(o);
    assert.deepEqual(o.lines, ["followed 1 run_started", LAST]);
  });

  test(`a script that reads run.follow() to the run's end waits for it (${over})`, async () => {
    const o = await runScript("following", websocket);
    assertExited(o);
    assert.equal(o.lines.at(-2), "followed run_started,run_completed");
    assert.ok(o.elapsedMs >= 3000, `${o.elapsedMs} ms`);
  });

  test(`an unclosed client exits while a gate nobody awaits waits (${over})`, async () => {
    const o = await runScript("abandoned", websocket);
    assertExited(o);
    assert.match(o.lines[0] ?? "", /^pending \S+ \S+$/);
    const [, runId, requestId] = (o.lines[0] ?? "").split(" ");
    // The card is still pending: the script's end did not decide or withdraw it.
    const resp = await fetch(`${server.url}/api/runs/${encodeURIComponent(runId!)}/approvals?state=pending`, {
      headers: { authorization: `Bearer ${server.operatorToken}` },
    });
    assert.equal(resp.status, 200);
    const cards = ((await resp.json()) as { approvals: { request_id: string }[] }).approvals;
    assert.deepEqual(
      cards.map((c) => c.request_id),
      [requestId],
    );
  });

  test(`a script that awaits a gate waits for its decision (${over})`, async () => {
    let pendingAt = 0;
    let deciding: Promise<unknown> | undefined;
    const o = await runScript("awaited", websocket, (line) => {
      const m = line.match(/^pending (\S+) (\S+)$/);
      if (m) {
        pendingAt = Date.now();
        deciding = new Promise((r) => setTimeout(r, 3000)).then(() => decide(server, m[1]!, m[2]!, "approve"));
      }
    });
    await deciding;
    assertExited(o);
    assert.ok(pendingAt > 0, JSON.stringify(o.lines));
    assert.equal(o.lines.at(-2), "decided approved ts-operator");
    assert.ok(Date.now() - pendingAt >= 3000);
  });
}

test("a script that reads a LiveConnection's follow to the run's end waits for it (over WebSocket)", async () => {
  const o = await runScript("liveFollowing", true);
  assertExited(o);
  assert.equal(o.lines.at(-2), "followed run_started,run_completed");
  assert.ok(o.elapsedMs >= 3000, `${o.elapsedMs} ms`);
});

test("an unclosed client exits after a LiveConnection was left after one event (over WebSocket)", async () => {
  const o = await runScript("live", true);
  assertExited(o);
  assert.deepEqual(o.lines, ["followed 1 run_started", LAST]);
});
