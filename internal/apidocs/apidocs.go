// Package apidocs serves the interactive API reference at GET /docs: a
// page that renders the served openapi.yaml with Redoc's standalone bundle
// (npm package redoc 2.5.4, MIT, vendored as redoc.standalone.js with its
// licence and those of what it bundles in redoc.LICENSE). The bundle is embedded in the binary, so the
// page works offline, and the Content-Security-Policy forbids every other
// origin, so it stays that way.
package apidocs

import (
	"bytes"
	_ "embed"
	"net/http"
)

var (
	//go:embed index.html
	page []byte
	//go:embed redoc.standalone.js
	vendored []byte
	// bundle is the vendored file with its one reference to another
	// origin, the sidebar's logo, replaced by an empty inline image: the
	// page must not reach the network, and the policy below would block
	// (and log) the request anyway.
	bundle = bytes.ReplaceAll(vendored, []byte(ExternalLogo), []byte("data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg'/%3E"))
)

// ExternalLogo is the URL the vendored bundle loads its logo from.
const ExternalLogo = "https://cdn.redoc.ly/redoc/logo-mini.svg"

// BundlePath is where the page loads the Redoc bundle from.
const BundlePath = "/docs/redoc.standalone.js"

// csp allows this origin only. Redoc styles its components with inline
// style elements and draws icons from data: URIs; it fetches the document
// from this origin (connect-src).
const csp = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Page serves the reference page.
func Page(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", csp)
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(page)
}

// Bundle serves the Redoc bundle. It changes only with the binary, so a
// browser may keep it for a day.
func Bundle(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	w.Header().Set("Cache-Control", "public, max-age=86400")
	_, _ = w.Write(bundle)
}
