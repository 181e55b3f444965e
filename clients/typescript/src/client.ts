import { Budget } from "./budget.js";
import { ApiError, KeyUnknownError, NotRecordedError, OutcomeUnknownError } from "./errors.js";
import { newKey } from "./key.js";
import { decodeProblem, fitsDeadline, run, sleep, withDefaults, type Policy, type Retrier } from "./retry.js";
import {
  endpointCreateOrder, endpointCreatePayment, endpointCreateRefund,
  type CreateOrderRequest, type CreatePaymentRequest, type CreateRefundRequest, type Customer, type Endpoint,
  type IdempotencyKeyStatus, type ListOrdersParams, type ListPaymentsParams, type Order, type OrderList,
  type Payment, type PaymentList, type PutCustomerRequest, type Refund, type UpdateOrderRequest,
} from "./types.js";

/** The header that marks a replayed answer. */
export const replayedHeader = "Idempotent-Replayed";

/** How a Client sends. */
export interface ClientOptions {
  policy?: Policy;
  /** The retry budget (default: new Budget()). Clients given the same Budget share it. */
  budget?: Budget;
  /**
   * Bounds each attempt (default 30 s). Keep it shorter than an
   * operation's timeoutMs, so a hung connection still leaves time to retry.
   */
  attemptTimeoutMs?: number;
  /** Sends the requests (default: the platform's fetch). */
  fetch?: (input: string, init: RequestInit) => Promise<Response>;
  /**
   * Asks the server, on every create (order, payment, refund), to wait up
   * to this long for the first attempt of its key when that attempt is
   * still in flight, and to answer with its result (Prefer: wait=N, RFC
   * 7240; the server caps N at its maximum, which GET /v1/idempotency
   * states). Without it such a duplicate is answered 409
   * idempotency_key_in_use at once and retried after Retry-After; with it,
   * one attempt usually gets the replay. Sent in whole seconds, rounded
   * down; under a second sends nothing. Keep attemptTimeoutMs above it.
   * The Go client's WithPreferWait.
   */
  preferWaitMs?: number;
}

/** What every call takes. */
export interface CallOptions {
  /** Ends the operation when it aborts: in flight, that is an unknown outcome. */
  signal?: AbortSignal;
  /**
   * The operation's total time, retries and waits included: the client
   * never sleeps past it, and stops at once when the next attempt could
   * not start before it (the Go client's context deadline).
   */
  timeoutMs?: number;
}

/** What a create takes. */
export interface KeyedCallOptions extends CallOptions {
  /**
   * The operation's Idempotency-Key (default: a fresh newKey(), reported in
   * the result and the errors). Pass a key you persisted beforehand to be
   * able to resume after a crash.
   */
  key?: string;
}

/** A successful answer. */
export interface Result<T> {
  value: T;
  /** The Idempotency-Key the operation used ("" for reads). */
  key: string;
  /**
   * The server answered from its record of an earlier attempt
   * (Idempotent-Replayed: true): the operation had been executed before,
   * by this call's earlier attempt or by another call with the same key.
   */
  replayed: boolean;
  status: number;
  headers: Headers;
  attempts: number;
}

/**
 * defaultCommitWindowMs is the commit window taken when the server's 404
 * does not state one.
 */
const defaultCommitWindowMs = 60_000;

const keyedEndpoints: readonly string[] = [endpointCreateOrder, endpointCreatePayment, endpointCreateRefund];

/**
 * Client calls the payments API with the Go client's retry rules (see
 * docs/client.md, "The TypeScript client"). Its retry budget is shared by
 * all its calls.
 */
export class Client {
  readonly #base: string;
  readonly #auth: string;
  readonly #retrier: Retrier;
  readonly #fetch: (input: string, init: RequestInit) => Promise<Response>;
  /** The Prefer header of creates; empty: none. */
  readonly #prefer: Record<string, string>;

  /** A client for the API at baseUrl (such as "http://localhost:8080") that authenticates with apiKey. */
  constructor(baseUrl: string, apiKey: string, options: ClientOptions = {}) {
    this.#base = new URL(baseUrl).href.replace(/\/+$/, "");
    this.#auth = `Bearer ${apiKey}`;
    this.#retrier = {
      policy: withDefaults(options.policy),
      budget: options.budget ?? new Budget(),
      attemptTimeoutMs: options.attemptTimeoutMs !== undefined && options.attemptTimeoutMs > 0 ? options.attemptTimeoutMs : 30_000,
    };
    // Called unbound: a browser's fetch refuses any `this` but the window.
    this.#fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    const wait = Math.floor((options.preferWaitMs ?? 0) / 1000);
    this.#prefer = wait > 0 ? { Prefer: `wait=${wait}` } : {};
  }

  /** The client's retry budget. */
  get budget(): Budget {
    return this.#retrier.budget;
  }

  /** Creates an order under options.key, or under a fresh key. */
  createOrder(req: CreateOrderRequest, options: KeyedCallOptions = {}): Promise<Result<Order>> {
    return this.#keyed(endpointCreateOrder, "/v1/orders", req, options);
  }

  /** Pays an order under options.key, or under a fresh key. */
  createPayment(req: CreatePaymentRequest, options: KeyedCallOptions = {}): Promise<Result<Payment>> {
    return this.#keyed(endpointCreatePayment, "/v1/payments", req, options);
  }

  /** Refunds part of a payment under options.key, or under a fresh key. */
  createRefund(paymentId: string, req: CreateRefundRequest, options: KeyedCallOptions = {}): Promise<Result<Refund>> {
    return this.#keyed(endpointCreateRefund, `/v1/payments/${seg(paymentId)}/refunds`, req, options);
  }

  /** Reads an order. Reads are retried like writes; they need no key. */
  getOrder(id: string, options: CallOptions = {}): Promise<Result<Order>> {
    return this.#do("GET /v1/orders/{id}", "", "GET", `/v1/orders/${seg(id)}`, undefined, {}, options);
  }

  /** Reads one page of orders. */
  listOrders(params: ListOrdersParams = {}, options: CallOptions = {}): Promise<Result<OrderList>> {
    return this.#do("GET /v1/orders", "", "GET", `/v1/orders${query(params)}`, undefined, {}, options);
  }

  /** Reads a payment. */
  getPayment(id: string, options: CallOptions = {}): Promise<Result<Payment>> {
    return this.#do("GET /v1/payments/{id}", "", "GET", `/v1/payments/${seg(id)}`, undefined, {}, options);
  }

  /** Reads one page of payments, newest first (params.order_id: only that order's). */
  listPayments(params: ListPaymentsParams = {}, options: CallOptions = {}): Promise<Result<PaymentList>> {
    return this.#do("GET /v1/payments", "", "GET", `/v1/payments${query(params)}`, undefined, {}, options);
  }

  /** Reads one refund of a payment (where a refund's Location points). */
  getRefund(paymentId: string, refundId: string, options: CallOptions = {}): Promise<Result<Refund>> {
    return this.#do("GET /v1/payments/{id}/refunds/{refund_id}", "", "GET",
      `/v1/payments/${seg(paymentId)}/refunds/${seg(refundId)}`, undefined, {}, options);
  }

  /**
   * Creates or replaces the customer id, chosen by the caller (the
   * client-supplied-id alternative to keys: no Idempotency-Key). Mint the
   * id once, store it, and send it on every retry: a retry of a PUT that
   * went through answers 200 instead of 201 with the same customer.
   */
  putCustomer(id: string, req: PutCustomerRequest, options: CallOptions = {}): Promise<Result<Customer>> {
    return this.#do("PUT /v1/customers/{id}", "", "PUT", `/v1/customers/${seg(id)}`, req, {}, options);
  }

  /** Reads a customer. */
  getCustomer(id: string, options: CallOptions = {}): Promise<Result<Customer>> {
    return this.#do("GET /v1/customers/{id}", "", "GET", `/v1/customers/${seg(id)}`, undefined, {}, options);
  }

  /**
   * Changes an order's description or metadata if it is still the version
   * etag names (getOrder's result.headers.get("ETag")). A retry after a
   * lost answer may get a 412 precondition_failed for a change that did
   * apply: on a 412, read the order again and compare before deciding.
   */
  updateOrder(id: string, etag: string, req: UpdateOrderRequest, options: CallOptions = {}): Promise<Result<Order>> {
    return this.#do("PATCH /v1/orders/{id}", "", "PATCH", `/v1/orders/${seg(id)}`, req, { "If-Match": etag }, options);
  }

  /**
   * Asks what became of key on endpoint: in progress or completed, the
   * recorded status, the resource it created, and until when its result is
   * replayed. Pass key as the operation sent it.
   *
   * No record of the key is a NotRecordedError, never a KeyUnknownError: a
   * request under the key may still be running, and keyStatus does not
   * know when the key's last request was sent. resolve does, and waits the
   * window out.
   */
  async keyStatus(key: string, endpoint: Endpoint, options: CallOptions = {}): Promise<IdempotencyKeyStatus> {
    try {
      const res = await this.#do<IdempotencyKeyStatus>("GET /v1/idempotency-keys/{key}", "", "GET",
        `/v1/idempotency-keys/${seg(pathKey(key))}?endpoint=${encodeURIComponent(endpoint)}`, undefined, {}, options);
      return res.value;
    } catch (e) {
      if (e instanceof ApiError && e.code === "not_found") {
        const s = e.problem.commit_window_seconds;
        throw new NotRecordedError({ key, endpoint, windowMs: s !== undefined && s > 0 ? s * 1000 : defaultCommitWindowMs });
      }
      throw e;
    }
  }

  /**
   * Looks up what became of the operation behind an OutcomeUnknownError:
   * state "completed" with a response_status and resource when an attempt
   * went through, "in_progress" while a payment's or refund's attempt still
   * runs, or a KeyUnknownError when none committed and none can any more.
   *
   * A request still running has no record on the server until it commits,
   * which it can do until the server's commit window (its request timeout
   * plus a lock wait) has passed since it was sent. So when the server has
   * no record and that window has not passed since unknown.lastSent,
   * resolve waits until it has and asks again. When the signal or
   * timeoutMs ends first, it throws a NotRecordedError saying when to ask
   * again; sending the same request again with the same key is the other
   * way on, and safe. Give it a timeoutMs to bound the wait.
   */
  async resolve(unknown: OutcomeUnknownError, options: CallOptions = {}): Promise<IdempotencyKeyStatus> {
    if (!(unknown instanceof OutcomeUnknownError) || unknown.key === "" || !keyedEndpoints.includes(unknown.endpoint)) {
      throw new TypeError("payments API: resolve needs the OutcomeUnknownError of a keyed operation");
    }
    const endpoint = unknown.endpoint as Endpoint;
    // Not known: an attempt may have been sent just now.
    const sent = unknown.lastSent > 0 ? unknown.lastSent : Date.now();
    const deadline = options.timeoutMs === undefined ? undefined : Date.now() + options.timeoutMs;
    for (;;) {
      const asked = Date.now();
      try {
        const remaining = deadline === undefined ? {} : { timeoutMs: Math.max(0, deadline - asked) };
        return await this.keyStatus(unknown.key, endpoint, { ...options, ...remaining });
      } catch (e) {
        if (!(e instanceof NotRecordedError)) {
          throw e;
        }
        const finalAt = sent + e.windowMs;
        if (asked >= finalAt) {
          // Asked after the window: every attempt sent before it has
          // committed by then or never will.
          throw new KeyUnknownError(unknown.key, endpoint);
        }
        const notYet = new NotRecordedError({ key: unknown.key, endpoint, windowMs: e.windowMs, finalAt });
        const wait = finalAt - Date.now();
        if (!fitsDeadline(deadline, wait) || !(await sleep(wait, options.signal))) {
          throw notYet;
        }
      }
    }
  }

  #keyed<T>(endpoint: Endpoint, path: string, body: unknown, options: KeyedCallOptions): Promise<Result<T>> {
    // One key per operation, minted here once and sent on every attempt:
    // a key per attempt would make each retry a new request, and a retry
    // after a lost answer would run the operation twice.
    const key = options.key !== undefined && options.key !== "" ? options.key : newKey();
    return this.#do(endpoint, key, "POST", path, body, this.#prefer, options);
  }

  /**
   * do runs one operation and decodes its final answer: a 2xx into a T,
   * anything else into an ApiError.
   */
  async #do<T>(endpoint: string, key: string, method: string, path: string, body: unknown,
    extra: Record<string, string>, options: CallOptions): Promise<Result<T>> {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const headers: Record<string, string> = { ...extra, Authorization: this.#auth };
    if (payload !== undefined) {
      headers["Content-Type"] = "application/json";
    }
    if (key !== "") {
      headers["Idempotency-Key"] = key;
    }
    const url = this.#base + path;
    const { answer: a, attempts } = await run(this.#retrier, {
      endpoint, key, signal: options.signal,
      deadline: options.timeoutMs === undefined ? undefined : Date.now() + options.timeoutMs,
      send: (signal) => this.#fetch(url, payload === undefined ? { method, headers, signal } : { method, headers, body: payload, signal }),
    });
    const replayed = a.headers.get(replayedHeader) === "true";
    if (a.status < 200 || a.status > 299) {
      throw new ApiError({ status: a.status, problem: decodeProblem(a), key, replayed, attempts, headers: a.headers });
    }
    let value: T;
    try {
      value = JSON.parse(a.body) as T;
    } catch (e) {
      throw new Error(`payments API: decode the ${a.status} answer of ${endpoint}`, { cause: e });
    }
    return { value, key, replayed, status: a.status, headers: a.headers, attempts };
  }
}

/**
 * pathKey is key as the {key} path segment carries it. The server reads
 * the segment, once percent-decoded, exactly like the Idempotency-Key
 * header (bare, or an sf-string in quotes), so the key goes as it went in
 * the header, percent-encoded. The exceptions are "." and "..": URL
 * resolution removes them as dot segments, so they go as the sf-string
 * that names the same key.
 */
function pathKey(key: string): string {
  return key === "." || key === ".." ? `"${key}"` : key;
}

/** seg percent-encodes one path segment. */
function seg(s: string): string {
  return encodeURIComponent(s);
}

function query(params: Record<string, string | number | boolean | undefined>): string {
  const q = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined) {
      q.set(name, String(value));
    }
  }
  const s = q.toString();
  return s === "" ? "" : `?${s}`;
}
