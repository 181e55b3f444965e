package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
)

// The key row, shared by both paths (Execute in store.go, Begin and Phase
// in lease.go): claiming it, deciding what an existing one means, and the
// response in the form its columns store.

// stampExpiry puts the recorded expiry on the response being answered:
// the row's expires_at, the same instant every replay reads (E4).
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

// existing reads a key that a claim found taken: replay, 409 or 422.
// createdAt is the record's creation time, for the replay age metric.
func existing(ctx context.Context, q *dbsqlc.Queries, c Claim) (res Response, createdAt time.Time, err error) {
	row, err := q.IdemKeyGet(ctx, dbsqlc.IdemKeyGetParams{TenantID: c.TenantID, Endpoint: c.Endpoint, IdemKey: c.Key})
	if errors.Is(err, pgx.ErrNoRows) {
		// The row vanished between the claim and this read: it was
		// forgotten and deleted. Rare; the retry will claim it afresh.
		return Response{}, time.Time{}, ErrKeyInUse
	}
	if err != nil {
		return Response{}, time.Time{}, err
	}
	if row.Forgotten {
		// Taken a moment ago by a row already past its retention: the
		// retry deletes it and runs.
		return Response{}, time.Time{}, ErrKeyInUse
	}
	return replay(row, c)
}

// replay answers a request from its key's row: the recorded response, or
// the error that says why there is none to give.
func replay(row dbsqlc.IdemKeyGetRow, c Claim) (Response, time.Time, error) {
	stored, err := settled(row.IdempotencyKey, row.ResultExpired, c)
	if err != nil {
		return Response{}, time.Time{}, err
	}
	if stored == nil {
		return Response{}, time.Time{}, ErrKeyInUse
	}
	return *stored, row.IdempotencyKey.CreatedAt, nil
}

// claimCompleted is the one-transaction claim and record: the key row
// inserted already completed with rec (IdemKeyClaimCompleted). A taken key
// fails it on keyPrimaryKey.
func (s *Store) claimCompleted(ctx context.Context, q *dbsqlc.Queries, c Claim, rec record) (expiresAt time.Time, err error) {
	expires, retain := s.horizons()
	return q.IdemKeyClaimCompleted(ctx, dbsqlc.IdemKeyClaimCompletedParams{
		TenantID:           c.TenantID,
		Endpoint:           c.Endpoint,
		IdemKey:            c.Key,
		Fingerprint:        c.Fingerprint,
		FingerprintVersion: FingerprintVersion,
		ResponseStatus:     &rec.status,
		ResponseHeaders:    rec.headers,
		ResponseBody:       rec.body,
		ResourceLocation:   rec.location,
		ExpiresAt:          expires,
		RetainUntil:        retain,
	})
}

// claim inserts a multi-step key row (L1, S3), holding a lease of the
// configured length. pgx.ErrNoRows means the key exists already.
func (s *Store) claim(ctx context.Context, q *dbsqlc.Queries, c Claim) (generation int64, err error) {
	expires, retain := s.horizons()
	return q.IdemKeyClaim(ctx, dbsqlc.IdemKeyClaimParams{
		TenantID:           c.TenantID,
		Endpoint:           c.Endpoint,
		IdemKey:            c.Key,
		Fingerprint:        c.Fingerprint,
		FingerprintVersion: FingerprintVersion,
		ExpiresAt:          expires,
		RetainUntil:        retain,
		LeaseSeconds:       s.cfg.Lease.Seconds(),
	})
}

// horizons are a key's expires_at and retain_until, counted from its claim.
func (s *Store) horizons() (expiresAt, retainUntil time.Time) {
	now := time.Now()
	return now.Add(s.cfg.TTL), now.Add(s.cfg.KeyRetention)
}

// settled decides what an existing key row means for claim c, in both
// paths: another request's key is ErrKeyReused (L5: never answered with
// another request's result); a completed key gives its recorded response;
// a key still in progress gives nil. Records made under another
// fingerprint version cannot be compared; they are trusted rather than
// turned into 422s for honest retries (F3).
//
// A record whose result is past its TTL (resultExpired, computed on the
// database clock) is a tombstone whether the reaper has pruned it or not
// (E3): the same request gets *ResultExpiredError, never its old response
// and never a second execution.
func settled(row dbsqlc.IdempotencyKey, resultExpired bool, c Claim) (*Response, error) {
	if row.FingerprintVersion == FingerprintVersion && !bytes.Equal(row.Fingerprint, c.Fingerprint) {
		return nil, ErrKeyReused
	}
	if resultExpired {
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
// that columns of the row hold are not stored twice (R6: a smaller row):
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
