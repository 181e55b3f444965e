// Package httpapi is the HTTP edge of the service: routing, authentication,
// request bodies, and the one table that turns errors into RFC 9457
// problem responses (problemFor). Idempotent endpoints go through one
// adapter (idempotent), which parses the key, rejects ambiguous bodies
// before any claim, takes the fingerprint and hands the business write to
// internal/idem. The package never imports the generated database code.
package httpapi
