package httpapi

import (
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// requestDuration is the HTTP metric (X1), served at /metrics. Labels are
// bounded: route is chi's route template, never the concrete path; method
// is one of the standard methods or OTHER; status_class is 1xx..5xx.
var requestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "http_request_duration_seconds",
	Help:    "HTTP requests by route template, method and status class, with their duration.",
	Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
}, []string{"route", "method", "status_class"})

// authLookupsRefusedTotal counts requests refused before any query because
// their address used up its budget of API key lookups (R5).
var authLookupsRefusedTotal = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "http_auth_lookups_refused_total",
	Help: "Requests answered 429 without a database query because their client address looked up too many unknown API keys.",
})

func init() { prometheus.MustRegister(requestDuration, authLookupsRefusedTotal) }

// observeRequest records one request. route "" (no route matched) is
// "unmatched"; status 0 (nothing written) is what net/http sends, 200.
func observeRequest(route, method string, status int, d time.Duration) {
	if route == "" {
		route = "unmatched"
	}
	requestDuration.WithLabelValues(route, metricMethod(method), statusClass(status)).Observe(d.Seconds())
}

// initRouteMetrics starts the 5xx series of every route and method of
// routes at zero, so the 5xx ratio of deploy/prometheus/alerts.yml
// (HTTPServerErrors) counts a route's first server error: rate() over a
// series that appears at its first increment misses that increment. The
// other classes appear with a route's first request, which the ratio's
// denominator may miss at no cost.
func initRouteMetrics(routes chi.Routes) {
	_ = chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		requestDuration.WithLabelValues(route, metricMethod(method), statusClass(http.StatusInternalServerError))
		return nil
	})
}

func metricMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "OTHER"
}

func statusClass(status int) string {
	if status == 0 {
		status = http.StatusOK
	}
	switch status / 100 {
	case 1:
		return "1xx"
	case 2:
		return "2xx"
	case 3:
		return "3xx"
	case 4:
		return "4xx"
	case 5:
		return "5xx"
	}
	return "other"
}
