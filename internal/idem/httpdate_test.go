package idem

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// An instant in any zone is written as the same HTTP-date, and reads back
// as that instant.
func TestHTTPDate(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 1, 15, 5, 0, 7, 900_000_000, time.FixedZone("UTC-5", -5*3600))
	const want = "Wed, 15 Jan 2025 10:00:07 GMT"
	if got := HTTPDate(at); got != want {
		t.Fatalf("HTTPDate(%v) = %q, want %q", at, got, want)
	}
	back, err := http.ParseTime(want)
	if err != nil || !back.Equal(at.Truncate(time.Second)) {
		t.Errorf("http.ParseTime(%q) = %v, %v; want %v", want, back, err, at.Truncate(time.Second))
	}
}

// formatsHTTPDate is an HTTP-date formatted by hand.
var formatsHTTPDate = regexp.MustCompile(`\.Format\(http\.TimeFormat\)`)

// HTTPDate is the one place the server writes an HTTP-date; tests compare
// with it rather than format their own.
func TestHTTPDateIsWrittenInOnePlace(t *testing.T) {
	t.Parallel()
	self := filepath.Join("..", "..", "internal", "idem", "keyrow.go")
	var copies []string
	for _, dir := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join("..", "..", dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || path == self {
				return err
			}
			b, err := os.ReadFile(path)
			if err == nil && formatsHTTPDate.Match(b) {
				copies = append(copies, path)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(copies) > 0 {
		t.Errorf("HTTP-dates formatted outside %s, use HTTPDate: %v", self, copies)
	}
}
