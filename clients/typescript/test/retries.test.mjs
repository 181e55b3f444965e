// One key per operation, kept across retries: a create, its replay after
// a dropped answer, and a 409 in progress retried to the replay. Each
// asserts on what the server recorded, not on the client's word alone.
import assert from "node:assert/strict";
import { test } from "node:test";
import { newKey } from "@idemref/payments";
import { order, stack, until } from "./harness.mjs";

test("a create records one order under the key it reports", async () => {
  const s = await stack();
  const before = Date.now();
  const res = await s.client().createOrder(order("inv-ts-create"));
  assert.equal(res.status, 201);
  assert.equal(res.replayed, false);
  assert.equal(res.attempts, 1);
  assert.equal(res.value.reference, "inv-ts-create");
  // newKey: 32 hex digits, the millisecond first (as the Go client's).
  assert.match(res.key, /^[0-9a-f]{32}$/);
  const minted = parseInt(res.key.slice(0, 12), 16);
  assert.ok(minted >= before && minted <= Date.now(), `key ${res.key} does not start with the time it was minted`);

  const st = await s.state();
  assert.deepEqual(st.orders, [{ id: res.value.id, reference: "inv-ts-create" }]);
  assert.deepEqual(st.keys, [{ key: res.key, endpoint: "POST /v1/orders", state: "completed", response_status: 201 }]);
  assert.deepEqual(st.attempts.map((a) => [a.method, a.path, a.key]), [["POST", "/v1/orders", res.key]]);
});

test("an answer dropped after the commit is replayed: one order", async () => {
  const s = await stack();
  // The proxy forwards the first attempt, lets the server commit, and
  // closes the connection without its answer.
  await s.faults(["cut"]);
  const key = newKey();
  const res = await s.client().createOrder(order("inv-ts-dropped"), { key });
  assert.equal(res.status, 201);
  assert.equal(res.replayed, true, "the retry's answer is the server's record of the first attempt");
  assert.equal(res.attempts, 2);
  assert.equal(res.key, key);

  const st = await s.state();
  assert.deepEqual(st.attempts.map((a) => a.key), [key, key], "every attempt carries the operation's key");
  assert.deepEqual(st.orders, [{ id: res.value.id, reference: "inv-ts-dropped" }]);
  assert.deepEqual(st.keys.map((k) => [k.key, k.response_status]), [[key, 201]]);
});

test("a 409 in progress is retried after Retry-After to the replay: one charge", async () => {
  const s = await stack();
  const c = s.client();
  const o = await c.createOrder(order("inv-ts-pay"));
  // The processor takes 800 ms per call: the first attempt holds the key
  // (its first step committed it in progress) while the second arrives.
  await s.latency(800);
  const key = newKey();
  const pay = { order_id: o.value.id, amount: 2500, currency: "EUR", payment_method: "pm_card_visa" };
  const first = c.createPayment(pay, { key });
  await until(async () => (await s.state()).keys.some((k) => k.key === key));

  const seen = [];
  const second = await s.client({ onAttempt: (a) => seen.push(a) }).createPayment(pay, { key });
  const firstRes = await first;
  assert.equal(firstRes.status, 201);
  assert.equal(firstRes.replayed, false);
  assert.equal(second.status, 201);
  assert.equal(second.replayed, true);
  assert.equal(second.value.id, firstRes.value.id);
  assert.ok(second.attempts >= 2, `attempts ${second.attempts}`);
  assert.equal(seen[0].status, 409);
  assert.equal(seen[0].error.code, "idempotency_key_in_use");
  assert.ok(seen[0].retry && seen[0].delayMs >= 1000, "the wait honours the server's Retry-After: 1");

  const st = await s.state();
  const attempts = st.attempts.filter((a) => a.path === "/v1/payments");
  assert.ok(attempts.every((a) => a.key === key));
  assert.equal(attempts.length, 1 + second.attempts);
  const gap = attempts[2].at_ms - attempts[1].at_ms;
  assert.ok(gap >= 990, `the second call retried ${gap} ms after its 409, before Retry-After`);
  assert.deepEqual(st.payments.map((p) => [p.id, p.status]), [[firstRes.value.id, "succeeded"]]);
  const charges = st.sim_calls.filter((c) => c.path === "/v1/charges" && c.executed);
  assert.equal(charges.length, 1, `the processor executed ${charges.length} charges`);
});

test("with preferWaitMs a duplicate waits for the first attempt: one attempt, one charge", async () => {
  const s = await stack();
  const c = s.client();
  const o = await c.createOrder(order("inv-ts-wait"));
  await s.latency(800);
  const key = newKey();
  const pay = { order_id: o.value.id, amount: 2500, currency: "EUR", payment_method: "pm_card_visa" };
  const first = c.createPayment(pay, { key });
  await until(async () => (await s.state()).keys.some((k) => k.key === key));

  const second = await s.client({}, { preferWaitMs: 5000 }).createPayment(pay, { key });
  const firstRes = await first;
  assert.equal(second.status, 201);
  assert.equal(second.replayed, true);
  assert.equal(second.attempts, 1, "the server waited for the first attempt instead of answering 409");
  assert.equal(second.headers.get("Preference-Applied"), "wait=5");
  assert.equal(second.value.id, firstRes.value.id);

  const st = await s.state();
  assert.equal(st.attempts.filter((a) => a.path === "/v1/payments").length, 2);
  assert.deepEqual(st.payments.map((p) => [p.id, p.status]), [[firstRes.value.id, "succeeded"]]);
  const charges = st.sim_calls.filter((c) => c.path === "/v1/charges" && c.executed);
  assert.equal(charges.length, 1, `the processor executed ${charges.length} charges`);
});
