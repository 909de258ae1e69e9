// Approval gates: arm a card before a tool call and wait for a human's decision on the
// run's live stream, resumed with Last-Event-ID across drops and windows.
import { randomUUID } from "node:crypto";
import type { ReadableStreamReadResult } from "node:stream/web";
import { createParser, type EventSourceMessage } from "eventsource-parser";
import { RunEnded, runTerminal, TollgateError, TransportError, Unavailable, WaitTimedOut } from "./errors.js";
import { argumentsHash } from "./hash.js";
import { bearer, describe, readCapped, refusal, sleep, USER_AGENT } from "./http.js";
import type { Run } from "./client.js";
import { unref } from "./keep.js";
import { WsUnavailable } from "./live.js";
import type { Armed, Card, DecisionState, Event, Scope } from "./types.js";

/** The server's default card timeout. */
export const DEFAULT_GATE_TIMEOUT_MS = 300_000;
/** The longest card timeout any server accepts (7 days; a deployment may cap it lower). */
export const MAX_GATE_TIMEOUT_MS = 7 * 24 * 3600 * 1000;
/** The event that announces a card's resolution. */
export const APPROVAL_RESOLVED = "tool.approval_resolved";
/** The most a stream frame (or a line) may buffer before the response is dropped as broken. */
export const MAX_FRAME_CHARS = 4 << 20;

/** Why a gate reopened the live stream. */
export type ReconnectReason = "window_end" | "dropped" | "stalled" | "unavailable";

/** What a gate tells `onReconnect` before it reopens the live stream. */
export interface ReconnectInfo {
  /** The last sequence it has; the next request carries it as `Last-Event-ID`. */
  after: number;
  reason: ReconnectReason;
  /** How long it waits first. */
  delayMs: number;
  /** Reopenings so far, this one included. */
  count: number;
  /** The failure, for `dropped`, `stalled` and `unavailable`. */
  error?: unknown;
}

/** What `run.gate(toolName, options)` takes. */
export interface GateOptions {
  /** The call's arguments: only their hash (`arguments_hash`) leaves the process, binding the approval to them. */
  arguments?: unknown;
  /** The URL the call will reach, shown on the card. */
  url?: string;
  /** A message for the human. */
  message?: string;
  /** Why the agent wants the call, shown on the card. */
  intention?: string;
  /**
   * What the human is shown of the arguments (a JSON object), display only: the hash
   * binds the call. The server replaces values under secret-looking keys (`password`,
   * `token`, `api_key`, `authorization`, `credential…`, …) with `"[redacted]"` and
   * bounds it (4 KiB, 4 levels, strings cut at 256 characters).
   */
  argumentsPreview?: Record<string, unknown>;
  /** The card's id (default: a fresh UUID). The same one again finds the same card. */
  requestId?: string;
  /** The tool call's id (default: the request id). */
  toolCallId?: string;
  /** The approval attempt's id (default: the request id). */
  approvalId?: string;
  /**
   * How long the card waits for a human before it expires (rounded up to whole
   * seconds; 1 s to 7 days; default 300 s). The gate waits that long plus the client's
   * `expiryGraceMs` for the expiry to be reported, then throws {@link WaitTimedOut}.
   */
  timeoutMs?: number;
  /** Aborts the wait (the card stays as it is on the server). */
  signal?: AbortSignal;
  /** Called once the card is armed and waits for a human (not when a policy approved it at once). */
  onArmed?: (card: { requestId: string; displayId: string; sequence: number | undefined; expiresAt: string | undefined }) => void;
  /** Every run event the wait reads after the card, once each, in sequence order. */
  onEvent?: (event: Event) => void;
  /** Called before each reopening of the live stream. */
  onReconnect?: (info: ReconnectInfo) => void;
}

interface Verdict {
  state: DecisionState;
  scope: Scope | undefined;
  decidedBy: string | undefined;
  auto: boolean;
}

/** How a gate ended: `.approved`, `.state` (`approved` / `denied` / `expired`), `.scope`. */
export class Decision {
  readonly approved: boolean;
  readonly state: DecisionState;
  /** The scope it was approved with (a policy's scope when `auto`). */
  readonly scope: Scope | undefined;
  /** Who decided (`policy:<id>` when a policy approved it; `auto` alone says that). */
  readonly decidedBy: string | undefined;
  /** Whether a durable policy approved it without a card (the card's `auto_approved`; such a call is not on the execution ledger). */
  readonly auto: boolean;
  readonly requestId: string;
  readonly toolCallId: string;
  readonly approvalId: string;
  readonly toolName: string;
  readonly argumentsHash: string | undefined;
  readonly runId: string;

  /** @internal */
  constructor(v: Verdict, call: { runId: string; requestId: string; toolCallId: string; approvalId: string; toolName: string; argumentsHash: string | undefined }) {
    this.state = v.state;
    this.approved = v.state === "approved";
    this.scope = v.scope;
    this.decidedBy = v.decidedBy;
    this.auto = v.auto;
    this.runId = call.runId;
    this.requestId = call.requestId;
    this.toolCallId = call.toolCallId;
    this.approvalId = call.approvalId;
    this.toolName = call.toolName;
    this.argumentsHash = call.argumentsHash;
  }
}

function scopeOf(s: unknown): Scope {
  return s === "run" || s === "tool" || s === "always" ? s : "once";
}

function str(v: unknown): string | undefined {
  return typeof v === "string" ? v : undefined;
}

/** From a `tool.approval_resolved` payload. */
function verdictFromEvent(data: Record<string, unknown>): Verdict {
  const decidedBy = str(data.decidedBy);
  if (data.approved === true) return { state: "approved", scope: scopeOf(data.scope), decidedBy, auto: false };
  if (data.expired === true) return { state: "expired", scope: undefined, decidedBy, auto: false };
  return { state: "denied", scope: undefined, decidedBy, auto: false };
}

/** From a card; `undefined` while it is pending (or its run's end closed it). */
function verdictFromCard(card: Card): Verdict | undefined {
  if (card.reason === "run_ended") return undefined;
  const decidedBy = card.decided_by ?? undefined;
  switch (card.state) {
    case "approved":
      // Only the card's own flag says a policy approved it: `decided_by` is whatever the
      // decider's token names.
      return { state: "approved", scope: scopeOf(card.scope), decidedBy, auto: card.auto_approved === true };
    case "denied":
      return { state: "denied", scope: undefined, decidedBy, auto: false };
    case "expired":
      return { state: "expired", scope: undefined, decidedBy, auto: false };
    default:
      return undefined;
  }
}

export async function gateCall(run: Run, toolName: string, options: GateOptions): Promise<Decision> {
  const timeoutMs = options.timeoutMs ?? DEFAULT_GATE_TIMEOUT_MS;
  if (!(timeoutMs > 0) || timeoutMs > MAX_GATE_TIMEOUT_MS) throw new RangeError("a gate's timeoutMs must be 1 ms to 7 days");
  const requestId = options.requestId ?? randomUUID();
  const hash = options.arguments === undefined ? undefined : argumentsHash(options.arguments);
  const body: Record<string, unknown> = {
    request_id: requestId,
    tool_name: toolName,
    timeout_seconds: Math.ceil(timeoutMs / 1000),
  };
  const optional: [string, unknown][] = [
    ["tool_call_id", options.toolCallId],
    ["approval_id", options.approvalId],
    ["url", options.url],
    ["intention", options.intention],
    ["message", options.message],
    ["arguments_hash", hash],
    ["arguments_preview", options.argumentsPreview],
  ];
  for (const [k, v] of optional) if (v !== undefined) body[k] = v;
  const { body: armed } = await run.call<Armed>("POST", ["approval-requests"], [200, 201], body, options.signal);
  const call = {
    runId: run.id,
    requestId,
    toolCallId: options.toolCallId ?? requestId,
    approvalId: options.approvalId ?? requestId,
    toolName,
    argumentsHash: hash,
  };
  if (armed.state === "approved" && armed.auto_approved === true) {
    const decidedBy = armed.policy_id ? `policy:${armed.policy_id}` : undefined;
    return new Decision({ state: "approved", scope: scopeOf(armed.scope), decidedBy, auto: true }, call);
  }
  if (armed.state !== "pending") {
    // A repeated arm of a card decided meanwhile: the card says by whom.
    const verdict = verdictFromCard(await run.approval(requestId, { signal: options.signal }));
    if (verdict !== undefined) return new Decision(verdict, call);
  }
  options.onArmed?.({
    requestId,
    displayId: armed.display_id,
    sequence: armed.sequence ?? undefined,
    expiresAt: armed.expires_at ?? undefined,
  });
  // A fresh card's resolution follows its `tool.approval_required`; a repeated arm does
  // not say where that is, so the wait reads from the start.
  const watch = new Watch(run, requestId, armed.sequence ?? 0, options);
  const verdict = await watch.untilResolved(Date.now() + timeoutMs + run.http.config.expiryGraceMs);
  return new Decision(verdict, call);
}

type Step =
  | { kind: "resolved"; verdict: Verdict }
  | { kind: "ended" }
  | { kind: "again"; delayMs: number }
  | { kind: "fallback" }
  | { kind: "sse" }
  | { kind: "failed"; reason: ReconnectReason; error: unknown; retryAfterMs?: number | undefined; progressed: boolean };

class Watch {
  private after: number;
  private streaming = true;
  /** Over WebSocket (while one is advertised and opens), else the SSE stream. */
  private websocket = true;
  private hintMs = 1000;
  private reconnects = 0;

  constructor(
    private readonly run: Run,
    private readonly requestId: string,
    after: number,
    private readonly options: GateOptions,
  ) {
    this.after = after;
  }

  async untilResolved(giveUpAt: number): Promise<Verdict> {
    const signal = this.options.signal;
    const started = Date.now();
    let failures = 0;
    let first = true;
    for (;;) {
      signal?.throwIfAborted();
      if (Date.now() >= giveUpAt) {
        const v = await this.cardVerdict().catch(() => undefined);
        if (v !== undefined) return v;
        throw new WaitTimedOut(`gave up waiting for approval request ${this.requestId} after ${Date.now() - started} ms`);
      }
      if (this.streaming && !first) {
        // The safety net: after every reconnect, the card itself.
        try {
          const v = await this.cardVerdict();
          if (v !== undefined) return v;
        } catch (err) {
          if (!(err instanceof TollgateError && err.retryable)) throw err;
        }
      }
      first = false;
      const step = !this.streaming ? await this.pollOnce() : this.websocket ? await this.wsOnce(giveUpAt) : await this.streamOnce(giveUpAt);
      let delayMs: number;
      let reason: ReconnectReason = "window_end";
      let error: unknown;
      switch (step.kind) {
        case "resolved":
          return step.verdict;
        case "ended": {
          const v = await this.cardVerdict().catch(() => undefined);
          if (v !== undefined) return v;
          throw new RunEnded(`run ${this.run.id} ended while waiting for approval request ${this.requestId}`);
        }
        case "again":
          failures = 0;
          delayMs = step.delayMs;
          break;
        case "fallback":
          this.streaming = false;
          continue;
        case "sse":
          this.websocket = false;
          first = true;
          continue;
        case "failed": {
          // A connection that brought new events was not a failing server.
          failures = step.progressed ? 1 : failures + 1;
          delayMs = this.reconnectDelay(failures, step.retryAfterMs);
          reason = step.reason;
          error = step.error;
          break;
        }
      }
      if (this.streaming) {
        this.reconnects += 1;
        this.options.onReconnect?.({ after: this.after, reason, delayMs, count: this.reconnects, error });
      }
      // Unref'd, as are the wait's stream and timers: the gate's promise holds the process
      // open while someone awaits it (keep.ts), nothing else does.
      await sleep(Math.min(delayMs, Math.max(0, giveUpAt - Date.now())), signal, { ref: false });
    }
  }

  /** The server's hint (clamped to the client's bounds), doubling per failure, at least `Retry-After`. */
  private reconnectDelay(failures: number, retryAfterMs: number | undefined): number {
    const { reconnectMinMs: min, reconnectMaxMs: max } = this.run.http.config;
    const base = Math.min(Math.max(this.hintMs, min), max);
    const backoff = Math.min(base * 2 ** Math.min(failures - 1, 16), max);
    return Math.max(backoff, Math.min(retryAfterMs ?? 0, max));
  }

  private async cardVerdict(): Promise<Verdict | undefined> {
    return verdictFromCard(await this.run.approval(this.requestId, { signal: this.options.signal }));
  }

  /** The event at `seq` with its JSON: seen once, in order; its resolution, if it is this card's. */
  private take(seq: number, type: string | undefined, event: Event | undefined): Verdict | undefined {
    this.after = seq;
    if (event !== undefined) this.options.onEvent?.(event);
    if (type === APPROVAL_RESOLVED && event !== undefined && event.requestId === this.requestId) {
      // Closed by its run's end (announced just before the terminal event, which follows):
      // the run's end is the answer, not an expiry.
      if (event.reason === "run_ended") return undefined;
      return verdictFromEvent(event);
    }
    return undefined;
  }

  /** The wait over WebSocket: the follower resumes across drops by itself. */
  private async wsOnce(giveUpAt: number): Promise<Step> {
    const live = await this.run.live().catch(() => undefined);
    if (live === undefined) return { kind: "sse" };
    const signal = this.options.signal;
    const stop = () => live.close();
    const timer = unref(setTimeout(stop, Math.max(0, giveUpAt - Date.now())));
    signal?.addEventListener("abort", stop, { once: true });
    try {
      for await (const event of live.unheld(this.run.id, this.after)) {
        const v = this.take(event.sequence, event.type, event.data);
        if (v !== undefined) return { kind: "resolved", verdict: v };
      }
      return { kind: "ended" };
    } catch (err) {
      signal?.throwIfAborted();
      // Reconnecting with the run token after the run ended: the card as the run left it.
      if (runTerminal(err)) return { kind: "ended" };
      if (err instanceof WsUnavailable) return live.connections === 0 ? { kind: "sse" } : { kind: "again", delayMs: 0 };
      throw err;
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", stop);
      live.close();
    }
  }

  /** One live-stream response from `after`. */
  private async streamOnce(giveUpAt: number): Promise<Step> {
    const http = this.run.http;
    const signal = this.options.signal;
    const ctrl = new AbortController();
    const onAbort = () => ctrl.abort(signal?.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    let progressed = false;
    const failed = (reason: ReconnectReason, error: unknown, retryAfterMs?: number): Step => ({ kind: "failed", reason, error, retryAfterMs, progressed });
    try {
      let resp: Response;
      const openTimer = unref(setTimeout(() => ctrl.abort(new TransportError("opening the live stream timed out")), http.config.requestTimeoutMs));
      try {
        resp = await http.openStream(
          http.url(["api", "runs", this.run.id, "stream"], undefined, http.streamBase),
          {
            authorization: bearer(this.run.token),
            accept: "text/event-stream",
            "last-event-id": String(this.after),
            "user-agent": USER_AGENT,
          },
          ctrl.signal,
        );
      } catch (err) {
        signal?.throwIfAborted();
        return failed("dropped", new TransportError(`opening the live stream: ${describe(err)}`, { cause: err }));
      } finally {
        clearTimeout(openTimer);
      }
      if (resp.status !== 200) {
        if (resp.status === 404 || resp.status === 405) {
          await resp.body?.cancel().catch(() => undefined);
          return { kind: "fallback" };
        }
        // The refusal's body, read within the request timeout and up to its cap (a
        // body that breaks off, trickles past the timeout or is too large is left out).
        let body: unknown = null;
        const readTimer = unref(setTimeout(() => ctrl.abort(new TransportError("reading the live stream's refusal timed out")), http.config.requestTimeoutMs));
        try {
          const t = await readCapped(resp);
          body = t ? JSON.parse(t) : null;
        } catch {
          body = null;
        } finally {
          clearTimeout(readTimer);
        }
        signal?.throwIfAborted();
        const error = refusal({
          status: resp.status,
          body,
          requestId: resp.headers.get("x-request-id") ?? undefined,
          retryAfterMs: undefined,
        });
        if (error instanceof Unavailable) {
          const ra = resp.headers.get("retry-after");
          return failed("unavailable", error, ra && /^\d+$/.test(ra.trim()) ? Number(ra.trim()) * 1000 : undefined);
        }
        throw error;
      }
      if (!(resp.headers.get("content-type") ?? "").startsWith("text/event-stream") || resp.body === null) {
        await resp.body?.cancel().catch(() => undefined);
        return { kind: "fallback" };
      }
      const items: ({ retry: number } | { frame: EventSourceMessage })[] = [];
      let overflow = false;
      const parser = createParser({
        onEvent: (frame) => items.push({ frame }),
        onRetry: (retry) => items.push({ retry }),
        onError: (err) => {
          if (err.type === "max-buffer-size-exceeded") overflow = true;
        },
        maxBufferSize: MAX_FRAME_CHARS,
      });
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const left = giveUpAt - Date.now();
        if (left <= 0) return { kind: "again", delayMs: 0 };
        const wait = Math.min(http.config.streamStallMs, left);
        let timer: NodeJS.Timeout | undefined;
        const stalled = new Promise<"stalled">((resolve) => {
          timer = unref(setTimeout(() => resolve("stalled"), wait));
        });
        let chunk: ReadableStreamReadResult<string> | "stalled";
        try {
          chunk = await Promise.race([reader.read(), stalled]);
        } catch (err) {
          signal?.throwIfAborted();
          return failed("dropped", new TransportError(`the live stream broke: ${describe(err)}`, { cause: err }));
        } finally {
          clearTimeout(timer);
        }
        if (chunk === "stalled") {
          if (Date.now() >= giveUpAt) return { kind: "again", delayMs: 0 };
          return failed("stalled", new TransportError(`nothing received on the live stream for ${wait} ms`));
        }
        // The end of a window: resume after the server's hint.
        if (chunk.done) return { kind: "again", delayMs: this.reconnectDelay(1, undefined) };
        try {
          parser.feed(chunk.value);
        } catch {
          overflow = true;
        }
        for (const item of items.splice(0)) {
          if ("retry" in item) {
            this.hintMs = item.retry;
            continue;
          }
          const { frame } = item;
          if (frame.event === "done" && frame.id === undefined) return { kind: "ended" };
          const seq = frame.id === undefined ? NaN : Number(frame.id);
          if (!Number.isSafeInteger(seq) || seq <= this.after) continue; // seen already
          let event: Event | undefined;
          try {
            event = JSON.parse(frame.data) as Event;
          } catch {
            event = undefined;
          }
          progressed = true;
          const v = this.take(seq, frame.event, event);
          if (v !== undefined) return { kind: "resolved", verdict: v };
        }
        if (overflow) {
          return failed("dropped", new TransportError(`the live stream broke (a frame over ${MAX_FRAME_CHARS} characters)`));
        }
      }
    } finally {
      signal?.removeEventListener("abort", onAbort);
      ctrl.abort();
    }
  }

  /** One polling round: pages from `after` until none has more. */
  private async pollOnce(): Promise<Step> {
    const poll = this.run.http.config.pollIntervalMs;
    for (;;) {
      let page;
      try {
        page = await this.run.events(this.after, 1000, { signal: this.options.signal });
      } catch (err) {
        if (err instanceof TollgateError && err.retryable) {
          return { kind: "failed", reason: "unavailable", error: err, retryAfterMs: (err as Unavailable).retryAfterMs, progressed: false };
        }
        throw err;
      }
      for (const event of page.events) {
        if (event.sequence <= this.after) continue;
        const v = this.take(event.sequence, event.type, event);
        if (v !== undefined) return { kind: "resolved", verdict: v };
      }
      this.after = Math.max(this.after, page.next_after);
      if (page.terminal) return { kind: "ended" };
      if (!page.has_more || page.events.length === 0) return { kind: "again", delayMs: poll };
    }
  }
}

/**
 * @internal `run.follow()` on the SSE stream: the events after `state.after`, once each and
 * in order, resumed with `Last-Event-ID` after each window's end or drop, until the run
 * ended; `state.streaming` turns false where the stream is not offered (404/405, or an
 * answer that is not `text/event-stream`).
 */
export async function* followSse(run: Run, state: { after: number; streaming: boolean }, signal?: AbortSignal): AsyncGenerator<Event, void, undefined> {
  const http = run.http;
  let hintMs = 1000;
  let failures = 0;
  for (;;) {
    signal?.throwIfAborted();
    let progressed = false;
    let failed = false;
    const ctrl = new AbortController();
    const onAbort = () => ctrl.abort(signal?.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      let resp: Response | undefined;
      const openTimer = unref(setTimeout(() => ctrl.abort(new TransportError("opening the live stream timed out")), http.config.requestTimeoutMs));
      try {
        resp = await http.openStream(
          http.url(["api", "runs", run.id, "stream"], undefined, http.streamBase),
          { authorization: bearer(run.token), accept: "text/event-stream", "last-event-id": String(state.after), "user-agent": USER_AGENT },
          ctrl.signal,
        );
      } catch {
        signal?.throwIfAborted();
        failed = true;
      } finally {
        clearTimeout(openTimer);
      }
      if (resp !== undefined && (resp.status === 404 || resp.status === 405 || (resp.status === 200 && !(resp.headers.get("content-type") ?? "").startsWith("text/event-stream")) || resp.body === null)) {
        await resp.body?.cancel().catch(() => undefined);
        state.streaming = false;
        return;
      }
      if (resp !== undefined && resp.status !== 200) {
        let body: unknown = null;
        try {
          const t = await readCapped(resp);
          body = t ? JSON.parse(t) : null;
        } catch {
          body = null;
        }
        const error = refusal({ status: resp.status, body, requestId: resp.headers.get("x-request-id") ?? undefined, retryAfterMs: undefined });
        if (!(error instanceof Unavailable)) throw error;
        failed = true;
      } else if (resp?.body != null) {
        const frames: EventSourceMessage[] = [];
        let overflow = false;
        const parser = createParser({
          onEvent: (frame) => frames.push(frame),
          onRetry: (retry) => (hintMs = Math.min(retry, http.config.reconnectMaxMs)),
          onError: (err) => {
            if (err.type === "max-buffer-size-exceeded") overflow = true;
          },
          maxBufferSize: MAX_FRAME_CHARS,
        });
        const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
        for (;;) {
          let timer: NodeJS.Timeout | undefined;
          const stalled = new Promise<"stalled">((resolve) => (timer = unref(setTimeout(() => resolve("stalled"), http.config.streamStallMs))));
          let chunk: ReadableStreamReadResult<string> | "stalled";
          try {
            chunk = await Promise.race([reader.read(), stalled]);
          } catch {
            signal?.throwIfAborted();
            failed = true;
            break;
          } finally {
            clearTimeout(timer);
          }
          if (chunk === "stalled") {
            failed = true;
            break;
          }
          if (chunk.done) break; // the end of a window
          try {
            parser.feed(chunk.value);
          } catch {
            overflow = true;
          }
          for (const frame of frames.splice(0)) {
            if (frame.event === "done" && frame.id === undefined) return;
            const seq = frame.id === undefined ? NaN : Number(frame.id);
            if (!Number.isSafeInteger(seq) || seq <= state.after) continue;
            let event: Event;
            try {
              event = JSON.parse(frame.data) as Event;
            } catch {
              event = { sequence: seq, type: frame.event ?? "" } as Event;
            }
            state.after = seq;
            progressed = true;
            yield event;
          }
          if (overflow) {
            failed = true;
            break;
          }
        }
      }
    } finally {
      signal?.removeEventListener("abort", onAbort);
      ctrl.abort();
    }
    failures = failed && !progressed ? failures + 1 : 0;
    const { reconnectMinMs: min, reconnectMaxMs: max } = http.config;
    const base = Math.min(Math.max(hintMs, min), max);
    // Unref'd, as is the stream: `run.follow()` holds the process open while a `next()` waits (keep.ts).
    await sleep(failures === 0 ? base : Math.min(base * 2 ** Math.min(failures - 1, 16), max), signal, { ref: false });
  }
}
