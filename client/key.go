package client

import (
	"crypto/rand"
	"encoding/hex"
)

// NewKey returns a fresh Idempotency-Key: 128 random bits from crypto/rand
// as 32 hexadecimal digits. Mint one per logical operation, persist it
// (with the request) before the first send, and pass it to every attempt,
// including those made by a process that restarted: the key is what lets
// the server tell a retry from a new request.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
