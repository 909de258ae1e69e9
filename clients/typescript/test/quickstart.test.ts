// The README's TypeScript quickstart as a user runs it: the example waits for approval,
// `tollgate approve` (the CLI) approves it, and the example goes on to fetch and complete.
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { createServer } from "node:http";
import { dirname, resolve } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { binary, startServer, type Server } from "./server.js";

const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

let server: Server;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

test("quickstart: the example waits, the CLI approves, the example fetches and completes", async () => {
  let fetched = 0;
  const page = createServer((_req, res) => {
    fetched += 1;
    res.writeHead(200, { "content-type": "text/plain" }).end("the docs");
  });
  await new Promise<void>((r) => page.listen(0, "127.0.0.1", () => r()));
  const addr = page.address();
  const fetchUrl = `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}/docs`;
  try {
    const child = spawn(process.execPath, [resolve(PACKAGE, "examples/quickstart.mjs")], {
      cwd: PACKAGE,
      env: { ...process.env, TOLLGATE_URL: server.url, AGENT_TOKEN: server.agentToken, FETCH_URL: fetchUrl },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    let err = "";
    child.stderr.on("data", (d: Buffer) => (err += d.toString()));
    const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
    const waiting = await new Promise<RegExpMatchArray>((res, rej) => {
      child.stdout.on("data", (d: Buffer) => {
        out += d.toString();
        const m = out.match(/waiting for approval: tollgate approve (\S+) (\S+)\n/);
        if (m) res(m);
      });
      child.once("exit", () => rej(new Error(`the example exited early:\n${out}\n${err}`)));
    });
    const { stdout } = await promisify(execFile)(binary(), ["approve", waiting[1]!, waiting[2]!], {
      env: { ...process.env, TOLLGATE_URL: server.url, TOLLGATE_TOKEN: server.operatorToken },
    });
    assert.match(stdout, /approved \(scope once\) by ts-operator/);
    assert.equal(await exited, 0, err);
    assert.match(out, /decision: approved by ts-operator\n/);
    assert.match(out, new RegExp(`fetched ${fetchUrl}: HTTP 200, recorded completed\\n`));
    assert.match(out, /run \S+ completed\n/);
    assert.equal(fetched, 1);
  } finally {
    await new Promise<void>((r) => page.close(() => r()));
  }
});
