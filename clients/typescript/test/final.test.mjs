// Final answers are never retried, and come as typed errors with the
// problem's code: a 422 mismatch, a 400 validation failure, a 401.
import assert from "node:assert/strict";
import { test } from "node:test";
import { ApiError, Client, hasCode, newKey } from "@idemref/payments";
import { order, rejection, stack } from "./harness.mjs";

test("a 422 idempotency_key_reused is final: one attempt, nothing written", async () => {
  const s = await stack();
  const c = s.client();
  const key = newKey();
  const created = await c.createOrder(order("inv-ts-first"), { key });
  const before = (await s.state()).attempts.length;

  const err = await rejection(c.createOrder(order("inv-ts-other"), { key }));
  assert.ok(err instanceof ApiError, String(err));
  assert.equal(err.status, 422);
  assert.equal(err.code, "idempotency_key_reused");
  assert.ok(hasCode(err, "idempotency_key_reused"));
  assert.equal(err.problem.type, "/docs/problems#idempotency-key-reused");
  assert.equal(err.attempts, 1);
  assert.equal(err.key, key);
  assert.equal(err.replayed, false);

  const st = await s.state();
  assert.equal(st.attempts.length - before, 1, "a final answer is never retried");
  assert.deepEqual(st.orders, [{ id: created.value.id, reference: "inv-ts-first" }]);
  assert.deepEqual(st.keys.map((k) => k.key), [key]);
});

test("other final answers: 400 validation_failed, 401", async () => {
  const s = await stack();
  const invalid = { ...order("inv-ts-invalid"), amount: 0 };
  const err = await rejection(s.client().createOrder(invalid));
  assert.ok(err instanceof ApiError, String(err));
  assert.equal(err.code, "validation_failed");
  assert.equal(err.status, 400);
  assert.ok(err.problem.errors?.some((e) => e.field === "amount"), JSON.stringify(err.problem));
  assert.equal(err.attempts, 1);

  const bad = new Client(s.url, "sk_wrong", { policy: { baseDelayMs: 5 } });
  const denied = await rejection(bad.createOrder(order("inv-ts-401")));
  assert.ok(hasCode(denied, "unauthorized"), String(denied));
  assert.equal(denied.attempts, 1);

  const st = await s.state();
  assert.equal(st.attempts.length, 2);
  assert.deepEqual(st.orders, []);
});
