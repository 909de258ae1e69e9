// A real `tollgate serve` on a free loopback port (embedded store) for the tests, and
// tokens minted with the same binary. The binary: TOLLGATE_BIN, else
// <repo>/target/debug/tollgate (what `cargo build -p tollgate` makes).
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));

/** The repository root: the nearest ancestor holding openapi.json and Cargo.toml. */
export function repoRoot(): string {
  let dir = HERE;
  for (;;) {
    if (existsSync(resolve(dir, "Cargo.toml")) && existsSync(resolve(dir, "openapi.json"))) return dir;
    const up = dirname(dir);
    if (up === dir) throw new Error("cannot find the repository root above " + HERE);
    dir = up;
  }
}

export function binary(): string {
  const bin = process.env.TOLLGATE_BIN || resolve(repoRoot(), "target/debug/tollgate");
  if (!existsSync(bin)) {
    throw new Error(`no tollgate binary at ${bin}: build it (cargo build -p tollgate) or set TOLLGATE_BIN`);
  }
  return bin;
}

async function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const addr = s.address();
      const port = typeof addr === "object" && addr ? addr.port : 0;
      s.close(() => res(port));
    });
  });
}

export interface Server {
  url: string;
  port: number;
  agentToken: string;
  operatorToken: string;
  /** Mints another token with the server's secret. */
  token(sub: string, role: "agent" | "operator"): string;
  /** The server's output so far (never holds tokens: it is started with its own secret). */
  log(): string;
  stop(): Promise<void>;
}

/** Starts `tollgate serve` with `env` added (e.g. a short live-stream window). */
export async function startServer(env: Record<string, string> = {}): Promise<Server> {
  const bin = binary();
  const secret = randomBytes(32).toString("hex");
  let lastError: unknown;
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = await freePort();
    const child = spawn(bin, ["serve", "--port", String(port)], {
      env: { ...process.env, ...env, TOLLGATE_SECRET: secret, RUST_LOG: "warn" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    child.stdout?.on("data", (d: Buffer) => (output += d.toString()));
    child.stderr?.on("data", (d: Buffer) => (output += d.toString()));
    try {
      await ready(child, () => output);
    } catch (err) {
      lastError = err;
      child.kill();
      continue;
    }
    const token = (sub: string, role: "agent" | "operator") =>
      execFileSync(bin, ["token", "--sub", sub, "--role", role], {
        env: { ...process.env, TOLLGATE_SECRET: secret },
        encoding: "utf8",
      }).trim();
    return {
      url: `http://127.0.0.1:${port}`,
      port,
      agentToken: token("ts-agent", "agent"),
      operatorToken: token("ts-operator", "operator"),
      token,
      log: () => output,
      stop: () => stop(child),
    };
  }
  throw lastError;
}

function ready(child: ChildProcess, output: () => string): Promise<void> {
  return new Promise((res, rej) => {
    const timer = setTimeout(() => done(new Error("tollgate serve did not start within 20 s:\n" + output())), 20_000);
    const check = () => {
      if (/^export TOLLGATE_URL=/m.test(output())) done();
    };
    const onExit = (code: number | null) => done(new Error(`tollgate serve exited (${code}):\n${output()}`));
    const done = (err?: Error) => {
      clearTimeout(timer);
      child.stdout?.off("data", check);
      child.stderr?.off("data", check);
      child.off("exit", onExit);
      if (err) rej(err);
      else res();
    };
    child.stdout?.on("data", check);
    child.stderr?.on("data", check);
    child.once("exit", onExit);
  });
}

function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((res) => {
    child.once("exit", () => res());
    child.kill("SIGTERM");
    setTimeout(() => child.kill("SIGKILL"), 5000).unref();
  });
}

/** An operator's decision, through HTTP as the console sends it. */
export async function decide(
  server: Server,
  runId: string,
  requestId: string,
  verb: "approve" | "deny",
  scope = "once",
): Promise<Record<string, unknown>> {
  const path = verb === "approve" ? "tool-approvals" : "tool-denials";
  const resp = await fetch(`${server.url}/api/runs/${encodeURIComponent(runId)}/${path}`, {
    method: "POST",
    headers: { authorization: `Bearer ${server.operatorToken}`, "content-type": "application/json" },
    body: JSON.stringify({ request_id: requestId, scope }),
  });
  const body = (await resp.json()) as Record<string, unknown>;
  if (resp.status !== 200) throw new Error(`decision answered ${resp.status}: ${JSON.stringify(body)}`);
  return body;
}

/** Resolves when `predicate` holds for an item pushed to `list` (checked on each push). */
export class Waiter<T> {
  readonly items: T[] = [];
  private waiting: { predicate: (items: T[]) => boolean; resolve: () => void }[] = [];

  push(item: T): void {
    this.items.push(item);
    this.waiting = this.waiting.filter((w) => {
      if (w.predicate(this.items)) {
        w.resolve();
        return false;
      }
      return true;
    });
  }

  until(predicate: (items: T[]) => boolean): Promise<void> {
    if (predicate(this.items)) return Promise.resolve();
    return new Promise((resolve) => this.waiting.push({ predicate, resolve }));
  }
}

/** One request a client sent through {@link recordingFetch}. */
export interface Sent {
  method: string;
  path: string;
  status?: number;
}

/** The global fetch, recording each request (method and path) and its status, and calling `hook` first. */
export function recordingFetch(sent: Sent[], hook?: (s: Sent) => void): typeof fetch {
  return async (input, init) => {
    const url = new URL(input instanceof Request ? input.url : String(input));
    const s: Sent = { method: init?.method ?? "GET", path: url.pathname };
    sent.push(s);
    hook?.(s);
    const resp = await fetch(input, init);
    s.status = resp.status;
    return resp;
  };
}
