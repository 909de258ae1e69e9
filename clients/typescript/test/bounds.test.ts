// What a broken server cannot make the client do: read an answer body without bound,
// or wait without end for a refusal of the live stream that trickles in. Scripted
// servers on loopback give those answers.
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { describe, test } from "node:test";
import { Client, UnexpectedResponse } from "../src/index.js";

type Handler = (req: IncomingMessage, res: ServerResponse) => void;

/** A loopback HTTP server answering with `handler`; every request's method and path recorded. */
async function fakeServer(handler: Handler): Promise<{ url: string; requests: string[]; close: () => Promise<void> }> {
  const requests: string[] = [];
  const srv = createServer((req, res) => {
    requests.push(`${req.method} ${new URL(req.url ?? "/", "http://x").pathname}`);
    req.resume();
    handler(req, res);
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", () => r()));
  const addr = srv.address();
  return {
    url: `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`,
    requests,
    close: () =>
      new Promise<void>((r) => {
        srv.closeAllConnections();
        srv.close(() => r());
      }),
  };
}

function json(res: ServerResponse, status: number, body: unknown): void {
  const data = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": String(Buffer.byteLength(data)) }).end(data);
}

/** Writes a byte every 50 ms until the client goes away. */
function trickle(res: ServerResponse, status: number): void {
  res.writeHead(status, { "content-type": "application/json", "content-length": "100000" });
  const timer = setInterval(() => res.write(" "), 50);
  res.on("close", () => clearInterval(timer));
}

const RUN = "run-fake";
const CARD = "card-1";

describe("bounds", () => {
  test("an answer body over 8 MiB is not read, and not retried", async () => {
    const srv = await fakeServer((_req, res) => json(res, 201, { run_id: "run-1", run_token: "tok", sequence: 1, pad: "x".repeat(9 << 20) }));
    try {
      const client = new Client(srv.url, { token: "t" });
      await assert.rejects(client.createRun(), (e: unknown) => e instanceof UnexpectedResponse && e.status === 201);
      assert.deepEqual(srv.requests, ["POST /api/runs"]);
    } finally {
      await srv.close();
    }
  });

  test("a refusal of the live stream that trickles in is read for at most the request timeout", { timeout: 20_000 }, async () => {
    let streams = 0;
    const srv = await fakeServer((req, res) => {
      const path = new URL(req.url ?? "/", "http://x").pathname;
      if (req.method === "POST" && path.endsWith("/approval-requests")) {
        json(res, 201, { run_id: RUN, request_id: CARD, display_id: "A-1", state: "pending", sequence: 2 });
      } else if (req.method === "GET" && path.endsWith(`/approval-requests/${CARD}`)) {
        json(res, 200, {
          run_id: RUN,
          request_id: CARD,
          display_id: "A-1",
          tool_name: "web_fetch",
          tool_call_id: CARD,
          approval_id: CARD,
          state: "pending",
          created_at: "2026-01-01T00:00:00Z",
          expires_at: "2026-01-01T00:05:00Z",
        });
      } else if (path.endsWith("/stream")) {
        streams += 1;
        if (streams === 1) return trickle(res, 503);
        const resolved = { sequence: 3, type: "tool.approval_resolved", requestId: CARD, approved: true, decidedBy: "alice", scope: "once" };
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write(`retry: 10\n\nid: 3\nevent: tool.approval_resolved\ndata: ${JSON.stringify(resolved)}\n\n`);
      } else {
        json(res, 404, { error: "no", code: "not_found", request_id: "f" });
      }
    });
    try {
      const client = new Client(srv.url, { token: "t", requestTimeoutMs: 500, reconnect: { maxDelayMs: 50 } });
      const decision = await client.run(RUN, "run-token").gate("web_fetch", { requestId: CARD });
      assert.equal(decision.state, "approved");
      assert.equal(streams, 2);
    } finally {
      await srv.close();
    }
  });
});
