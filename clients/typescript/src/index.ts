// The TypeScript client of the payments API: one Idempotency-Key per
// operation, kept across retries; retries of what is safe only, with full
// jitter, Retry-After and a budget; unknown outcomes resolved by the
// key-status endpoint. docs/client.md sets it beside the Go client.
export { Client, replayedHeader, type CallOptions, type ClientOptions, type KeyedCallOptions, type Result } from "./client.js";
export { Budget, defaultBudgetCapacity, defaultBudgetRefill, defaultRetryCost } from "./budget.js";
export { ApiError, hasCode, KeyUnknownError, NotRecordedError, OutcomeUnknownError, type StopReason } from "./errors.js";
export { newKey } from "./key.js";
export type { Attempt, Policy } from "./retry.js";
export * from "./types.js";
export type { components, operations, paths } from "./api.gen.js";
