// The execution guard for approved mutations: start → dispatch right before the
// transport → settle by what actually happened.
//
// | what happened                               | evidence   | durable record    |
// |---------------------------------------------|------------|-------------------|
// | the function returned (a response arrived)  | confirmed  | completed         |
// | it threw, or timed out, after dispatch      | ambiguous  | outcome_unknown   |
// | it threw (or returned) before dispatch      | not_sent   | not_executed      |
//
// An ambiguous call is never retried: `execute` throws OutcomeUnknown, and a new start
// of that tool call is refused by the server (409 outcome_unknown, also thrown as
// OutcomeUnknown) until an operator reconciles it. Only the ledger's HTTP requests are
// retried, each idempotent. When `start` or `dispatch` is refused or fails, nothing is
// sent and the client settles nothing: the server has settled a refused attempt
// already, and its settlement deadline settles an undispatched intent `not_executed`
// (a dispatch whose answer was lost, `outcome_unknown`: this process cannot tell
// whether it was sent).
//
// The dispatch is the line: the function may send only once `ex.dispatch()` resolved.
// When the guard ends (its timeout, or the function throwing) while a dispatch is still
// in flight, that dispatch never resolves for the function — it rejects, nothing may be
// sent, and the attempt settles `not_sent`.
//
// What is recorded of a failure is a fixed code and the error's name, never its message
// (it may hold a URL with a key in it); a message of the caller's own goes in with
// `SendFailed`. Facts that are not JSON are recorded as `{code: "facts_unserializable"}`
// and the call still settles.
import { Conflict, ExecutionTimeout, OutcomeUnknown, SendFailed, TollgateError, conflict } from "./errors.js";
import type { Run } from "./client.js";
import type { Decision } from "./gate.js";
import type { Evidence, ExecutionAnswer, MutationState } from "./types.js";

/** The most bytes of result and error facts together the server keeps. */
export const MAX_FACTS_BYTES = 32 * 1024;
const MAX_MESSAGE_CHARS = 1000;

/** What `run.execute(decision, options, fn)` takes. */
export interface ExecuteOptions {
  /** The tool call's id (default: the decision's; it must be the one the card names). */
  toolCallId?: string;
  /**
   * How long `fn` may take (default 30 s). Past it after dispatch, the call is settled
   * `ambiguous`, `ex.signal` aborts and OutcomeUnknown is thrown; before dispatch, or
   * while a dispatch is in flight (which then rejects: do not send), it is settled
   * `not_sent` and ExecutionTimeout is thrown.
   */
  timeoutMs?: number;
}

/** What the function that sends the call receives. */
export interface Execution {
  readonly runId: string;
  readonly toolCallId: string;
  readonly approvalId: string;
  readonly toolName: string;
  /** `<run_id>:<tool_call_id>:<approval_id>`: one key per attempt, for remote APIs that deduplicate. */
  readonly idempotencyKey: string;
  /** Aborted when the guard's timeout passes: stop sending. */
  readonly signal: AbortSignal;
  /**
   * `intent → dispatched` (`POST …/dispatch`). Await it right before the transport:
   * only when it resolves may the request go out; when it rejects, nothing may be sent.
   */
  dispatch(): Promise<void>;
  /**
   * Facts of the response to record (`confirmed`), e.g. `{http_status: 200}`; never
   * credentials or whole payloads. Copied as JSON now; what is not JSON (a BigInt, a
   * cycle) is recorded as `{code: "facts_unserializable"}`.
   */
  result(facts: unknown): void;
  /** Facts of an application-level error response (still `confirmed`: the remote side answered); as for `result`. */
  error(facts: unknown): void;
}

/** An executed call. */
export interface Executed<T> {
  /** What the function returned. */
  value: T;
  /** The evidence recorded (`undefined` for a call a policy approved: not on the ledger). */
  evidence: Evidence | undefined;
  /** The durable record's state after settling (`undefined` when not ledgered or the settlement failed). */
  state: MutationState | undefined;
  /** Recording the evidence failed after retries; the server's deadline settles it conservatively. */
  settlementError?: TollgateError;
}

type Phase = "before" | "dispatching" | "dispatched" | "refused" | "withheld" | "closed";

/** What stands in for facts that are not JSON. */
const FACTS_UNSERIALIZABLE = "facts_unserializable";

function clip(s: string): string {
  return s.length > MAX_MESSAGE_CHARS ? s.slice(0, MAX_MESSAGE_CHARS) : s;
}

/**
 * The error facts of a failure: a fixed code, the error's name, and a message only when
 * it is this client's own (a timeout) or the caller wrote it for the record
 * ({@link SendFailed}).
 */
function failure(code: string, err: unknown): Record<string, unknown> {
  const named = err instanceof SendFailed && err.cause !== undefined ? err.cause : err;
  const type = named instanceof Error ? named.name : typeof named;
  const facts: Record<string, unknown> = { code, type: clip(type) };
  if ((err instanceof SendFailed || err instanceof ExecutionTimeout) && err.message) facts.message = clip(err.message);
  return facts;
}

/** `v` as plain JSON (a copy), or a stub saying it is not JSON. */
function jsonFact(v: unknown): unknown {
  if (v === undefined) return undefined;
  try {
    const text = JSON.stringify(v);
    if (text !== undefined) return JSON.parse(text) as unknown;
  } catch {
    // a BigInt, a cycle, a throwing toJSON
  }
  return { code: FACTS_UNSERIALIZABLE };
}

function size(v: unknown): number {
  return v === undefined ? 0 : Buffer.byteLength(JSON.stringify(v) ?? "", "utf8");
}

/** The settle body, facts as JSON and bounded to what the server keeps. */
function settleBody(approvalId: string, evidence: Evidence, result: unknown, error: unknown): Record<string, unknown> {
  result = jsonFact(result);
  error = jsonFact(error);
  if (size(result) + size(error) > MAX_FACTS_BYTES) {
    const stub = (v: unknown) => (v === undefined ? undefined : { code: "facts_too_large", bytes: size(v) });
    result = stub(result);
    error = stub(error);
  }
  const body: Record<string, unknown> = { approval_id: approvalId, evidence };
  if (result !== undefined) body.result = result;
  if (error !== undefined) body.error = error;
  return body;
}

export async function executeCall<T>(run: Run, decision: Decision, options: ExecuteOptions, fn: (ex: Execution) => Promise<T>): Promise<Executed<T>> {
  if (!decision.approved) {
    throw new Conflict(`the call was not approved (${decision.state}); nothing is sent`, { state: decision.state });
  }
  const toolCallId = options.toolCallId ?? decision.toolCallId;
  const approvalId = decision.approvalId;
  const timeoutMs = options.timeoutMs ?? 30_000;
  const guard = new AbortController();
  // `closing`: the guard has ended (timeout or throw); a dispatch answered after it is withheld.
  const st: { phase: Phase; refusal?: unknown; closing: boolean } = { phase: "before", closing: false };
  let dispatching: Promise<void> | undefined;
  let result: unknown;
  let errorFacts: unknown;
  const ledgered = !decision.auto;

  if (ledgered) {
    const startBody: Record<string, unknown> = {
      request_id: decision.requestId,
      approval_id: approvalId,
      tool_name: decision.toolName,
    };
    if (decision.argumentsHash !== undefined) startBody.arguments_hash = decision.argumentsHash;
    const { body } = await run.call<ExecutionAnswer>("POST", ["tool-calls", toolCallId, "start"], [200], startBody);
    if (body.state !== "intent") {
      // A repeated start answers the attempt's later state: it is not ours to send.
      const state = typeof body.state === "string" ? body.state : undefined;
      throw conflict(`the attempt is already ${state ?? "in an unknown state"}; it is not sent again`, {
        status: 200,
        state,
        approvalId,
        reason: typeof body.reason === "string" ? body.reason : undefined,
        body,
      });
    }
  }

  const ex: Execution = {
    runId: run.id,
    toolCallId,
    approvalId,
    toolName: decision.toolName,
    idempotencyKey: `${run.id}:${toolCallId}:${approvalId}`,
    signal: guard.signal,
    dispatch() {
      if (dispatching !== undefined) return dispatching;
      if (st.phase !== "before" || st.closing) {
        const late = Promise.reject(new Error("too late to dispatch: the guarded call has ended"));
        late.catch(() => undefined);
        return late;
      }
      st.phase = "dispatching";
      dispatching = (async () => {
        if (!ledgered) {
          st.phase = "dispatched";
          return;
        }
        try {
          const { body } = await run.call<ExecutionAnswer>("POST", ["tool-calls", toolCallId, "dispatch"], [200], { approval_id: approvalId });
          if (body.state !== "dispatched") {
            throw conflict("dispatch did not answer dispatched; do not send", {
              status: 200,
              state: typeof body.state === "string" ? body.state : undefined,
              body,
            });
          }
        } catch (err) {
          st.phase = "refused";
          st.refusal = err;
          throw err;
        }
        if (st.closing) {
          // The guard ended while the dispatch was in flight: the function is not
          // permitted to send, so nothing is sent.
          st.phase = "withheld";
          throw new ExecutionTimeout("the guarded call ended before its dispatch was answered; do not send");
        }
        st.phase = "dispatched";
      })();
      // Awaited by the function, or not: the guard reads the outcome from `st` either way.
      dispatching.catch(() => undefined);
      return dispatching;
    },
    result(facts) {
      result = jsonFact(facts);
    },
    error(facts) {
      errorFacts = jsonFact(facts);
    },
  };

  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      const err = new ExecutionTimeout(`no response within ${timeoutMs} ms`);
      // At once, so that a dispatch answered from now on is withheld from the function.
      st.closing = true;
      guard.abort(err);
      reject(err);
    }, timeoutMs);
  });
  let value: T;
  try {
    value = await Promise.race([fn(ex), timedOut]);
  } catch (err) {
    clearTimeout(timer);
    st.closing = true;
    const wasTimeout = err instanceof ExecutionTimeout;
    // A dispatch still in flight is withheld (the function may not send any more), or
    // was answered before the guard ended: that decides which side of the line this is.
    if (st.phase === "dispatching") await dispatching?.catch(() => undefined);
    const at = st.phase;
    st.phase = "closed";
    if (at === "refused" || !ledgered) throw err; // nothing sent and nothing to settle, or not on the ledger
    if (at === "dispatched") {
      const facts = failure(wasTimeout ? "timeout" : "transport", err);
      const settled = await settle(run, toolCallId, settleBody(approvalId, "ambiguous", undefined, facts));
      const unknown = new OutcomeUnknown(
        `${decision.toolName} was dispatched and then ${wasTimeout ? "timed out" : "failed"}: its outcome is unknown (recorded ambiguous); it is not retried`,
        { state: "outcome_unknown", approvalId, cause: err },
      );
      if (settled instanceof TollgateError) Object.assign(unknown, { settlementError: settled });
      throw unknown;
    }
    // Before dispatch (or its answer withheld): nothing left this process.
    await settle(run, toolCallId, settleBody(approvalId, "not_sent", undefined, failure("not_sent", err)));
    throw err;
  }
  clearTimeout(timer);
  // A dispatch the function started but did not await decides which side of the line this is.
  if (st.phase === "dispatching") await dispatching?.catch(() => undefined);
  const at = st.phase;
  st.phase = "closed";
  if (!ledgered) return { value, evidence: undefined, state: undefined };
  // The dispatch was refused (or its answer lost): nothing may have been sent by this
  // permit, and this process cannot say what was; the server's deadline settles it.
  if (at === "refused") throw st.refusal;
  if (at === "dispatched") {
    const settled = await settle(run, toolCallId, settleBody(approvalId, "confirmed", result, errorFacts));
    return settled instanceof TollgateError
      ? { value, evidence: "confirmed", state: undefined, settlementError: settled }
      : { value, evidence: "confirmed", state: settled };
  }
  // Returned without dispatching: nothing was sent.
  const settled = await settle(run, toolCallId, settleBody(approvalId, "not_sent", undefined, { code: "not_sent", message: "returned without dispatching" }));
  return settled instanceof TollgateError
    ? { value, evidence: "not_sent", state: undefined, settlementError: settled }
    : { value, evidence: "not_sent", state: settled };
}

/** Records evidence; the record's state, or the error (never thrown: the call's outcome matters more). */
async function settle(run: Run, toolCallId: string, body: Record<string, unknown>): Promise<MutationState | TollgateError> {
  try {
    const { body: answer } = await run.call<ExecutionAnswer>("POST", ["tool-calls", toolCallId, "settle"], [200], body);
    return String(answer.state) as MutationState;
  } catch (err) {
    if (err instanceof TollgateError) return err;
    throw err;
  }
}

