package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
)

// What both paths share (Execute in store.go, Begin and Phase in
// lease.go): the bounded lock wait and the savepoint of a claim's
// transaction, the horizons a claim stamps on the key row, what an
// existing row means, the response in the form its columns store, and the
// marking of transient failures. What one path alone uses sits in that
// path's file.

// stampExpiry puts the recorded expiry on the response being answered:
// the row's expires_at, the same instant every replay reads.
//
// It stamps a copy: the header map came from the caller's exec, which may
// share it with other responses, and must not be written behind its back.
func stampExpiry(res *Response, expiresAt time.Time) {
	h := res.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set(ExpiresHeader, HTTPDate(expiresAt))
	res.Header = h
}

// HTTPDate is t as an HTTP-date (RFC 9110 section 5.6.7), to the second:
// the form of Idempotency-Expires. The one place it is written, so every
// stamp, replay and test says the same instant the same way (http.TimeFormat
// prints GMT but not the conversion to it: a local time would be hours off).
func HTTPDate(t time.Time) string { return t.UTC().Format(http.TimeFormat) }

// boundLockWaits sets lock_timeout for the rest of the transaction. A
// duplicate of a request whose transaction is still open blocks on that
// transaction's uncommitted row in the primary key index. Never wait
// unbounded (L5): after lock_timeout the statement fails with 55P03 and the
// duplicate gets 409. The setting is deferred (db.Deferred): it travels to
// the server with the claim, in the same round trip, ahead of it.
func (s *Store) boundLockWaits(ctx context.Context, tx pgx.Tx) error {
	return dbsqlc.New(db.Deferred(tx)).TxSetLockTimeout(ctx, fmt.Sprintf("%dms", s.cfg.LockTimeout.Milliseconds()))
}

// executeInSavepoint runs exec inside a savepoint and rolls the savepoint
// back when exec reports a deterministic failure, so the failure is
// recorded (by the caller) without any business write that preceded it.
func executeInSavepoint(ctx context.Context, tx pgx.Tx, exec func(context.Context, pgx.Tx) (Response, error)) (Response, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return Response{}, err
	}
	res, err := exec(ctx, sp)
	if err != nil {
		return Response{}, err
	}
	if res.Status >= 400 {
		// Also clears an aborted transaction state: after a failed
		// statement PostgreSQL rejects everything until this rollback.
		if err := sp.Rollback(ctx); err != nil {
			return Response{}, err
		}
		return res, nil
	}
	return res, sp.Commit(ctx)
}

// wrap marks transient failures as ErrUnavailable.
func (s *Store) wrap(err error) error {
	if db.IsTransient(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// horizons are a key's expires_at and retain_until, counted from its claim.
func (s *Store) horizons() (expiresAt, retainUntil time.Time) {
	now := time.Now()
	return now.Add(s.cfg.TTL), now.Add(s.cfg.KeyRetention)
}

// settled decides what an existing key row means for claim c, in both
// paths: another request's key is ErrKeyReused (never answered with
// another request's result); a completed key gives its recorded response;
// a key still in progress gives nil. Records made under another
// fingerprint version cannot be compared; they are trusted rather than
// turned into 422s for honest retries.
//
// A record whose result is past its TTL (resultExpired, computed on the
// database clock) is a tombstone whether the reaper has pruned it or not:
// the same request gets *ResultExpiredError, never its old response
// and never a second execution.
func settled(row dbsqlc.IdempotencyKey, resultExpired bool, c Claim) (*Response, error) {
	// Another request's key (L5); a record of another version is trusted (F3).
	if row.FingerprintVersion == FingerprintVersion && !bytes.Equal(row.Fingerprint, c.Fingerprint) {
		return nil, ErrKeyReused
	}
	if resultExpired { // a tombstone (E3)
		e := &ResultExpiredError{ExpiredAt: row.ExpiresAt, RetainedUntil: row.RetainUntil}
		if row.ResponseStatus != nil {
			e.Status = int(*row.ResponseStatus)
		}
		if row.ResourceLocation != nil {
			e.Location = *row.ResourceLocation
		}
		return nil, e
	}
	if row.State != "completed" {
		return nil, nil
	}
	res, err := storedResponse(row)
	return &res, err
}

// storedResponse decodes a completed row's stored response. The headers
// that columns of the row hold are not stored twice (a smaller row):
// Location is resource_location, Idempotency-Expires is expires_at. Rows
// recorded before that carry both in their stored headers too, with the
// same values.
func storedResponse(row dbsqlc.IdempotencyKey) (Response, error) {
	var header http.Header
	if err := json.Unmarshal(row.ResponseHeaders, &header); err != nil {
		return Response{}, fmt.Errorf("idem: decode recorded headers: %w", err)
	}
	if header == nil {
		header = http.Header{}
	}
	if row.ResourceLocation != nil {
		header.Set("Location", *row.ResourceLocation)
	}
	header.Set(ExpiresHeader, HTTPDate(row.ExpiresAt))
	return Response{Status: int(*row.ResponseStatus), Header: header, Body: row.ResponseBody}, nil
}

// record is a Response in the form its columns store.
type record struct {
	status  int32
	headers []byte
	body    []byte
	// location is the Location header, kept past the result's TTL.
	location *string
}

// encodeRecord keeps only RecordedHeaders. A response without a body (204)
// is recorded as an empty body: a NULL body would violate the completed-row
// check and roll the work back.
func encodeRecord(res Response) (record, error) {
	headers, err := json.Marshal(pickHeaders(res.Header))
	if err != nil {
		return record{}, err
	}
	body := res.Body
	if body == nil {
		body = []byte{}
	}
	rec := record{status: db.Int32(res.Status), headers: headers, body: body}
	if loc := res.Header.Get("Location"); loc != "" {
		rec.location = &loc
	}
	return rec, nil
}

// pickHeaders keeps the RecordedHeaders that no column of the row holds:
// Location goes to resource_location (see storedResponse).
func pickHeaders(h http.Header) http.Header {
	kept := http.Header{}
	for _, name := range RecordedHeaders {
		if name == "Location" {
			continue
		}
		if v := h.Values(name); len(v) > 0 {
			kept[name] = v
		}
	}
	return kept
}
