package client

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"time"
)

// NewKey returns a fresh Idempotency-Key: 32 hexadecimal digits, the
// current Unix time in milliseconds (48 bits) followed by 80 random bits
// from crypto/rand, as in a version 7 UUID. Mint one per logical
// operation, persist it (with the request) before the first send, and pass
// it to every attempt, including those made by a process that restarted:
// the key is what lets the server tell a retry from a new request.
//
// The time comes first so that keys sort in the order they were minted:
// the server's key table is indexed by (tenant, endpoint, key), and a new
// key then lands on the index's most recent page, which is in memory,
// where a fully random key lands on a random one, which a key table larger
// than the server's memory must read from disk first (docs/capacity.md,
// "Keys past memory"). 80 random bits keep two keys minted in the same
// millisecond apart.
func NewKey() string {
	var b [16]byte
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(time.Now().UnixMilli()))
	copy(b[:6], ms[2:])
	_, _ = rand.Read(b[6:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
