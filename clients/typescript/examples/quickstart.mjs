// An agent that asks before fetching a URL, then fetches it under the execution guard.
//   TOLLGATE_URL, AGENT_TOKEN: the server and an agent JWT (`make run` prints both);
//   FETCH_URL: the page to fetch (default https://example.com/).
// When it prints "waiting for approval: tollgate approve RUN REQUEST", approve it from
// another shell with that command (TOLLGATE_TOKEN=$OPERATOR_TOKEN).
import { Client } from "@tollgate/client";

const client = new Client(process.env.TOLLGATE_URL ?? "http://127.0.0.1:8080", { token: process.env.AGENT_TOKEN ?? "" });
const run = await client.createRun({ owner: "local-operator", budget: { tools: { web_fetch: 1 }, call_ceiling: 5 } });
await run.append({ type: "agent.message", text: "looking this up" });

const url = process.env.FETCH_URL ?? "https://example.com/";
const decision = await run.gate("web_fetch", {
  url,
  message: "The agent wants to fetch a URL.",
  arguments: { url },
  onArmed: (card) => console.log(`waiting for approval: tollgate approve ${run.id} ${card.requestId}`),
});
console.log(`decision: ${decision.state}${decision.decidedBy ? ` by ${decision.decidedBy}` : ""}`);
if (decision.approved) {
  const executed = await run.execute(decision, async (ex) => {
    await ex.dispatch(); // right before the request leaves
    const resp = await fetch(url, { signal: ex.signal });
    ex.result({ http_status: resp.status });
    return resp.status;
  });
  console.log(`fetched ${url}: HTTP ${executed.value}, recorded ${executed.state}`);
}
const ended = await run.complete();
console.log(`run ${run.id} ${ended.status}`);
