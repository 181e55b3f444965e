// What bounds the retries: the client's budget during an outage, and the
// operation's timeout against a long Retry-After.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Budget, OutcomeUnknownError } from "@idemref/payments";
import { order, stack } from "./harness.mjs";

test("during an outage the budget, not callers × attempts, bounds the retries", async () => {
  const s = await stack();
  await s.faults([], "status 503");
  const callers = 20;
  const capacity = 5;
  const budget = new Budget(capacity, 1, 0.1);
  const c = s.client({ maxAttempts: 5 }, { budget });
  const results = await Promise.allSettled(
    Array.from({ length: callers }, (_, i) => c.createOrder(order(`inv-ts-storm-${i}`))),
  );
  for (const r of results) {
    assert.equal(r.status, "rejected");
    assert.ok(r.reason instanceof OutcomeUnknownError, String(r.reason));
  }
  // Each caller's first attempt, plus at most capacity retries between
  // them all (no answer ever refilled the bucket), instead of 20 × 5.
  const st = await s.state();
  assert.ok(st.attempts.length >= callers && st.attempts.length <= callers + capacity,
    `the proxy saw ${st.attempts.length} requests, want from ${callers} to ${callers + capacity}`);
  assert.deepEqual(st.orders, []);
  assert.ok(results.some((r) => r.reason.reason === "budget"), "no caller stopped on the budget");
  assert.ok(budget.tokens < 1);
});

test("a Retry-After past the operation's timeout stops it at once", async () => {
  const s = await stack();
  await s.faults([], "status 503 2");
  const start = Date.now();
  const err = await s.client().createOrder(order("inv-ts-deadline"), { timeoutMs: 500 }).catch((e) => e);
  assert.ok(err instanceof OutcomeUnknownError, String(err));
  assert.equal(err.reason, "deadline");
  assert.ok(Date.now() - start < 250, `took ${Date.now() - start} ms: it should stop at once, not wait toward the deadline`);
  assert.equal((await s.state()).attempts.length, 1);
});
