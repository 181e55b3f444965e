import type { Budget } from "./budget.js";
import { ApiError, OutcomeUnknownError, type StopReason } from "./errors.js";
import type { Problem } from "./types.js";

/**
 * Policy says how a Client retries; a field left out takes its default,
 * the Go client's `Policy` defaults.
 */
export interface Policy {
  /** Bounds the attempts of one operation, the first included (default 5). */
  maxAttempts?: number;
  /**
   * Shape the full-jitter exponential backoff: the wait before retry n is
   * uniform in [0, min(maxDelayMs, baseDelayMs·2ⁿ⁻¹)) (defaults 100 ms and
   * 5 s).
   */
  baseDelayMs?: number;
  maxDelayMs?: number;
  /**
   * The longest Retry-After the client waits for; a server asking for more
   * ends the operation (default 60 s). The operation's timeout caps it
   * further.
   */
  maxRetryAfterMs?: number;
  /** Called after every attempt, before any wait: for logging and metrics. */
  onAttempt?: (attempt: Attempt) => void;
}

/** One finished attempt of an operation. */
export interface Attempt {
  /** Route template, such as "POST /v1/orders". */
  endpoint: string;
  /** The operation's Idempotency-Key; "" for reads. */
  key: string;
  /** 1 for the first attempt. */
  n: number;
  /** 0 when no answer arrived. */
  status: number;
  /** The transport error or the retried answer, if any. */
  error?: unknown;
  /** Whether another attempt follows, and how long the client waits before it. */
  retry: boolean;
  delayMs: number;
}

type Settled = Required<Omit<Policy, "onAttempt">> & { onAttempt: Policy["onAttempt"] | undefined };

export function withDefaults(p: Policy = {}): Settled {
  const positive = (v: number | undefined, d: number) => (v !== undefined && v > 0 ? v : d);
  return {
    maxAttempts: positive(p.maxAttempts, 5),
    baseDelayMs: positive(p.baseDelayMs, 100),
    maxDelayMs: positive(p.maxDelayMs, 5_000),
    maxRetryAfterMs: positive(p.maxRetryAfterMs, 60_000),
    onAttempt: p.onAttempt,
  };
}

/**
 * backoff is the full-jitter wait before retry n (n ≥ 1), in milliseconds:
 * uniform in [0, min(maxDelayMs, baseDelayMs·2ⁿ⁻¹)). Full jitter spreads
 * the retries of many clients that failed together over the whole window,
 * instead of sending them back in synchronized waves.
 */
export function backoff(p: Settled, n: number): number {
  const ceiling = Math.min(p.maxDelayMs, p.baseDelayMs * 2 ** Math.min(n - 1, 52));
  return Math.random() * ceiling;
}

const codeKeyInUse = "idempotency_key_in_use";
const codeConflictingWrite = "conflicting_write_in_progress";

/**
 * retryable is the retry table, the Go client's: which answers are safe
 * and useful to send again with the same key. Everything else is the
 * server's final answer for this key (and a recorded one is replayed to
 * any retry anyway).
 */
export function retryable(status: number, code: string): boolean {
  switch (status) {
    case 429: // rate limited before the claim: nothing ran
    case 502:
    case 503:
    case 504:
      return true;
    case 409:
      // Only "another attempt holds this key" and "another request is
      // writing what this one must write": in both, nothing was recorded
      // for this key, and the retry runs (it is no replay). The natural-key
      // conflict (order_reference_exists) and idempotency_result_expired
      // are final.
      return code === codeKeyInUse || code === codeConflictingWrite;
  }
  return false;
}

/** parseRetryAfter reads Retry-After as delay-seconds or an HTTP-date, in milliseconds. */
export function parseRetryAfter(v: string | null, now: number): number | undefined {
  v = v?.trim() ?? "";
  if (/^[0-9]+$/.test(v)) {
    return Math.min(Number(v), 2 ** 30) * 1000;
  }
  if (/^[A-Za-z]{3}, /.test(v)) {
    const t = Date.parse(v);
    if (!Number.isNaN(t)) {
      return Math.max(t - now, 0);
    }
  }
  return undefined;
}

/** One attempt's complete answer. */
export interface Answer {
  status: number;
  headers: Headers;
  body: string;
  /** The problem's code, when the body is a problem document. */
  code: string;
}

const problemJSON = "application/problem+json";

/**
 * readAnswer reads the whole response: an answer whose body was cut off is
 * a transport error, as the status alone says nothing certain.
 */
async function readAnswer(res: Response): Promise<Answer> {
  const body = await res.text();
  const a: Answer = { status: res.status, headers: res.headers, body, code: "" };
  if (res.headers.get("Content-Type")?.startsWith(problemJSON)) {
    try {
      const p: unknown = JSON.parse(body);
      if (typeof p === "object" && p !== null && "code" in p && typeof p.code === "string") {
        a.code = p.code;
      }
    } catch {
      // Not JSON: no code.
    }
  }
  return a;
}

/**
 * decodeProblem reads a problem document; anything else (a proxy's HTML
 * error page) becomes a problem with the status only.
 */
export function decodeProblem(a: Answer): Problem {
  if (a.headers.get("Content-Type")?.startsWith(problemJSON)) {
    try {
      const p = JSON.parse(a.body) as Problem;
      if (typeof p === "object" && p !== null && typeof p.status === "number" && p.status !== 0) {
        return p;
      }
    } catch {
      // Fall through.
    }
  }
  return { type: "about:blank", title: `HTTP ${a.status}`, status: a.status, code: "" } as Problem;
}

/** What an operation's loop needs from its client. */
export interface Retrier {
  policy: Settled;
  budget: Budget;
  attemptTimeoutMs: number;
}

/** One operation: send builds and sends a fresh request, with the same key, on every call. */
export interface Operation {
  endpoint: string;
  key: string;
  send: (signal: AbortSignal) => Promise<Response>;
  /** The caller's signal: it ends the operation. */
  signal: AbortSignal | undefined;
  /** When the operation must end (milliseconds since the epoch), if ever. */
  deadline: number | undefined;
}

/**
 * run sends one operation until it gets a final answer or has to stop, as
 * the Go client's run does: a transport error or a retryable answer is
 * retried after the backoff (at least the answer's Retry-After), while the
 * attempts, the deadline and the budget allow; then the outcome is unknown.
 */
export async function run(r: Retrier, op: Operation): Promise<{ answer: Answer; attempts: number }> {
  const p = r.policy;
  const unknown = (n: number, sent: number, reason: StopReason, cause: unknown) =>
    new OutcomeUnknownError({ key: op.key, endpoint: op.endpoint, attempts: n, lastSent: sent, reason, cause });
  for (let n = 1; ; n++) {
    let a: Answer | undefined;
    let err: unknown;
    try {
      a = await readAnswer(await op.send(attemptSignal(r, op)));
    } catch (e) {
      err = e ?? new Error("the request failed");
    }
    // When the attempt ended: the server had the request by then if it
    // ever will (fetch says nothing of when it was written, so this is the
    // latest the request can have been sent; resolve counts the commit
    // window from it, and waits no less than it must).
    const sent = Date.now();
    if (err !== undefined && ended(op)) {
      // The caller gave up (or the timeout passed) while the request was
      // in flight: it may have been executed.
      throw unknown(n, sent, "aborted", err);
    }
    if (a !== undefined && !retryable(a.status, a.code)) {
      r.budget.answered();
      report(p, { endpoint: op.endpoint, key: op.key, n, status: a.status, retry: false, delayMs: 0 });
      return { answer: a, attempts: n };
    }

    // A transport error or a retryable status: the outcome of this attempt
    // is not known (or nothing ran); try again if allowed.
    const last = a === undefined ? err : new ApiError({
      status: a.status, problem: decodeProblem(a), key: op.key, replayed: false, attempts: n, headers: a.headers,
    });
    const status = a?.status ?? 0;
    const stop = (reason: StopReason) => {
      report(p, { endpoint: op.endpoint, key: op.key, n, status, error: last, retry: false, delayMs: 0 });
      return unknown(n, sent, reason, last);
    };
    let delay = backoff(p, n);
    if (a !== undefined) {
      const ra = parseRetryAfter(a.headers.get("Retry-After"), Date.now());
      if (ra !== undefined) {
        if (ra > p.maxRetryAfterMs) {
          throw stop("retry_after");
        }
        // Retry-After is the server's minimum; jitter only above it.
        delay = Math.max(delay, ra);
      }
    }
    if (n >= p.maxAttempts) {
      throw stop("attempts");
    }
    if (!fitsDeadline(op.deadline, delay)) {
      // Waiting would end past the deadline: stop now rather than sleep
      // for nothing or retry before the server asked.
      throw stop("deadline");
    }
    if (!r.budget.take()) {
      throw stop("budget");
    }
    report(p, { endpoint: op.endpoint, key: op.key, n, status, error: last, retry: true, delayMs: delay });
    if (!(await sleep(delay, op.signal))) {
      throw unknown(n, sent, "aborted", last);
    }
  }
}

/**
 * attemptSignal ends one attempt: after the client's attempt timeout (so a
 * hung connection still leaves time to retry), when the caller's signal
 * aborts, or at the operation's deadline.
 */
function attemptSignal(r: Retrier, op: Operation): AbortSignal {
  const signals = [AbortSignal.timeout(r.attemptTimeoutMs)];
  if (op.signal !== undefined) {
    signals.push(op.signal);
  }
  if (op.deadline !== undefined) {
    signals.push(AbortSignal.timeout(Math.max(0, op.deadline - Date.now())));
  }
  return AbortSignal.any(signals);
}

/** ended reports whether the caller's signal aborted or the deadline passed. */
function ended(op: { signal: AbortSignal | undefined; deadline: number | undefined }): boolean {
  return op.signal?.aborted === true || (op.deadline !== undefined && Date.now() >= op.deadline);
}

/** fitsDeadline reports whether an attempt starting after delay still starts before the deadline. */
export function fitsDeadline(deadline: number | undefined, delayMs: number): boolean {
  return deadline === undefined || Date.now() + delayMs < deadline;
}

/** sleep waits ms; false when signal aborted first. */
export function sleep(ms: number, signal: AbortSignal | undefined): Promise<boolean> {
  if (signal?.aborted) {
    return Promise.resolve(false);
  }
  return new Promise((resolve) => {
    const done = (ok: boolean) => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", aborted);
      resolve(ok);
    };
    const aborted = () => done(false);
    const timer = setTimeout(() => done(true), ms);
    signal?.addEventListener("abort", aborted, { once: true });
  });
}

function report(p: Settled, a: Attempt): void {
  p.onAttempt?.(a);
}
