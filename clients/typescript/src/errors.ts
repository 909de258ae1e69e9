// One error class per kind of failure, in the contract's words. A refusal carries the
// body's `code` and `request_id` (the server's id of the request: quote it when asking
// about a failure) and, where the server says one, its `state`.

/** What a refusal's JSON body said (any field may be missing on a non-JSON answer). */
export interface ErrorDetails {
  status?: number;
  code?: string;
  requestId?: string;
  state?: string;
  body?: unknown;
  retryAfterMs?: number;
  cause?: unknown;
}

/** The base of every error this package throws. */
export class TollgateError extends Error {
  /** The HTTP status, when the server answered. */
  readonly status: number | undefined;
  /** The body's `code` (`not_found`, `run_terminal`, `conflict`, …), when sent. */
  readonly code: string | undefined;
  /** The server's id of the request (`request_id`, else the `x-request-id` header). */
  readonly requestId: string | undefined;
  /** The body's `state`, when sent (`unknown`, `run_terminal`, `outcome_unknown`, …). */
  readonly state: string | undefined;
  /** The answer's body as sent (JSON, or `{error: text}`). */
  readonly body: unknown;
  /** Whether the same call may succeed later (429, 5xx, a transport failure). */
  get retryable(): boolean {
    return false;
  }

  constructor(message: string, details: ErrorDetails = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = new.target.name;
    this.status = details.status;
    this.code = details.code;
    this.requestId = details.requestId;
    this.state = details.state;
    this.body = details.body;
  }
}

/** 400 or 413: the request is malformed or too large; nothing was written. */
export class InvalidRequest extends TollgateError {}

/** 401: the token is missing, invalid or expired. */
export class Unauthorized extends TollgateError {}

/** 403: a valid token that may not do this (role, another run, another project). */
export class Forbidden extends TollgateError {}

/** 404: no such run, card, receipt or attempt for this caller (`state: "unknown"`). */
export class NotFound extends TollgateError {}

/**
 * 409: what stands refuses the request; `state` says what (`run_terminal`,
 * `run_exists`, `pending`, `not_executed`, `dispatched`, `completed`, …).
 */
export class Conflict extends TollgateError {
  /** The body's `approval_id` (the attempt that blocks), when given. */
  readonly approvalId: string | undefined;
  /** The body's `reason` (e.g. `budget_exhausted` for `not_executed`), when given. */
  readonly reason: string | undefined;

  constructor(message: string, details: ErrorDetails & { approvalId?: string; reason?: string } = {}) {
    super(message, details);
    this.approvalId = details.approvalId;
    this.reason = details.reason;
  }
}

/**
 * The outcome of a tool call is unknown: it was dispatched and then its transport
 * failed or timed out (settled `ambiguous`), or the server refuses a new start because
 * an earlier attempt's outcome is unknown (409 `{state: "outcome_unknown"}`). Such a
 * call is never retried; an operator reconciles it.
 */
export class OutcomeUnknown extends Conflict {}

/** @internal A 409 `run_terminal`: the run has ended. */
export function runTerminal(err: unknown): boolean {
  return err instanceof Conflict && err.state === "run_terminal";
}

/**
 * 429 or 5xx (after every retry allowed), or no answer at all ({@link TransportError}):
 * trying again later may succeed. `retryAfterMs` is the server's `Retry-After`.
 */
export class Unavailable extends TollgateError {
  readonly retryAfterMs: number | undefined;

  constructor(message: string, details: ErrorDetails = {}) {
    super(message, details);
    this.retryAfterMs = details.retryAfterMs;
  }

  override get retryable(): boolean {
    return true;
  }
}

/** The request could not be sent, or its answer not read (after every retry allowed). */
export class TransportError extends Unavailable {}

/** An answer this client does not expect (a status, or a body lacking promised fields). */
export class UnexpectedResponse extends TollgateError {}

/** A guarded call's function did not finish within `execute`'s `timeoutMs` (before dispatch: nothing was sent). */
export class ExecutionTimeout extends TollgateError {}

/**
 * Throw it from a guarded call's function when its transport failed without an answer,
 * to record `message` — your own words, free of secrets — with the settlement (`throw
 * new SendFailed("connection reset", { cause: err })`). Any other error is recorded by
 * its name only: its message (a URL with a key in it, …) never reaches the record or the
 * run's events. It is thrown on like any other (after dispatch: as the cause of
 * {@link OutcomeUnknown}).
 */
export class SendFailed extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "SendFailed";
  }
}

/** The run ended (its terminal event arrived) while a gate waited for its card. */
export class RunEnded extends TollgateError {}

/** The card neither resolved nor expired well past its deadline. */
export class WaitTimedOut extends TollgateError {}

function text(body: unknown, key: string): string | undefined {
  if (body !== null && typeof body === "object") {
    const v = (body as Record<string, unknown>)[key];
    if (typeof v === "string") return v;
  }
  return undefined;
}

/** A refusal answer as the error it means. */
export function errorFromAnswer(
  status: number,
  body: unknown,
  headerRequestId: string | undefined,
  retryAfterMs: number | undefined,
): TollgateError {
  const details = {
    status,
    body,
    code: text(body, "code"),
    requestId: text(body, "request_id") ?? headerRequestId,
    state: text(body, "state"),
    retryAfterMs,
  };
  const message = `${text(body, "error") ?? `HTTP ${status}`} (${status}${details.code ? ` ${details.code}` : ""})`;
  if (status === 400 || status === 413) return new InvalidRequest(message, details);
  if (status === 401) return new Unauthorized(message, details);
  if (status === 403) return new Forbidden(message, details);
  if (status === 404) return new NotFound(message, details);
  if (status === 409) return conflict(message, { ...details, approvalId: text(body, "approval_id"), reason: text(body, "reason") });
  if (status === 429 || status >= 500) return new Unavailable(message, details);
  return new UnexpectedResponse(message, details);
}

/** A 409 (or a 200 naming a state the caller cannot go on from) by its `state`. */
export function conflict(
  message: string,
  details: ErrorDetails & { approvalId?: string; reason?: string },
): Conflict {
  return details.state === "outcome_unknown" ? new OutcomeUnknown(message, details) : new Conflict(message, details);
}
