// The suites' side of internal/clienttest TestTypeScriptClient, which runs
// them: it starts a real server per stack, behind a proxy that plays the
// faults a suite scripts, and reports what the server did (rows, the
// proxy's record of requests, the processor simulator's calls).
import { Client } from "@idemref/payments";

const control = process.env.PAYMENTS_TEST_CONTROL;

async function call(method, path, body) {
  if (!control) {
    throw new Error("PAYMENTS_TEST_CONTROL is not set: run these suites with go test ./internal/clienttest -run TestTypeScriptClient");
  }
  const res = await fetch(control + path, {
    method,
    headers: { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!res.ok) {
    throw new Error(`${method} ${path}: ${res.status} ${await res.text()}`);
  }
  return res.status === 204 ? undefined : res.json();
}

/**
 * stack starts a real server on a database of its own, with its own
 * tenant and processor simulator (timeouts: request_timeout_ms,
 * lock_timeout_ms of the server).
 */
export async function stack(timeouts = {}) {
  const s = await call("POST", "/stacks", timeouts);
  return {
    url: s.url,
    apiKey: s.api_key,
    /** A client of the stack, with short backoff so the suites stay fast. */
    client(policy = {}, options = {}) {
      return new Client(s.url, s.api_key, {
        policy: { baseDelayMs: 5, maxDelayMs: 20, ...policy },
        attemptTimeoutMs: 5000,
        ...options,
      });
    },
    /** One fault per attempt ("cut", "status 503", "status 429 1"), then forever ("": none). */
    faults(script, forever = "") {
      return call("POST", `/stacks/${s.id}/faults`, { script, forever });
    },
    /** How long the processor simulator takes per call. */
    latency(ms) {
      return call("POST", `/stacks/${s.id}/latency`, { ms });
    },
    /** { orders, keys, payments, attempts, sim_calls } as the server has them now. */
    state() {
      return call("GET", `/stacks/${s.id}/state`);
    },
  };
}

export function order(reference) {
  return { reference, customer_id: "cus_1", amount: 2500, currency: "EUR" };
}

/** until polls check every 10 ms until it holds, for at most ms. */
export async function until(check, ms = 5000) {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) {
      throw new Error(`not within ${ms} ms: ${check}`);
    }
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** rejection returns what promise was rejected with, and fails if it was not. */
export async function rejection(promise) {
  let v;
  try {
    v = await promise;
  } catch (e) {
    return e;
  }
  throw new Error(`resolved with ${JSON.stringify(v)}, want a rejection`);
}
