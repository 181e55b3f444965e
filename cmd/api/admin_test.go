package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemref/payments/internal/tooling/testdb"
)

// G6: the real binary serves /metrics and pprof on ADMIN_ADDR only; the
// public listener answers both as unknown paths, and without ADMIN_ADDR
// neither is served and the log says so. Mutation: serve the admin
// handler's routes on the public router too and PublicServesNeither fails.
func TestAdminListener(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	srv := startServer(t, dbURL)
	if srv.admin == "" {
		t.Fatalf("ADMIN_ADDR=127.0.0.1:0 logged no admin address:\n%s", srv.logs.String())
	}
	t.Run("AdminServesMetricsAndProfiler", func(t *testing.T) {
		for path, want := range map[string]string{
			"/metrics":                       "payments_build_info",
			"/debug/pprof/":                  "Types of profiles available",
			"/debug/pprof/goroutine?debug=1": "goroutine profile",
			"/debug/pprof/heap?debug=1":      "heap profile",
			"/debug/pprof/profile?seconds=1": "", // a binary CPU profile, streamed past any write timeout
			"/debug/pprof/cmdline":           "serve",
		} {
			status, body := httpGet(t, srv.admin+path)
			if status != http.StatusOK || !strings.Contains(body, want) || body == "" {
				t.Errorf("admin GET %s = %d, want 200 with %q in %.200q", path, status, want, body)
			}
		}
	})
	t.Run("PublicServesNeither", func(t *testing.T) {
		for _, path := range []string{"/metrics", "/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/cmdline"} {
			status, body := httpGet(t, srv.base+path)
			if status != http.StatusNotFound || !strings.Contains(body, `"code":"not_found"`) {
				t.Errorf("public GET %s = %d %.200s, want the 404 problem of an unknown path", path, status, body)
			}
		}
	})
	t.Run("OffWithoutAdminAddr", func(t *testing.T) {
		off := startServer(t, dbURL, "ADMIN_ADDR=")
		if off.admin != "" {
			t.Errorf("without ADMIN_ADDR an admin listener on %s", off.admin)
		}
		if !strings.Contains(off.logs.String(), "no admin listener") {
			t.Errorf("without ADMIN_ADDR the log does not say /metrics is not served:\n%s", off.logs.String())
		}
		if status, _ := httpGet(t, off.base+"/metrics"); status != http.StatusNotFound {
			t.Errorf("public /metrics without ADMIN_ADDR = %d, want 404", status)
		}
	})
}

func TestAdminAddrErrorsAreClear(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"NotAnAddress", map[string]string{"ADMIN_ADDR": "metrics"}, `ADMIN_ADDR="metrics": want a listen address host:port`},
		{"NoPort", map[string]string{"ADMIN_ADDR": "127.0.0.1:"}, "want a listen address host:port"},
		{"SameAsAddr", map[string]string{"ADDR": ":8080", "ADMIN_ADDR": ":8080"}, "ADMIN_ADDR (:8080) must differ from ADDR"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), []string{"serve"}, func(k string) string { return tt.env[k] }, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

// httpGet returns a GET's status and body.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url) //nolint:gosec // a test's own server
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}
