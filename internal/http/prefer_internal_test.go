package httpapi

import (
	"net/http"
	"testing"
	"time"
)

// preferWait reads wait from any Prefer header line, among other
// preferences and parameters, and ignores what is not a number of seconds
// (RFC 7240: a preference not understood is ignored).
func TestPreferWaitParsesTheHeader(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		lines []string
		want  time.Duration
		ok    bool
	}{
		{"Alone", []string{"wait=10"}, 10 * time.Second, true},
		{"AmongOthers", []string{"respond-async, wait=3"}, 3 * time.Second, true},
		{"SecondLine", []string{"return=minimal", "Wait = 4"}, 4 * time.Second, true},
		{"Quoted", []string{`wait="5"`}, 5 * time.Second, true},
		{"WithParameter", []string{"wait=6;foo=bar"}, 6 * time.Second, true},
		{"Zero", []string{"wait=0"}, 0, true},
		{"None", nil, 0, false},
		{"OtherPreference", []string{"respond-async"}, 0, false},
		{"NotSeconds", []string{"wait=1.5", "wait=-1", "wait=soon", "wait"}, 0, false},
		{"TooLarge", []string{"wait=99999999999"}, 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := http.NewRequest(http.MethodPost, "/v1/orders", nil)
			for _, l := range tt.lines {
				r.Header.Add("Prefer", l)
			}
			got, ok := preferWait(r)
			if got != tt.want || ok != tt.ok {
				t.Errorf("preferWait(%q) = %v, %v; want %v, %v", tt.lines, got, ok, tt.want, tt.ok)
			}
		})
	}
}
