package apidocs_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	apispec "github.com/idemref/payments"
	"github.com/idemref/payments/internal/apidocs"
	httpapi "github.com/idemref/payments/internal/http"
)

// ScreenshotEnv names where TestDocsPageRendersInBrowser saves its
// screenshot; by default a file in the temporary directory. CI sets it to
// its artifact path.
const screenshotEnv = "DOCS_SCREENSHOT"

// chromium finds the browser: Debian's chromium, installed by .ci/run. On
// CI its absence fails the test; elsewhere it skips.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed (.ci/run installs it with apt-get)")
	}
	t.Skip("chromium is not installed: apt-get install chromium")
	return ""
}

// The page, served by the real handler over HTTP and rendered by a real
// headless browser, shows every operation of the contract and logs
// nothing: no script error, no failed load, no request to another origin
// (the page's Content-Security-Policy would block and log it).
func TestDocsPageRendersInBrowser(t *testing.T) {
	t.Parallel()
	browser := chromium(t)
	srv := httptest.NewServer(httpapi.NewHandler(httpapi.Config{Logger: slog.New(slog.DiscardHandler), OpenAPI: apispec.OpenAPI}))
	t.Cleanup(srv.Close)

	shot := os.Getenv(screenshotEnv)
	if shot == "" {
		shot = filepath.Join(os.TempDir(), "payments-docs.png")
	}
	if err := os.MkdirAll(filepath.Dir(shot), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(shot)

	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-extensions", "--no-first-run",
		"--user-data-dir="+t.TempDir(),
		// Page console messages go to stderr as INFO:CONSOLE lines.
		"--enable-logging=stderr", "--v=0",
		// Run the page's timers ahead until it is idle (the document fetched
		// and rendered), then dump the DOM and take the screenshot.
		"--virtual-time-budget=15000",
		"--window-size=1280,1600", "--hide-scrollbars",
		"--screenshot="+shot, "--dump-dom",
		srv.URL+"/docs")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}

	var logged []string
	for line := range strings.SplitSeq(stderr.String(), "\n") {
		if strings.Contains(line, ":CONSOLE") {
			logged = append(logged, line)
		}
	}
	if len(logged) > 0 {
		t.Errorf("the page logged:\n%s", strings.Join(logged, "\n"))
	}

	doc, err := openapi3.NewLoader().LoadFromData(apispec.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	dom := stdout.String()
	n := 0
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			n++
			// Redoc renders each operation as a section with this id.
			if !strings.Contains(dom, `id="operation/`+op.OperationID+`"`) {
				t.Errorf("%s %s (%s) is not rendered", method, path, op.OperationID)
			}
		}
	}
	if n < 10 {
		t.Errorf("only %d operations in the contract", n)
	}
	if info, err := os.Stat(shot); err != nil || info.Size() == 0 {
		t.Fatalf("no screenshot at %s: %v", shot, err)
	}
	t.Logf("screenshot of /docs: %s", shot)
}

// The page and the bundle are served with the headers that keep it
// offline, and the bundle no longer names another origin.
func TestDocsAreServedOffline(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(httpapi.NewHandler(httpapi.Config{Logger: slog.New(slog.DiscardHandler), OpenAPI: apispec.OpenAPI}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct{ path, contentType string }{
		{"/docs", "text/html; charset=utf-8"},
		{apidocs.BundlePath, "text/javascript; charset=utf-8"},
	} {
		res, err := http.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		_, _ = body.ReadFrom(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != tc.contentType {
			t.Errorf("GET %s: %d %s", tc.path, res.StatusCode, res.Header.Get("Content-Type"))
		}
		if tc.path == "/docs" && !strings.Contains(res.Header.Get("Content-Security-Policy"), "default-src 'none'") {
			t.Errorf("GET /docs: Content-Security-Policy = %q", res.Header.Get("Content-Security-Policy"))
		}
		if bytes.Contains(body.Bytes(), []byte(apidocs.ExternalLogo)) {
			t.Errorf("GET %s still references %s", tc.path, apidocs.ExternalLogo)
		}
	}
}
