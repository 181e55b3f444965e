// Unknown outcomes: the error carries the key, and resolve asks the
// key-status endpoint, counting the server's commit window from the last
// attempt before it concludes that nothing ran.
import assert from "node:assert/strict";
import { test } from "node:test";
import { KeyUnknownError, NotRecordedError, OutcomeUnknownError } from "@idemref/payments";
import { order, rejection, stack } from "./harness.mjs";

test("an unknown outcome that was executed is resolved: completed, one order", async () => {
  const s = await stack();
  // The first attempt commits and its answer is dropped; every later one
  // gets a gateway's 503: the client runs out of attempts.
  await s.faults(["cut"], "status 503");
  const c = s.client({ maxAttempts: 3 });
  const err = await rejection(c.createOrder(order("inv-ts-unknown")));
  assert.ok(err instanceof OutcomeUnknownError, String(err));
  assert.equal(err.attempts, 3);
  assert.equal(err.reason, "attempts");
  assert.equal(err.endpoint, "POST /v1/orders");
  assert.match(err.key, /^[0-9a-f]{32}$/);

  let st = await s.state();
  assert.deepEqual(st.attempts.map((a) => a.key), [err.key, err.key, err.key]);
  assert.equal(st.orders.length, 1);

  await s.faults([]);
  const status = await c.resolve(err);
  assert.equal(status.state, "completed");
  assert.equal(status.response_status, 201);
  assert.equal(status.resource, `/v1/orders/${st.orders[0].id}`);

  // Sending again with the key is the other way to resolve: a replay.
  const again = await c.createOrder(order("inv-ts-unknown"), { key: err.key });
  assert.equal(again.replayed, true);
  assert.equal(again.value.id, st.orders[0].id);
  st = await s.state();
  assert.equal(st.orders.length, 1);
  assert.deepEqual(st.keys.map((k) => [k.key, k.response_status]), [[err.key, 201]]);
});

test("an unknown outcome that never ran is final only after the commit window", async () => {
  // Short server timeouts, so that the commit window is short.
  const s = await stack({ request_timeout_ms: 500, lock_timeout_ms: 100 });
  await s.faults(["status 503", "status 503"]);
  const c = s.client({ maxAttempts: 2 });
  const err = await rejection(c.createOrder(order("inv-ts-never")));
  assert.ok(err instanceof OutcomeUnknownError, String(err));
  const lastAttempt = (await s.state()).attempts.at(-1).at_ms;

  // Asked with less time than the window: not recorded yet, and when the
  // absence becomes final.
  const notYet = await rejection(c.resolve(err, { timeoutMs: 100 }));
  assert.ok(notYet instanceof NotRecordedError, String(notYet));
  assert.ok(notYet.windowMs >= 600, `commit window ${notYet.windowMs} ms, want the request timeout and a lock wait at least`);
  assert.equal(notYet.finalAt, err.lastSent + notYet.windowMs);

  const gone = await rejection(c.resolve(err));
  assert.ok(gone instanceof KeyUnknownError, String(gone));
  assert.equal(gone.key, err.key);
  const st = await s.state();
  const asked = st.attempts.at(-1);
  assert.equal(asked.method, "GET");
  assert.ok(asked.at_ms - lastAttempt >= notYet.windowMs,
    `KeyUnknownError concluded from a lookup sent ${asked.at_ms - lastAttempt} ms after the last attempt, inside the ${notYet.windowMs} ms window`);
  assert.deepEqual(st.orders, []);
  assert.deepEqual(st.keys, []);
});
