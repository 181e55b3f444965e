import type { Endpoint, Problem } from "./types.js";

/**
 * ApiError is an answer that is not a success: the server's problem
 * document (RFC 9457), with its status. For a create, a recorded failure
 * (a 400 validation_failed, a 409 order_reference_exists, a 402
 * card_declined, ...) is final for its key: retrying replays it, with
 * `replayed` set. The Go client's `*Error`.
 */
export class ApiError extends Error {
  override name = "ApiError";
  readonly status: number;
  readonly problem: Problem;
  /** The operation's Idempotency-Key; "" for reads. */
  readonly key: string;
  /** The server replayed a recorded answer (Idempotent-Replayed: true). */
  readonly replayed: boolean;
  readonly attempts: number;
  readonly headers: Headers;

  constructor(init: { status: number; problem: Problem; key: string; replayed: boolean; attempts: number; headers: Headers }) {
    super(`payments API: ${init.status} ${init.problem.code}: ${init.problem.title}`);
    this.status = init.status;
    this.problem = init.problem;
    this.key = init.key;
    this.replayed = init.replayed;
    this.attempts = init.attempts;
    this.headers = init.headers;
  }

  /** The problem's stable machine-readable code, such as "order_reference_exists". */
  get code(): string {
    return this.problem.code;
  }
}

/** hasCode reports whether err is an ApiError with the given code. */
export function hasCode(err: unknown, code: string): boolean {
  return err instanceof ApiError && err.code === code;
}

/** Why the client stopped retrying without a final answer. */
export type StopReason =
  | "attempts" // Policy.maxAttempts were sent
  | "budget" // the client's retry budget is exhausted
  | "deadline" // the next attempt could not start before the operation's timeout
  | "retry_after" // the server's Retry-After exceeds Policy.maxRetryAfterMs
  | "aborted"; // the caller's signal or the timeout ended the operation

/**
 * OutcomeUnknownError says that the client stopped retrying without a
 * final answer: an attempt may have been executed (a connection cut after
 * the server committed looks the same as one cut before). Nothing is lost:
 * the operation is resolved with the same key, either by Client.resolve
 * (what the server recorded under it) or by sending the same request again
 * with `key`, later, which replays the result if there is one and runs it
 * if there is none. The Go client's `*OutcomeUnknownError`.
 */
export class OutcomeUnknownError extends Error {
  override name = "OutcomeUnknownError";
  /** The Idempotency-Key every attempt carried. */
  readonly key: string;
  /** The route template the key is scoped to, such as "POST /v1/orders". */
  readonly endpoint: string;
  readonly attempts: number;
  /**
   * When the last attempt ended (milliseconds since the epoch): the server
   * had its request by then, and may still be running it. resolve takes no
   * record of the key for final only once the server's commit window has
   * passed since then. Keep it with the key if another process resumes the
   * operation.
   */
  readonly lastSent: number;
  readonly reason: StopReason;

  constructor(init: { key: string; endpoint: string; attempts: number; lastSent: number; reason: StopReason; cause: unknown }) {
    super(
      `payments API: outcome unknown after ${init.attempts} attempts of ${init.endpoint} with Idempotency-Key "${init.key}" (${init.reason}): ${describe(init.cause)}`,
      { cause: init.cause },
    );
    this.key = init.key;
    this.endpoint = init.endpoint;
    this.attempts = init.attempts;
    this.lastSent = init.lastSent;
    this.reason = init.reason;
  }
}

/**
 * NotRecordedError says that the server has no record of a key, but a
 * request under it may still be running: the server records a key when its
 * request commits, and a request can commit until `windowMs` after it was
 * sent. It is not "never ran". Either ask again once `finalAt` has passed
 * (resolve does, when its signal allows), or send the same request again
 * with the same key, which is safe: at most one attempt commits, and the
 * others get its answer. The Go client's `*NotRecordedError`.
 */
export class NotRecordedError extends Error {
  override name = "NotRecordedError";
  readonly key: string;
  readonly endpoint: Endpoint;
  /** The server's commit window (the problem's commit_window_seconds). */
  readonly windowMs: number;
  /**
   * When no record becomes final (milliseconds since the epoch): windowMs
   * after the key's last request. Undefined from keyStatus, which does not
   * know when that was.
   */
  readonly finalAt: number | undefined;

  constructor(init: { key: string; endpoint: Endpoint; windowMs: number; finalAt?: number }) {
    const when =
      init.finalAt === undefined
        ? `once ${init.windowMs} ms have passed since the key's last request was sent`
        : `at ${new Date(init.finalAt).toISOString()}`;
    super(
      `payments API: no record of Idempotency-Key "${init.key}" on ${init.endpoint} yet: a request under it may still be running, and no record is final ${when}; ask again then, or send the same request again with the same key (at most one attempt commits)`,
    );
    this.key = init.key;
    this.endpoint = init.endpoint;
    this.windowMs = init.windowMs;
    this.finalAt = init.finalAt;
  }
}

/**
 * KeyUnknownError is what resolve throws when no attempt of the operation
 * committed and none can any more: the server had no record of the key
 * when asked once its commit window had passed since the last attempt (or
 * the record is past its retention). Sending the request again with the
 * same key runs it. The Go client's `ErrKeyUnknown`.
 */
export class KeyUnknownError extends Error {
  override name = "KeyUnknownError";
  readonly key: string;
  readonly endpoint: Endpoint;

  constructor(key: string, endpoint: Endpoint) {
    super(`payments API: the server has no record of Idempotency-Key "${key}" on ${endpoint}, and no attempt can commit any more`);
    this.key = key;
    this.endpoint = endpoint;
  }
}

function describe(cause: unknown): string {
  if (cause instanceof Error) {
    return cause.cause instanceof Error ? `${cause.message} (${cause.cause.message})` : cause.message;
  }
  return String(cause);
}
