// Following runs live over WebSocket: the `tollgate.v1` protocol of `GET /api/ws`
// (`tollgate serve`) or a deployment's WebSocket API, whichever `GET /api/live` advertises.
//
// One LiveConnection follows several runs (at most MAX_SUBSCRIPTIONS at once). The client
// rule, per run: keep the last sequence handed out and drop a frame at or below it; hold
// a frame that skips ahead (at most `maxHeld` per run; past that the held frames are
// dropped) and subscribe again with `after` = that last sequence; reopen a dropped
// connection after a bounded, jittered backoff and subscribe every run again the same
// way. So every sequence comes out exactly once and in order; after a run's `done` frame
// its follow ends. Events waiting for their reader are bounded too (`buffer` per run):
// past that a frame is not taken, and the run is subscribed again once its reader caught up.
import { randomInt } from "node:crypto";
import { connect as netConnect, isIP, type NetConnectOpts, type Socket } from "node:net";
import { connect as tlsConnect, type ConnectionOptions } from "node:tls";
import { errorFromAnswer, TransportError } from "./errors.js";
import { USER_AGENT } from "./http.js";
import { heldWhileWaiting, unref } from "./keep.js";
import type { Event } from "./types.js";

/** The subprotocol offered (and answered by the server). */
export const SUBPROTOCOL = "tollgate.v1";
/** Prefix of the subprotocol entry that carries the credential. */
export const BEARER_PREFIX = "bearer.";
/** Runs one connection follows at once (the server refuses one more). */
export const MAX_SUBSCRIPTIONS = 16;

/** No WebSocket connection could be opened (none advertised, or the upgrade failed): follow the SSE stream instead. */
export class WsUnavailable extends TransportError {}

/** One run event, handed out once and in sequence order. */
export interface LiveEvent {
  runId: string;
  sequence: number;
  /** The event's type. */
  type: string;
  /** The event exactly as replay serves it. */
  data: Event;
}

/** The part of the WebSocket API this client uses (browsers' and Node's global one, and the `ws` package's). */
export interface WebSocketLike {
  readonly readyState: number;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: unknown) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
}

/** A WebSocket constructor (`globalThis.WebSocket`, or the `ws` package's). */
export type WebSocketConstructor = new (url: string, protocols: string[], options?: unknown) => WebSocketLike;

/** What a LiveConnection takes besides its URL and token. */
export interface LiveOptions {
  /** The run a run token is for (a run token follows that run only; sent as `?run_id=`). */
  runId?: string;
  /** Frames past a gap held per run (default 256). */
  maxHeld?: number;
  /** Events per run handed over but not yet read (default 256). */
  buffer?: number;
  /** How long opening a connection may take (default 10 s). */
  openTimeoutMs?: number;
  /** The longest wait between reconnects (default 30 s). */
  maxBackoffMs?: number;
  /** A connection that receives nothing this long is reopened (default 45 s; the client pings every 15 s). */
  stallMs?: number;
  /** The WebSocket implementation (default: `globalThis.WebSocket`, else the `ws` package). */
  WebSocket?: WebSocketConstructor;
}

/**
 * `advertised` (`GET /api/live`'s `websocket_url`) as a WebSocket URL: an absolute
 * `ws`/`wss` one as it is, `http`/`https` with the scheme swapped, a path resolved
 * against `base` (its path prefix kept) with `http`→`ws`, `https`→`wss`; undefined otherwise.
 */
export function resolveWebSocketUrl(base: URL | string, advertised: string): string | undefined {
  let url: URL;
  try {
    if (advertised.startsWith("/")) {
      url = new URL(String(base));
      url.pathname = url.pathname.replace(/\/+$/, "") + advertised;
      url.search = "";
      url.hash = "";
    } else {
      url = new URL(advertised);
    }
  } catch {
    return undefined;
  }
  const scheme = ({ "http:": "ws:", "ws:": "ws:", "https:": "wss:", "wss:": "wss:" } as Record<string, string>)[url.protocol];
  if (scheme === undefined || url.host === "") return undefined;
  return scheme + url.href.slice(url.protocol.length);
}

let nodeWs: WebSocketConstructor | undefined;

/**
 * On Node the `ws` package (its sockets are unref'd, see {@link unrefConnection}; Node's
 * own `globalThis.WebSocket`, from 22 on, cannot be), elsewhere `globalThis.WebSocket`.
 */
async function webSocketConstructor(given: WebSocketConstructor | undefined): Promise<{ ctor: WebSocketConstructor; node: boolean }> {
  if (given !== undefined) return { ctor: given, node: false };
  const global = (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
  const onNode = typeof process !== "undefined" && typeof process.versions?.node === "string";
  if (global !== undefined && !onNode) return { ctor: global, node: false };
  if (nodeWs === undefined) {
    const mod = await import("ws");
    nodeWs = mod.WebSocket as unknown as WebSocketConstructor;
  }
  return { ctor: nodeWs, node: true };
}

/**
 * The `ws` package's `createConnection` (what it uses by default, `net.connect` or
 * `tls.connect`) with the socket unref'd: a connection open only to follow runs does
 * not keep the process alive; a follow or gate someone awaits holds it open instead (keep.ts).
 */
function unrefConnection(secure: boolean): (options: Record<string, unknown>) => Socket {
  return (options) => {
    let socket: Socket;
    if (secure) {
      const servername = options.servername as string | undefined;
      const host = String(options.host ?? "");
      socket = tlsConnect({ ...options, path: undefined, servername: servername || servername === "" ? servername : isIP(host) ? "" : host } as ConnectionOptions);
    } else {
      socket = netConnect({ ...options, path: options.socketPath } as NetConnectOpts);
    }
    return socket.unref();
  };
}

function statusOf(code: unknown): number {
  const map: Record<string, number> = {
    unauthorized: 401,
    forbidden: 403,
    not_found: 404,
    too_many_streams: 429,
    limit_reached: 429,
    unavailable: 503,
    internal: 503,
  };
  return (typeof code === "string" ? map[code] : undefined) ?? 400;
}

function transient(status: number): boolean {
  return status >= 500 || status === 408 || status === 429;
}

type Item = { kind: "event"; event: LiveEvent } | { kind: "done" } | { kind: "error"; error: unknown };

class Sub {
  held = new Map<number, { type: string; data: Event }>();
  pending = false;
  ended = false;
  /** Frames were left untaken (the reader fell behind): subscribe again once it caught up. */
  behind = false;
  queue: Item[] = [];
  wake: (() => void) | undefined;
  constructor(
    readonly runId: string,
    public last: number,
  ) {}
  push(item: Item): void {
    this.queue.push(item);
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }
}

/**
 * One WebSocket connection following runs:
 *
 *     const live = await client.live();
 *     try {
 *       for await (const event of live.follow(runId)) { ... }
 *     } finally {
 *       live.close();
 *     }
 */
export class LiveConnection {
  readonly #url: string;
  readonly #token: string;
  readonly #runId: string | undefined;
  readonly #maxHeld: number;
  readonly #buffer: number;
  readonly #openTimeoutMs: number;
  readonly #maxBackoffMs: number;
  readonly #stallMs: number;
  readonly #given: WebSocketConstructor | undefined;
  readonly #subs = new Map<string, Sub>();
  #socket: WebSocketLike | undefined;
  #opening = false;
  #closed = false;
  #fatal: unknown;
  #failures = 0;
  #retryTimer: ReturnType<typeof setTimeout> | undefined;
  #pingTimer: ReturnType<typeof setInterval> | undefined;
  #lastReceived = 0;
  /** Connections opened (the first and every reconnect). */
  connections = 0;
  /** Frames dropped as repeats. */
  repeats = 0;
  /** Frames that skipped ahead (held, or dropped past the bound). */
  skips = 0;

  constructor(url: string, token: string, options: LiveOptions = {}) {
    if (token.trim() === "") throw new TypeError("the token is empty");
    this.#url = url;
    this.#token = token.trim();
    this.#runId = options.runId;
    this.#maxHeld = Math.max(1, options.maxHeld ?? 256);
    this.#buffer = Math.max(1, options.buffer ?? 256);
    this.#openTimeoutMs = options.openTimeoutMs ?? 10_000;
    this.#maxBackoffMs = options.maxBackoffMs ?? 30_000;
    this.#stallMs = options.stallMs ?? 45_000;
    this.#given = options.WebSocket;
  }

  toString(): string {
    return `LiveConnection { url: '${this.#url}' }`;
  }

  /**
   * The run's events after `after`, each once and in order, until the run ended and all
   * were handed out. Throws what the server refused (Unauthorized, Forbidden, NotFound, …),
   * or WsUnavailable when the first connection could not be opened. The process is held
   * open while a `next()` waits for an event, not between events: a follow left as it
   * is (on an unclosed connection) does not keep the process alive.
   */
  follow(runId: string, after = 0): AsyncGenerator<LiveEvent, void, undefined> {
    return heldWhileWaiting(this.unheld(runId, after));
  }

  /** @internal {@link LiveConnection.follow} holding nothing open (a gate's wait, held by its promise's awaiter). */
  async *unheld(runId: string, after = 0): AsyncGenerator<LiveEvent, void, undefined> {
    if (this.#closed) throw new TypeError("this LiveConnection is closed");
    if (this.#fatal !== undefined) throw this.#fatal;
    if (this.#subs.has(runId)) throw new TypeError(`run ${runId} is followed on this connection already`);
    if (this.#subs.size >= MAX_SUBSCRIPTIONS) throw new TypeError(`a connection follows at most ${MAX_SUBSCRIPTIONS} runs at once`);
    const sub = new Sub(runId, Math.max(0, after));
    this.#subs.set(runId, sub);
    if (this.#socket !== undefined && this.#socket.readyState === 1) this.#subscribe(sub);
    else void this.#open();
    try {
      for (;;) {
        while (sub.queue.length === 0) await new Promise<void>((resolve) => (sub.wake = resolve));
        const item = sub.queue.shift() as Item;
        if (sub.behind && sub.queue.length <= this.#buffer / 2) {
          sub.behind = false;
          this.#subscribe(sub);
        }
        if (item.kind === "done") return;
        if (item.kind === "error") throw item.error;
        yield item.event;
      }
    } finally {
      this.#subs.delete(runId);
      if (!sub.ended) this.#send({ action: "unsubscribe", run_id: runId });
    }
  }

  /** Closes the connection; follows still waiting end with WsUnavailable. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#retryTimer);
    clearInterval(this.#pingTimer);
    const socket = this.#socket;
    this.#socket = undefined;
    try {
      socket?.close(1000);
    } catch {
      // already closed
    }
    for (const sub of this.#subs.values()) {
      sub.ended = true;
      sub.push({ kind: "error", error: new WsUnavailable("the live connection was closed") });
    }
  }

  #send(message: Record<string, unknown>): boolean {
    const socket = this.#socket;
    if (socket === undefined || socket.readyState !== 1) return false;
    try {
      socket.send(JSON.stringify(message));
      return true;
    } catch {
      return false; // the connection broke: it is reopened
    }
  }

  #subscribe(sub: Sub): void {
    if (sub.ended) return;
    sub.pending = this.#send({ action: "subscribe", run_id: sub.runId, after: sub.last });
  }

  #target(): string {
    if (this.#runId === undefined) return this.#url;
    const url = new URL(this.#url);
    url.searchParams.set("run_id", this.#runId);
    return url.href;
  }

  #endAll(error: unknown): void {
    this.#fatal = error;
    for (const sub of this.#subs.values()) {
      sub.ended = true;
      sub.push({ kind: "error", error });
    }
  }

  #backoff(): number {
    const ceiling = Math.min(500 * 2 ** Math.min(Math.max(this.#failures - 1, 0), 16), this.#maxBackoffMs);
    return Math.round(ceiling * (0.5 + randomInt(0, 1001) / 2000));
  }

  #retryLater(): void {
    if (this.#closed || this.#fatal !== undefined || this.#subs.size === 0) return;
    this.#failures += 1;
    clearTimeout(this.#retryTimer);
    this.#retryTimer = unref(setTimeout(() => void this.#open(), this.#backoff()));
  }

  async #open(): Promise<void> {
    if (this.#closed || this.#opening || this.#socket !== undefined || this.#fatal !== undefined) return;
    this.#opening = true;
    let socket: WebSocketLike;
    let node: boolean;
    try {
      const found = await webSocketConstructor(this.#given);
      node = found.node;
      const protocols = [SUBPROTOCOL, BEARER_PREFIX + this.#token];
      socket = node
        ? new found.ctor(this.#target(), protocols, {
            headers: { "user-agent": USER_AGENT },
            handshakeTimeout: this.#openTimeoutMs,
            perMessageDeflate: false,
            maxPayload: 4 << 20,
            createConnection: unrefConnection(this.#url.startsWith("wss:")),
          })
        : new found.ctor(this.#target(), protocols);
    } catch (err) {
      this.#opening = false;
      if (this.connections === 0) this.#endAll(new WsUnavailable(`opening the WebSocket failed: ${String(err)}`, { cause: err }));
      else this.#retryLater();
      return;
    }
    this.#opening = false;
    if (this.#closed) {
      socket.close();
      return;
    }
    this.#socket = socket;
    let opened = false;
    let refused = false;
    const openTimer = unref(
      setTimeout(() => {
        if (!opened) socket.close();
      }, this.#openTimeoutMs),
    );
    if (node) {
      // The `ws` package shows a refused upgrade's status; a refused credential is an error, not a retry.
      const emitter = socket as unknown as { on(event: string, fn: (...args: unknown[]) => void): void };
      emitter.on("unexpected-response", (req: unknown, res: unknown) => {
        refused = true;
        const response = res as { statusCode?: number; on(e: string, fn: (c?: unknown) => void): void; destroy(): void };
        const status = response.statusCode ?? 0;
        const chunks: Buffer[] = [];
        let size = 0;
        response.on("data", (c) => {
          size += (c as Buffer).length;
          if (size <= 65536) chunks.push(c as Buffer);
        });
        response.on("end", () => {
          let body: unknown;
          try {
            body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
          } catch {
            body = undefined;
          }
          (req as { destroy?(): void }).destroy?.();
          this.#refused(status, body);
        });
        response.on("error", () => {
          (req as { destroy?(): void }).destroy?.();
          this.#refused(status, undefined);
        });
      });
      emitter.on("error", () => {});
    }
    socket.onopen = () => {
      opened = true;
      clearTimeout(openTimer);
      this.connections += 1;
      this.#lastReceived = Date.now();
      for (const sub of this.#subs.values()) this.#subscribe(sub);
      clearInterval(this.#pingTimer);
      this.#pingTimer = unref(setInterval(() => this.#keepAlive(socket), Math.min(15_000, this.#stallMs / 3)));
    };
    socket.onmessage = (ev) => {
      this.#lastReceived = Date.now();
      if (typeof ev.data === "string") this.#frame(ev.data);
      else if (ev.data instanceof Buffer) this.#frame(ev.data.toString("utf8"));
    };
    socket.onerror = () => {};
    socket.onclose = () => {
      clearTimeout(openTimer);
      if (this.#socket === socket) {
        this.#socket = undefined;
        clearInterval(this.#pingTimer);
      }
      if (refused || this.#closed) return;
      if (!opened && this.connections === 0) {
        this.#endAll(new WsUnavailable("the WebSocket upgrade failed"));
        return;
      }
      this.#retryLater();
    };
  }

  #refused(status: number, body: unknown): void {
    if (this.#socket !== undefined) this.#socket = undefined;
    // 409 `run_terminal`: this run token's run has ended and its token connects no
    // more; asking again changes nothing (the caller reads the rest from the pages).
    if (status === 401 || status === 403 || status === 409) {
      this.#endAll(errorFromAnswer(status, body, undefined, undefined));
    } else if (this.connections === 0) {
      this.#endAll(new WsUnavailable(`the WebSocket upgrade was refused (${status})`));
    } else {
      this.#retryLater();
    }
  }

  #keepAlive(socket: WebSocketLike): void {
    if (Date.now() - this.#lastReceived > this.#stallMs) {
      socket.close(4000, "stalled"); // reopened on close
      return;
    }
    this.#send({ action: "ping" });
  }

  #frame(text: string): void {
    let frame: { run_id?: unknown; id?: unknown; event?: unknown; data?: unknown };
    try {
      frame = JSON.parse(text) as typeof frame;
    } catch {
      return;
    }
    if (typeof frame !== "object" || frame === null || typeof frame.event !== "string") return;
    const sub = typeof frame.run_id === "string" ? this.#subs.get(frame.run_id) : undefined;
    if (sub === undefined || sub.ended) return;
    const body = (typeof frame.data === "object" && frame.data !== null ? frame.data : {}) as Record<string, unknown>;
    if (typeof frame.id === "number") {
      const seq = frame.id;
      if (seq <= sub.last) {
        this.repeats += 1;
        return;
      }
      if (sub.behind) return; // untaken: the subscription after the reader caught up sends it
      const event = body as unknown as Event;
      if (seq > sub.last + 1) {
        this.skips += 1;
        if (sub.held.size < this.#maxHeld) sub.held.set(seq, { type: frame.event, data: event });
        else sub.held.clear(); // bounded: the new subscription sends them again
        if (!sub.pending) this.#subscribe(sub);
        return;
      }
      this.#take(sub, seq, frame.event, event);
      for (let next = sub.held.get(sub.last + 1); next !== undefined && !sub.behind; next = sub.held.get(sub.last + 1)) {
        sub.held.delete(sub.last + 1);
        this.#take(sub, sub.last + 1, next.type, next.data);
      }
      for (const s of sub.held.keys()) if (s <= sub.last) sub.held.delete(s);
      this.#failures = 0;
      return;
    }
    switch (frame.event) {
      case "subscribed":
        sub.pending = false;
        break;
      case "done": {
        const terminal = body["terminal_sequence"];
        if (typeof terminal === "number" && terminal > sub.last) {
          // The end came before every event did: fill the gap first.
          if (!sub.pending && !sub.behind) this.#subscribe(sub);
          return;
        }
        sub.ended = true;
        sub.push({ kind: "done" });
        break;
      }
      case "error": {
        const status = statusOf(body["code"]);
        if (transient(status)) {
          unref(setTimeout(() => this.#subs.get(sub.runId) === sub && this.#subscribe(sub), this.#backoff() + 500));
        } else {
          sub.ended = true;
          sub.push({ kind: "error", error: errorFromAnswer(status, body, undefined, undefined) });
        }
        break;
      }
      default:
        break; // pong, unsubscribed
    }
  }

  #take(sub: Sub, seq: number, type: string, data: Event): void {
    if (sub.behind) return;
    if (sub.queue.length >= this.#buffer) {
      // The reader fell behind: leave this one untaken; subscribe again once it caught up.
      sub.behind = true;
      sub.held.clear();
      return;
    }
    sub.last = seq;
    sub.push({ kind: "event", event: { runId: sub.runId, sequence: seq, type, data } });
  }
}
