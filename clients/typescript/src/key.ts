/**
 * newKey returns a fresh Idempotency-Key: 32 hexadecimal digits, the
 * current Unix time in milliseconds (48 bits) followed by 80 random bits
 * from the platform's `crypto.getRandomValues`, as in a version 7 UUID; the
 * Go client's `NewKey` mints the same form. Mint one per logical
 * operation, persist it (with the request) before the first send, and pass
 * it to every attempt, including those made by a process that restarted:
 * the key is what lets the server tell a retry from a new request.
 *
 * The time comes first so that keys sort in the order they were minted:
 * the server's key table is indexed by (tenant, endpoint, key), and a new
 * key then lands on the index's most recent page, which is in memory,
 * where a fully random key (`crypto.randomUUID()`) lands on a random one,
 * which a key table larger than the server's memory must read from disk
 * first (docs/capacity.md, "Keys past memory"). 80 random bits keep two
 * keys minted in the same millisecond apart.
 */
export function newKey(): string {
  const b = new Uint8Array(16);
  let ms = Date.now();
  // 48 bits of milliseconds, big-endian; Date.now() fits in 2^53, so
  // division (not a 32-bit shift) takes the bytes off.
  for (let i = 5; i >= 0; i--) {
    b[i] = ms % 256;
    ms = Math.floor(ms / 256);
  }
  globalThis.crypto.getRandomValues(b.subarray(6));
  let hex = "";
  for (const byte of b) {
    hex += byte.toString(16).padStart(2, "0");
  }
  return hex;
}
