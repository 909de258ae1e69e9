import { randomUUID } from "node:crypto";
import { inspect } from "node:util";
import { runTerminal, UnexpectedResponse } from "./errors.js";
import { executeCall, type ExecuteOptions, type Executed, type Execution } from "./execution.js";
import { followSse, gateCall, type Decision, type GateOptions } from "./gate.js";
import { Http, sleep, type ClientOptions } from "./http.js";
import { heldWhileWaiting, whileAwaited } from "./keep.js";
import { LiveConnection, WsUnavailable } from "./live.js";
import type {
  Appended,
  Card,
  CreateRunOptions,
  Event,
  EventInput,
  EventPage,
  MutationRecord,
  RunEnded,
  RunReceipt,
} from "./types.js";

/** Most events one append request carries (the server's batch limit). */
export const MAX_BATCH_EVENTS = 99;

/** A connection to one Tollgate server as one agent (its JWT). */
export class Client {
  readonly #http: Http;
  readonly #token: string;

  /**
   * A client of the server at `baseUrl` (e.g. `http://127.0.0.1:8080`; a path prefix
   * such as an API stage is kept) acting with the agent's JWT `options.token`.
   */
  constructor(baseUrl: string, options: ClientOptions) {
    if (typeof options?.token !== "string" || options.token.trim() === "") {
      throw new TypeError("the agent token is empty");
    }
    this.#http = new Http(baseUrl, options);
    this.#token = options.token.trim();
  }

  /**
   * One WebSocket connection following several runs with the agent's token (close it when
   * done). Throws WsUnavailable where `GET /api/live` advertises no WebSocket endpoint.
   */
  async live(): Promise<LiveConnection> {
    const url = await this.#http.websocketUrl(this.#token);
    if (url === undefined) throw new WsUnavailable("no WebSocket endpoint is advertised here");
    const c = this.#http.config;
    return new LiveConnection(url, this.#token, { maxBackoffMs: c.reconnectMaxMs, stallMs: c.streamStallMs, WebSocket: this.#http.websocket.ctor });
  }

  /**
   * Creates a run (`POST /api/runs`). Safe to retry: with a `delivery_id` the server
   * answers a repeat with the same run (and {@link Client.receipt} finds it later);
   * without one the client picks the `run_id` itself, so a repeat after a lost answer
   * finds the run the first attempt made. `run.created` tells 201 from 200.
   */
  async createRun(options: CreateRunOptions = {}, init: { signal?: AbortSignal } = {}): Promise<Run> {
    // `null` is "not given", like `undefined`: without a run_id or delivery_id the client
    // picks the run_id, so a retry finds the run its first attempt made.
    const body: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(options)) if (v != null) body[k] = v;
    if (body.run_id === undefined && body.delivery_id === undefined) {
      body.run_id = `run-${randomUUID().replaceAll("-", "")}`;
    }
    const { status, body: receipt } = await this.#http.json<RunReceipt>(
      "POST",
      this.#http.url(["api", "runs"]),
      this.#token,
      [200, 201],
      body,
      init.signal,
    );
    return this.#runFrom(status, receipt, status === 201, options.delivery_id ?? undefined);
  }

  /**
   * The run a create with this `delivery_id` made (`GET /api/receipts/{delivery_id}`),
   * with its `status`; {@link NotFound} when there is none (or another agent made it).
   */
  async receipt(deliveryId: string, init: { signal?: AbortSignal } = {}): Promise<Run> {
    const { status, body } = await this.#http.json<RunReceipt>(
      "GET",
      this.#http.url(["api", "receipts", deliveryId]),
      this.#token,
      [200],
      undefined,
      init.signal,
    );
    return this.#runFrom(status, body, false, deliveryId);
  }

  /** A handle on an existing run from its id and run token. Nothing is sent. */
  run(runId: string, runToken: string): Run {
    return new Run(this.#http, runId, runToken, { created: false });
  }

  #runFrom(status: number, body: RunReceipt, created: boolean, deliveryId: string | undefined): Run {
    if (typeof body.run_id !== "string" || typeof body.run_token !== "string") {
      throw new UnexpectedResponse("the run's answer lacks run_id or run_token", { status });
    }
    return new Run(this.#http, body.run_id, body.run_token, {
      created,
      deliveryId,
      status: body.status ?? undefined,
      agenthostCredential: body.agenthost_credential ?? undefined,
    });
  }

  [inspect.custom](): string {
    return `Client { baseUrl: '${this.#http.base.href}' }`;
  }
}

/**
 * One run: its id and its run token (never shown by `console.log` or `JSON.stringify`).
 * Every method talks to the server with the run token.
 */
export class Run {
  /** The run's id. */
  readonly id: string;
  /** Whether `createRun` created it just now (201) rather than found an earlier attempt's (200). */
  readonly created: boolean;
  /** The `delivery_id` it was created or found with, when any. */
  readonly deliveryId: string | undefined;
  /** Its status when a receipt was read (`running`, `completed`, …). */
  readonly status: string | undefined;
  readonly #http: Http;
  readonly #token: string;
  readonly #agenthostCredential: string | undefined;

  /** @internal */
  constructor(
    http: Http,
    id: string,
    token: string,
    extra: { created: boolean; deliveryId?: string | undefined; status?: string | undefined; agenthostCredential?: string | undefined },
  ) {
    this.#http = http;
    this.id = id;
    this.#token = token;
    this.created = extra.created;
    this.deliveryId = extra.deliveryId;
    this.status = extra.status;
    this.#agenthostCredential = extra.agenthostCredential;
  }

  /** The run's token (a secret: give it only to whoever acts for this run). */
  get token(): string {
    return this.#token;
  }

  /** For a pod run: the credential its pod checks on forwarded decisions. */
  get agenthostCredential(): string | undefined {
    return this.#agenthostCredential;
  }

  /** @internal The HTTP side, for the gate and the execution guard. */
  get http(): Http {
    return this.#http;
  }

  /** @internal `/api/runs/{id}/<rest>`. */
  url(rest: string[], query?: Record<string, string | number | undefined>): URL {
    return this.#http.url(["api", "runs", this.id, ...rest], query);
  }

  /** @internal `method` on `/api/runs/{id}/<rest>` with the run token; the body when the status is in `ok`. */
  async call<T>(method: string, rest: string[], ok: number[], body?: unknown, signal?: AbortSignal): Promise<{ status: number; body: T }> {
    return this.#http.json<T>(method, this.url(rest), this.#token, ok, body, signal);
  }

  /**
   * Appends events (`POST /api/runs/{id}/events`) and returns their sequences, in
   * order. Each event is an object with a `type`; one without an `event_id` gets a
   * fresh UUID (as does one whose `event_id` is `null`), so a retried request (transport error, 429, 5xx; `Retry-After`
   * honoured) answers the original sequences instead of appending twice. 4xx are never
   * retried. More than 99 events go in several requests (each atomic on its own).
   */
  async append(...events: (EventInput | EventInput[])[]): Promise<number[]> {
    const flat = events.flat();
    if (flat.length === 0) throw new TypeError("nothing to append");
    const keyed = flat.map((e, i) => {
      if (e === null || typeof e !== "object" || Array.isArray(e) || typeof e.type !== "string") {
        throw new TypeError(`events[${i}] must be an object with a string "type"`);
      }
      // `event_id: null` is "not given": such an event gets a fresh id too.
      return e.event_id == null ? { ...e, event_id: randomUUID() } : { ...e };
    });
    const sequences: number[] = [];
    for (let i = 0; i < keyed.length; i += MAX_BATCH_EVENTS) {
      const batch = keyed.slice(i, i + MAX_BATCH_EVENTS);
      const { status, body } = await this.call<Appended>("POST", ["events"], [200], { events: batch });
      if (!Array.isArray(body.sequences) || body.sequences.length !== batch.length) {
        throw new UnexpectedResponse("the append's answer lacks one sequence per event", { status });
      }
      sequences.push(...body.sequences);
    }
    return sequences;
  }

  /** @internal A WebSocket connection for this run with its token (undefined where none is advertised). */
  async live(): Promise<LiveConnection | undefined> {
    const url = await this.#http.websocketUrl(this.#token);
    if (url === undefined) return undefined;
    const c = this.#http.config;
    return new LiveConnection(url, this.#token, {
      runId: this.id,
      maxBackoffMs: c.reconnectMaxMs,
      stallMs: c.streamStallMs,
      WebSocket: this.#http.websocket.ctor,
    });
  }

  /**
   * The run's events after `after`, each once and in sequence order, until the run ended
   * and every event was handed out: over WebSocket where `GET /api/live` advertises one,
   * else (or when it cannot be opened) on the SSE stream, resumed with `Last-Event-ID`,
   * else from the event pages, read every `pollIntervalMs`. The process is held open
   * while a `next()` waits for an event, not between events: a follow left as it is
   * does not keep the process alive.
   */
  follow(after = 0, init: { signal?: AbortSignal } = {}): AsyncGenerator<Event, void, undefined> {
    return heldWhileWaiting(this.#follow(after, init));
  }

  async *#follow(after: number, init: { signal?: AbortSignal }): AsyncGenerator<Event, void, undefined> {
    const live = await this.live();
    if (live !== undefined) {
      try {
        for await (const event of live.follow(this.id, after)) {
          init.signal?.throwIfAborted();
          after = event.sequence;
          yield event.data;
        }
        return;
      } catch (err) {
        if (runTerminal(err)) {
          // The run ended while the connection was down, and a run token of an ended run
          // connects no more: the rest is read from the event pages.
          yield* this.rest(after, init);
          return;
        }
        if (!(err instanceof WsUnavailable) || live.connections > 0) throw err;
      } finally {
        live.close();
      }
    }
    const state = { after, streaming: true };
    for await (const event of followSse(this, state, init.signal)) yield event;
    if (state.streaming) return; // the run ended
    yield* this.rest(state.after, init);
  }

  /** The events after `after` from the event pages, until the run ended and all were read. */
  private async *rest(after: number, init: { signal?: AbortSignal }): AsyncGenerator<Event, void, undefined> {
    for (;;) {
      const page = await this.events(after, 1000, init);
      for (const event of page.events) {
        if (event.sequence <= after) continue;
        after = event.sequence;
        yield event;
      }
      after = Math.max(after, page.next_after);
      if (page.terminal && !page.has_more) return;
      if (!page.has_more || page.events.length === 0) await sleep(this.#http.config.pollIntervalMs, init.signal, { ref: false });
    }
  }

  /** One page of the run's events after `after` (`limit` 1–1000, default 100). */
  async events(after = 0, limit?: number, init: { signal?: AbortSignal } = {}): Promise<EventPage> {
    const { body } = await this.#http.json<EventPage>(
      "GET",
      this.url(["events"], { after, limit }),
      this.#token,
      [200],
      undefined,
      init.signal,
    );
    return body;
  }

  /** Completes the run (`run_completed`, `fields` in it). Repeating answers the same sequence. */
  complete(fields: Record<string, unknown> = {}): Promise<RunEnded> {
    return this.#finish("complete", fields);
  }

  /** Fails the run (`run_failed`). */
  fail(fields: Record<string, unknown> = {}): Promise<RunEnded> {
    return this.#finish("fail", fields);
  }

  /** Cancels the run (`run_cancelled`). */
  cancel(fields: Record<string, unknown> = {}): Promise<RunEnded> {
    return this.#finish("cancel", fields);
  }

  async #finish(verb: string, fields: Record<string, unknown>): Promise<RunEnded> {
    return (await this.call<RunEnded>("POST", [verb], [200], fields)).body;
  }

  /** The card `requestId` as the server holds it; {@link NotFound} (`state: "unknown"`) when none. */
  async approval(requestId: string, init: { signal?: AbortSignal } = {}): Promise<Card> {
    return (await this.call<Card>("GET", ["approval-requests", requestId], [200], undefined, init.signal)).body;
  }

  /**
   * Arms an approval gate before calling `toolName` and waits for its decision: at once
   * when a policy approves it, else on the live stream (resumed with `Last-Event-ID`
   * across drops and windows; polling the event pages where the stream is not
   * offered). See {@link GateOptions}. The wait holds the process open once its promise
   * is awaited (or given a `then`/`catch`); a gate nobody awaits does not keep the
   * process alive (its card stays pending on the server).
   */
  gate(toolName: string, options: GateOptions = {}): Promise<Decision> {
    return whileAwaited(gateCall(this, toolName, options));
  }

  /**
   * Runs an approved call under the execution guard: start → `await ex.dispatch()`
   * right before the transport → settle by what actually happened (a result →
   * `confirmed`; a throw after dispatch → `ambiguous`, thrown as {@link OutcomeUnknown};
   * a throw before → `not_sent`, rethrown). An ambiguous call is never retried.
   */
  execute<T>(decision: Decision, options: ExecuteOptions, fn: (ex: Execution) => Promise<T>): Promise<Executed<T>>;
  execute<T>(decision: Decision, fn: (ex: Execution) => Promise<T>): Promise<Executed<T>>;
  execute<T>(
    decision: Decision,
    optionsOrFn: ExecuteOptions | ((ex: Execution) => Promise<T>),
    maybeFn?: (ex: Execution) => Promise<T>,
  ): Promise<Executed<T>> {
    if (typeof optionsOrFn === "function") return executeCall(this, decision, {}, optionsOrFn);
    if (maybeFn === undefined) throw new TypeError("execute needs the function that sends the call");
    return executeCall(this, decision, optionsOrFn, maybeFn);
  }

  /** A durable `mutation_outcome/v1` record. */
  async mutation(toolCallId: string, approvalId: string): Promise<MutationRecord> {
    return (await this.call<MutationRecord>("GET", ["mutations", toolCallId, approvalId], [200])).body;
  }

  toJSON(): { id: string } {
    return { id: this.id };
  }

  [inspect.custom](): string {
    return `Run { id: '${this.id}', created: ${this.created} }`;
  }
}
