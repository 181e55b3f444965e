package main

import (
	"fmt"
	"regexp"
	"strconv"
	"time"

	"sigs.k8s.io/yaml"
)

// timeScale is how much faster than the rules' own clock the harness
// runs them: every duration of deploy/prometheus/alerts.yml (an alert's
// for, a range's [window], an offset) is divided by it, so a minute of the
// rules is a second of the harness. A fault held 20 s is, to the rules, a
// 20-minute outage; a page that needs "for: 10m" of it fires after 10 s.
// Thresholds are left as written (a lag of 60 s is still 60 s), and so is
// everything else in the file: the harness evaluates the rules operators
// load, not copies edited for it.
const timeScale = 60

// minScaledRange is the shortest range a scaled rule may select: rate()
// and increase() need at least two samples in it, and a few more keep
// one missed scrape from emptying it.
const minScaledRange = 4 * scrapeEvery

var (
	promDuration = regexp.MustCompile(`^(\d+)(ms|s|m|h|d|w|y)$`)
	// A range or subquery window, or an offset, inside an expression.
	exprDuration = regexp.MustCompile(`\[(\d+(?:ms|s|m|h|d|w|y))(:\d+(?:ms|s|m|h|d|w|y))?\]|offset (\d+(?:ms|s|m|h|d|w|y))`)
)

var promUnits = map[string]time.Duration{
	"ms": time.Millisecond, "s": time.Second, "m": time.Minute, "h": time.Hour,
	"d": 24 * time.Hour, "w": 7 * 24 * time.Hour, "y": 365 * 24 * time.Hour,
}

// parsePromDuration reads a one-unit Prometheus duration such as 10m.
func parsePromDuration(s string) (time.Duration, error) {
	m := promDuration.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("duration %q: the harness scales one-unit durations only (such as 10m)", s)
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		return 0, err
	}
	return time.Duration(n) * promUnits[m[2]], nil
}

// scaledDuration divides s by factor and writes it in milliseconds.
func scaledDuration(s string, factor int) (string, time.Duration, error) {
	d, err := parsePromDuration(s)
	if err != nil {
		return "", 0, err
	}
	scaled := d / time.Duration(factor)
	return strconv.FormatInt(scaled.Milliseconds(), 10) + "ms", scaled, nil
}

// rulesDoc is a rules file as the harness rewrites it: each rule a map,
// so that every field it does not touch is written back as it was.
type rulesDoc struct {
	Groups []struct {
		Name  string           `json:"name"`
		Rules []map[string]any `json:"rules"`
	} `json:"groups"`
}

func parseRules(src []byte) (rulesDoc, error) {
	var doc rulesDoc
	err := yaml.UnmarshalStrict(src, &doc)
	return doc, err
}

// scaleRules returns the rules file src with every duration divided by
// factor, and nothing else changed.
func scaleRules(src []byte, factor int) ([]byte, error) {
	doc, err := parseRules(src)
	if err != nil {
		return nil, err
	}
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			if err := scaleRule(r, factor); err != nil {
				return nil, fmt.Errorf("%s: %v: %w", g.Name, r["alert"], err)
			}
		}
	}
	return yaml.Marshal(doc)
}

func scaleRule(r map[string]any, factor int) error {
	if f, ok := r["for"].(string); ok {
		scaled, _, err := scaledDuration(f, factor)
		if err != nil {
			return err
		}
		r["for"] = scaled
	}
	expr, ok := r["expr"].(string)
	if !ok {
		return fmt.Errorf("expr %v is not a string", r["expr"])
	}
	var failed error
	r["expr"] = exprDuration.ReplaceAllStringFunc(expr, func(s string) string {
		m := exprDuration.FindStringSubmatch(s)
		if m[3] != "" { // an offset
			scaled, _, err := scaledDuration(m[3], factor)
			failed = cmpErr(failed, err)
			return "offset " + scaled
		}
		if m[2] != "" {
			failed = cmpErr(failed, fmt.Errorf("subquery %s: not scaled by the harness", s))
			return s
		}
		scaled, d, err := scaledDuration(m[1], factor)
		failed = cmpErr(failed, err)
		if err == nil && d < minScaledRange {
			failed = cmpErr(failed, fmt.Errorf("range %s scales to %s, shorter than %s: too few scrapes in it", s, d, minScaledRange))
		}
		return "[" + scaled + "]"
	})
	return failed
}

// cmpErr keeps the first error.
func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// brokenRule is the alerts' negative control: the rule of alert with its
// metric misspelled, as a rename of the metric in the code, or a typo in
// the rules file, would leave it. It selects nothing and never fires; the
// harness must report the page missed, naming the alert.
type brokenRule struct {
	alert, metric string
}

// breakRule returns the rules file src with b's metric misspelled in b's
// alert, and fails when the file has no such alert or metric.
func breakRule(src []byte, b brokenRule) ([]byte, error) {
	file, err := parseRules(src)
	if err != nil {
		return nil, err
	}
	metric := regexp.MustCompile(`\b` + regexp.QuoteMeta(b.metric) + `\b`)
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			expr, _ := r["expr"].(string)
			if r["alert"] != b.alert || !metric.MatchString(expr) {
				continue
			}
			r["expr"] = metric.ReplaceAllString(expr, b.metric+"_misspelled")
			return yaml.Marshal(file)
		}
	}
	return nil, fmt.Errorf("no alert %s whose expression names %s", b.alert, b.metric)
}
