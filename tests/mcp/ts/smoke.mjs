// The MCP gateway through the official TypeScript MCP SDK: initialize, tools/list, and a
// tools/call that waits for its card, approved here over HTTP as the operator. Prints one
// JSON line of what it saw; tests/mcp/test_typescript_sdk.py checks it and the run.
//
// Env: TOLLGATE_BIN, TOLLGATE_MCP_ECHO, TOLLGATE_URL, AGENT_TOKEN, OPERATOR_TOKEN, NAME.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`smoke.mjs: ${k} is not set`);
  return v;
};
const url = env("TOLLGATE_URL");
const name = env("NAME");
const operator = { Authorization: `Bearer ${env("OPERATOR_TOKEN")}`, "Content-Type": "application/json" };

async function http(method, path, body) {
  const res = await fetch(url + path, { method, headers: operator, body: body && JSON.stringify(body) });
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${await res.text()}`);
  return res.json();
}

const transport = new StdioClientTransport({
  command: env("TOLLGATE_BIN"),
  args: ["mcp", "proxy", "--name", name, "--", env("TOLLGATE_MCP_ECHO")],
  env: { PATH: process.env.PATH ?? "", TOLLGATE_URL: url, TOLLGATE_TOKEN: env("AGENT_TOKEN"), RUST_LOG: "warn" },
  stderr: "inherit",
});
const client = new Client({ name: "tollgate-ts-smoke", version: "1.0.0" });
await client.connect(transport);
const server = client.getServerVersion();
const { tools } = await client.listTools();

const answer = client.callTool({ name: "echo", arguments: { text: "from typescript" } }, undefined, {
  timeout: 30_000,
});
let card;
for (let i = 0; i < 150 && !card; i++) {
  const page = await http("GET", "/api/approvals?state=pending");
  card = page.approvals.find((c) => c.tool_name === `mcp__${name}__echo`);
  if (!card) await new Promise((r) => setTimeout(r, 100));
}
if (!card) throw new Error("smoke.mjs: no card for the call");
const decided = await http("POST", `/api/runs/${card.run_id}/tool-approvals`, { request_id: card.request_id });
const result = await answer;
await client.close();
console.log(JSON.stringify({ server, tools, card, decided, result }));
