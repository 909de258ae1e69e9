// One server, requests with bounded retries, answers as JSON. Tokens go only into the
// Authorization header and never into an error message.
import { TransportError, UnexpectedResponse, errorFromAnswer, TollgateError } from "./errors.js";
import { request as httpRequest, type IncomingMessage } from "node:http";
import { request as httpsRequest } from "node:https";
import { Readable } from "node:stream";
import { unref } from "./keep.js";
import { resolveWebSocketUrl, type WebSocketConstructor } from "./live.js";

/** How often, and how far apart, a request is tried. */
export interface RetryOptions {
  /** Attempts in all, the first included (default 4). */
  maxAttempts?: number;
  /** The cap of the first retry's wait (default 200 ms), doubling per retry. */
  baseDelayMs?: number;
  /** The largest cap (default 5 s). */
  maxDelayMs?: number;
  /** The longest `Retry-After` honoured (default 30 s). */
  maxRetryAfterMs?: number;
}

/** How a client talks to the server. */
export interface ClientOptions {
  /** The agent's JWT. */
  token: string;
  /** Where the live stream is served, when not at `baseUrl` (a deployment's stream URL). */
  streamUrl?: string;
  /** Retries of transport errors, 429 and 5xx. 4xx are never retried. */
  retry?: RetryOptions;
  /** How long one attempt of a plain request may take, its answer read to the end (default 30 s; also opening the live stream, and reading a refusal of it). */
  requestTimeoutMs?: number;
  /** A live stream that sends nothing this long is reopened (default 45 s; keep-alives come every 15 s). */
  streamStallMs?: number;
  /** Between two reads of the event pages when the live stream is unavailable (default 1 s). */
  pollIntervalMs?: number;
  /** How long past a card's deadline a gate waits for its expiry to be reported (default 120 s). */
  expiryGraceMs?: number;
  /** Bounds of the wait before reopening the live stream (the server's `retry:` hint, clamped; default 100 ms to 30 s). */
  reconnect?: { minDelayMs?: number; maxDelayMs?: number };
  /** The fetch to use (default: the global one). */
  fetch?: typeof fetch;
  /**
   * Follow runs over WebSocket where `GET /api/live` advertises an endpoint (default
   * true; else, or when it cannot be opened, the SSE stream, then the event pages).
   */
  websocket?: boolean;
  /** The WebSocket implementation (default: `globalThis.WebSocket`, else the `ws` package). */
  WebSocket?: WebSocketConstructor;
}

export interface Config {
  retry: Required<RetryOptions>;
  requestTimeoutMs: number;
  streamStallMs: number;
  pollIntervalMs: number;
  expiryGraceMs: number;
  reconnectMinMs: number;
  reconnectMaxMs: number;
}

export const USER_AGENT = "tollgate-client-ts/0.1.0";
/** The largest answer body read (a larger one is not read to its end). */
export const MAX_BODY_BYTES = 8 << 20;

export function config(options: ClientOptions): Config {
  return {
    retry: {
      maxAttempts: options.retry?.maxAttempts ?? 4,
      baseDelayMs: options.retry?.baseDelayMs ?? 200,
      maxDelayMs: options.retry?.maxDelayMs ?? 5000,
      maxRetryAfterMs: options.retry?.maxRetryAfterMs ?? 30_000,
    },
    requestTimeoutMs: options.requestTimeoutMs ?? 30_000,
    streamStallMs: options.streamStallMs ?? 45_000,
    pollIntervalMs: options.pollIntervalMs ?? 1000,
    expiryGraceMs: options.expiryGraceMs ?? 120_000,
    reconnectMinMs: options.reconnect?.minDelayMs ?? 100,
    reconnectMaxMs: options.reconnect?.maxDelayMs ?? 30_000,
  };
}

/** A server's answer. */
export interface Answer {
  status: number;
  body: unknown;
  requestId: string | undefined;
  retryAfterMs: number | undefined;
}

/** Whether an answer with this status is worth another attempt. */
export function retryableStatus(status: number): boolean {
  return status === 429 || status === 500 || status === 502 || status === 503 || status === 504;
}

/** The wait before retry `retry` (1, 2, …): jittered backoff, raised to `Retry-After`. */
export function retryDelay(policy: Required<RetryOptions>, retry: number, retryAfterMs: number | undefined): number {
  const cap = Math.min(policy.baseDelayMs * 2 ** Math.min(retry - 1, 20), policy.maxDelayMs);
  const jittered = cap * (0.5 + Math.random() * 0.5);
  return retryAfterMs === undefined ? jittered : Math.max(jittered, Math.min(retryAfterMs, policy.maxRetryAfterMs));
}

/** `Retry-After` in milliseconds (seconds or an HTTP date). */
export function parseRetryAfter(value: string | null): number | undefined {
  if (value === null) return undefined;
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1000;
  const at = Date.parse(trimmed);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

/**
 * Sleeps `ms`, or rejects with the signal's reason when it aborts first. With `ref:
 * false` the timer alone does not keep the process alive (for background waits, held
 * open by whoever awaits them: keep.ts).
 */
export function sleep(ms: number, signal?: AbortSignal, options: { ref?: boolean } = {}): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, ms));
    if (options.ref === false) unref(timer);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A transport failure in one line, without URL or headers. */
export function describe(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as { cause?: unknown }).cause;
    const deeper = cause instanceof Error ? `: ${cause.message}` : "";
    return `${err.name === "TimeoutError" ? "timed out" : err.message}${deeper}`;
  }
  return String(err);
}

export class Http {
  readonly base: URL;
  readonly streamBase: URL;
  readonly config: Config;
  readonly fetch: typeof fetch;

  constructor(baseUrl: string, options: ClientOptions) {
    this.base = parseBase(baseUrl);
    this.streamBase = options.streamUrl === undefined ? this.base : parseBase(options.streamUrl);
    this.config = config(options);
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.#ownFetch = options.fetch === undefined;
    this.websocket = { enabled: options.websocket ?? true, ctor: options.WebSocket };
  }

  /** No `fetch` was given: the live stream is opened with node:http (its socket unref'd). */
  readonly #ownFetch: boolean;

  /**
   * @internal Opens the live stream (`GET`, no redirects followed): with the given
   * `fetch`, else with node:http on a connection of its own whose socket is unref'd, so
   * that a stream open only to follow a run does not keep the process alive (a follow or
   * gate someone awaits holds it open: keep.ts). Aborting `signal` closes it.
   */
  openStream(url: URL, headers: Record<string, string>, signal: AbortSignal): Promise<Response> {
    if (!this.#ownFetch || typeof process === "undefined" || typeof process.versions?.node !== "string") {
      return this.fetch(url, { headers, redirect: "manual", signal });
    }
    return new Promise<Response>((resolve, reject) => {
      signal.throwIfAborted();
      const req = (url.protocol === "https:" ? httpsRequest : httpRequest)(url, { method: "GET", headers, signal, agent: false });
      req.once("socket", (socket) => socket.unref());
      req.on("error", reject);
      req.once("response", (res: IncomingMessage) => {
        const head = new Headers();
        for (const [name, value] of Object.entries(res.headers)) {
          for (const v of Array.isArray(value) ? value : value === undefined ? [] : [value]) head.append(name, v);
        }
        const status = res.statusCode ?? 0;
        try {
          const body = status === 204 || status === 304 ? null : (Readable.toWeb(res) as unknown as ReadableStream<Uint8Array>);
          if (body === null) res.resume();
          resolve(new Response(body, { status, headers: head }));
        } catch (err) {
          res.destroy();
          reject(err);
        }
      });
      req.end();
    });
  }

  /** @internal The WebSocket settings. */
  readonly websocket: { enabled: boolean; ctor: WebSocketConstructor | undefined };
  #websocketUrl: Promise<string | undefined> | undefined;

  /**
   * @internal The WebSocket endpoint `GET /api/live` advertises, resolved against the
   * base URL; learnt once per client (undefined: none, or turned off).
   */
  websocketUrl(token: string): Promise<string | undefined> {
    if (!this.websocket.enabled) return Promise.resolve(undefined);
    if (this.#websocketUrl === undefined) {
      const learnt = this.json<{ websocket_url?: string | null; sse: boolean }>("GET", this.url(["api", "live"]), token, [200]).then(
        ({ body }) => {
          const advertised = body.websocket_url;
          return typeof advertised === "string" && advertised !== "" ? resolveWebSocketUrl(this.base, advertised) : undefined;
        },
        (err: unknown) => {
          // A server from before the endpoint (404) answers the same next time; anything else may not.
          if (!(err instanceof TollgateError && (err.status === 404 || err.status === 405))) this.#websocketUrl = undefined;
          return undefined;
        },
      );
      this.#websocketUrl = learnt;
    }
    return this.#websocketUrl;
  }

  /** `base/seg/seg/…`, every segment percent-encoded (a base path prefix is kept). */
  url(segments: string[], query?: Record<string, string | number | undefined>, base: URL = this.base): URL {
    const url = new URL(base.href);
    const prefix = url.pathname.replace(/\/+$/, "");
    url.pathname = `${prefix}/${segments.map(encodeURIComponent).join("/")}`;
    for (const [k, v] of Object.entries(query ?? {})) {
      if (v !== undefined) url.searchParams.set(k, String(v));
    }
    return url;
  }

  /**
   * Sends a request, retrying transport errors, 429 and 5xx as the policy allows (every
   * request of this client is idempotent by the contract); the last answer whatever
   * its status, or {@link TransportError}.
   */
  async send(method: string, url: URL, token: string, body?: unknown, signal?: AbortSignal): Promise<Answer> {
    const policy = this.config.retry;
    for (let attempt = 1; ; attempt++) {
      let answer: Answer | undefined;
      let failure: unknown;
      try {
        answer = await this.once(method, url, token, body, signal);
      } catch (err) {
        if (signal?.aborted) throw signal.reason;
        if (err instanceof UnexpectedResponse) throw err;
        failure = err;
      }
      const again = answer === undefined || retryableStatus(answer.status);
      if (!again || attempt >= Math.max(1, policy.maxAttempts)) {
        if (answer !== undefined) return answer;
        throw new TransportError(`${method} ${url.pathname}: ${describe(failure)}`, { cause: failure });
      }
      await sleep(retryDelay(policy, attempt, answer?.retryAfterMs), signal);
    }
  }

  /** {@link Http.send}, then the body when the status is one of `ok`, else the refusal as an error. */
  async json<T>(method: string, url: URL, token: string, ok: number[], body?: unknown, signal?: AbortSignal): Promise<{ status: number; body: T }> {
    const answer = await this.send(method, url, token, body, signal);
    if (!ok.includes(answer.status)) throw refusal(answer);
    if (answer.body === null || typeof answer.body !== "object") {
      throw new UnexpectedResponse(`${method} ${url.pathname} answered ${answer.status} without a JSON object`, {
        status: answer.status,
        requestId: answer.requestId,
      });
    }
    return { status: answer.status, body: answer.body as T };
  }

  private async once(method: string, url: URL, token: string, body: unknown, signal: AbortSignal | undefined): Promise<Answer> {
    const timeout = AbortSignal.timeout(this.config.requestTimeoutMs);
    const headers: Record<string, string> = {
      authorization: bearer(token),
      accept: "application/json",
      "user-agent": USER_AGENT,
    };
    if (body !== undefined) headers["content-type"] = "application/json";
    const resp = await this.fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      redirect: "manual",
      signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
    });
    const content = await readCapped(resp);
    if (content === undefined && resp.status >= 200 && resp.status < 300) {
      throw new UnexpectedResponse(`${method} ${url.pathname} answered ${resp.status} with a body over ${MAX_BODY_BYTES >> 20} MiB`, {
        status: resp.status,
        requestId: resp.headers.get("x-request-id") ?? undefined,
      });
    }
    // A refusal too large to read says no more than its status.
    return answerOf(resp, content ?? "");
  }
}

/**
 * A response's body as text, read to its end, or `undefined` when it is over `cap`
 * bytes (it is then not read further). Bounded in time by the request's signal.
 */
export async function readCapped(resp: Response, cap: number = MAX_BODY_BYTES): Promise<string | undefined> {
  if (resp.body === null) return "";
  const reader = resp.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      size += value.byteLength;
      if (size > cap) {
        await reader.cancel().catch(() => undefined);
        return undefined;
      }
      chunks.push(value);
    }
  } finally {
    reader.releaseLock();
  }
  return Buffer.concat(chunks).toString("utf8");
}

/** An answer from its head and body text; a body that is not JSON becomes `{error: <its text>}`. */
export function answerOf(resp: Response, text: string): Answer {
  let parsed: unknown = null;
  if (text.length > 0) {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = { error: text.slice(0, 200) };
    }
  }
  return {
    status: resp.status,
    body: parsed,
    requestId: resp.headers.get("x-request-id") ?? undefined,
    retryAfterMs: parseRetryAfter(resp.headers.get("retry-after")),
  };
}

/** A refusal answer as an error. */
export function refusal(answer: Answer): TollgateError {
  return errorFromAnswer(answer.status, answer.body, answer.requestId, answer.retryAfterMs);
}

export function bearer(token: string): string {
  const t = token.trim();
  if (t.length === 0 || /[\r\n]/.test(t)) throw new TypeError("the token is empty or not a valid header value");
  return `Bearer ${t}`;
}

function parseBase(baseUrl: string): URL {
  let url: URL;
  try {
    url = new URL(baseUrl.trim());
  } catch {
    throw new TypeError("the server URL is not a URL");
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new TypeError("the server URL must start with http:// or https://");
  }
  url.search = "";
  url.hash = "";
  return url;
}
