export { Client, Run, MAX_BATCH_EVENTS } from "./client.js";
export { Operator, type RunQuery } from "./operator.js";
export {
  Decision,
  APPROVAL_RESOLVED,
  DEFAULT_GATE_TIMEOUT_MS,
  MAX_GATE_TIMEOUT_MS,
  type GateOptions,
  type ReconnectInfo,
  type ReconnectReason,
} from "./gate.js";
export { MAX_FACTS_BYTES, type ExecuteOptions, type Execution, type Executed } from "./execution.js";
export {
  TollgateError,
  InvalidRequest,
  Unauthorized,
  Forbidden,
  NotFound,
  Conflict,
  OutcomeUnknown,
  Unavailable,
  TransportError,
  UnexpectedResponse,
  ExecutionTimeout,
  SendFailed,
  RunEnded,
  WaitTimedOut,
  type ErrorDetails,
} from "./errors.js";
export type { ClientOptions, RetryOptions } from "./http.js";
export {
  LiveConnection,
  WsUnavailable,
  MAX_SUBSCRIPTIONS,
  resolveWebSocketUrl,
  type LiveEvent,
  type LiveOptions,
  type WebSocketConstructor,
  type WebSocketLike,
} from "./live.js";
export { argumentsHash, canonicalJson } from "./hash.js";
export type * from "./types.js";
