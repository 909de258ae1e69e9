// The public types of the wire, derived from the OpenAPI document (src/openapi.d.ts,
// generated from openapi.json by openapi-typescript; do not edit that file by hand).
import type { components, operations } from "./openapi.js";

type Schemas = components["schemas"];

/** The error body every refusal carries (`{error, code, request_id, state?, …}`). */
export type ErrorBody = Schemas["ErrorBody"];
/** The server's error codes (`ErrorBody.code`). */
export type ErrorCode = ErrorBody["code"];
/** One event as the server stores and serves it: the envelope and its payload. */
export type Event = Schemas["Event"];
/** A page of `GET /api/runs/{id}/events`. */
export type EventPage = Schemas["EventPage"];
/** The body of `POST /api/runs`. */
export type CreateRunBody = Schemas["CreateRun"];
/** What `POST /api/runs` and `GET /api/receipts/{delivery_id}` answer. */
export type RunReceipt = Schemas["RunReceipt"];
/** What an append answers. */
export type Appended = Schemas["Appended"];
/** What `complete` / `fail` / `cancel` answer. */
export type RunEnded = Schemas["RunEnded"];
/** The body of `POST /api/runs/{id}/approval-requests`. */
export type ArmApprovalBody = Schemas["ArmApproval"];
/** What arming a card answers. */
export type Armed = Schemas["Armed"];
/** An approval card (`GET /api/runs/{id}/approval-requests/{request_id}`). */
export type Card = Schemas["Card"];
/** The body of `POST …/tool-calls/{tool_call_id}/start`. */
export type StartBody = Schemas["Start"];
/** The body of `POST …/tool-calls/{tool_call_id}/dispatch`. */
export type DispatchBody = Schemas["Dispatch"];
/** The body of `POST …/tool-calls/{tool_call_id}/settle`. */
export type SettleBody = Schemas["Settle"];
/** What `start`, `dispatch`, `settle` and `reconcile` answer when accepted: where the attempt stands. */
export type ExecutionAnswer = Schemas["ExecutionAnswer"];
/** The data of the live stream's last frame (`event: done`). */
export type StreamEnd = Schemas["StreamEnd"];
/** A durable `mutation_outcome/v1` record. */
export type MutationRecord = Schemas["MutationRecord"];
/** A page of `GET /api/runs/{id}/mutations`. */
export type MutationList = Schemas["MutationList"];
/** One run of `GET /api/runs`. */
export type RunSummary = Schemas["RunSummary"];
/** A page of `GET /api/runs`: one project's runs, newest first. */
export type RunList = Schemas["RunList"];

/** An event to append: a JSON object with a `type`; `event_id` is filled in when absent. */
export type EventInput = NonNullable<
  operations["appendEvents"]["requestBody"]
>["content"]["application/json"]["events"][number] & { type: string; event_id?: string };

/** A run's budget for approved execution: tool name → most starts, and a ceiling. */
export interface Budget {
  tools: Record<string, number>;
  call_ceiling?: number;
}

/** What `Client.createRun` takes: the create body, with a typed budget. */
export type CreateRunOptions = Omit<CreateRunBody, "budget" | "kind" | "execution_mode" | "subtask_id"> & {
  budget?: Budget;
  kind?: "single" | "coordinator" | "child";
  execution_mode?: "inline" | "pod";
  subtask_id?: number | string;
};

/** `scope` of an approval; anything else the server reads as `once`. */
export type Scope = "once" | "run" | "tool" | "always";
/** How a card ended. */
export type DecisionState = "approved" | "denied" | "expired";
/** `state` of a durable mutation record. */
export type MutationState = "intent" | "dispatched" | "completed" | "outcome_unknown" | "not_executed";
/** The evidence a settlement carries. */
export type Evidence = "confirmed" | "ambiguous" | "not_sent";
