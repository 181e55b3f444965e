package httpapi

import (
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewAdminHandler serves what is for operators only, on the admin listener
// (ADMIN_ADDR), never on the public one: /metrics for Prometheus, and
// the Go profiler under /debug/pprof/. Neither authenticates: a metric
// names no tenant or key, but the profiler shows the process's memory and
// code paths, so the admin listener belongs on the operator's network
// (localhost, or a port only the scraper reaches).
//
// The profiler's handlers are mounted here by hand: importing
// net/http/pprof also registers them on http.DefaultServeMux, which this
// program never serves.
func NewAdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.Handler())
	mux.HandleFunc("GET /debug/pprof/", pprof.Index) // also heap, goroutine, allocs, block, mutex, threadcreate
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("POST /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return mux
}
