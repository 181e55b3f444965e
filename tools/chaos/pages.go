package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// page is an alert a scenario's fault must fire, within a bound from the
// fault's start, and that must resolve once the fault has healed. A page
// marked long is required in the long mode only: in the short mode the
// fault lasts 5 s, 5 minutes of the rules' clock, as long as the
// shortest for of a rate alert, and it may or may not fire.
type page struct {
	alert  string
	within time.Duration
	long   bool
}

// alertSpec is what a scenario declares of the operator's view: the pages
// its fault must fire, the alerts it may also fire (symptoms of the same
// fault), and, for the negative control of losses only, that its alerts
// are shown and not judged. Anything else that fires is a false page.
// broken makes the scenario the alerts' negative control: its one page's
// rule is broken on purpose, and it passes only when the harness reports
// that page missed.
type alertSpec struct {
	pages     []page
	tolerates []string
	unjudged  bool
	broken    *brokenRule
}

// inMode is the spec as the mode judges it: in the short mode, a page
// required in the long mode only is tolerated.
func (a alertSpec) inMode(long bool) alertSpec {
	if long {
		return a
	}
	out := a
	out.pages, out.tolerates = nil, slices.Clone(a.tolerates)
	for _, p := range a.pages {
		if p.long {
			out.tolerates = append(out.tolerates, p.alert)
		} else {
			out.pages = append(out.pages, p)
		}
	}
	return out
}

// resolveWait bounds how long after the check the harness waits for
// every alert to resolve: the longest scaled window of the rules (1h:
// 60 s) and Alertmanager's notification.
const resolveWait = 75 * time.Second

// alertOutcome is what the monitor saw of one scenario.
type alertOutcome struct {
	spec alertSpec
	// fired is every alert that fired, with its time to fire from the
	// fault's start (negative: before the fault began).
	fired map[string]time.Duration
	// resolved: fired and resolved before the monitor stopped.
	resolved map[string]bool
	// missed: a page that did not fire within its bound, with why.
	missed []string
	// unexpected: fired, neither a page nor tolerated, or fired before
	// the fault: a false page.
	unexpected []string
	// unresolved: a page that fired and never resolved.
	unresolved []string
	err        error
}

// judgeAlerts compares what fired with what the scenario declares.
func judgeAlerts(spec alertSpec, seen map[string]alertSeen, faultStart time.Time) alertOutcome {
	out := alertOutcome{spec: spec, fired: map[string]time.Duration{}, resolved: map[string]bool{}}
	for name, s := range seen {
		out.fired[name] = s.firstFired.Sub(faultStart)
		out.resolved[name] = len(s.firing) == 0
	}
	if spec.unjudged {
		return out
	}
	paged := map[string]bool{}
	for _, p := range spec.pages {
		paged[p.alert] = true
		after, fired := out.fired[p.alert]
		switch {
		case !fired:
			out.missed = append(out.missed, fmt.Sprintf("%s did not fire (bound %s from the fault's start)", p.alert, p.within))
		case after > p.within:
			out.missed = append(out.missed, fmt.Sprintf("%s fired %s after the fault's start, past its bound of %s", p.alert, after.Round(100*time.Millisecond), p.within))
		case !out.resolved[p.alert]:
			out.unresolved = append(out.unresolved, p.alert)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(out.fired)) {
		switch {
		case out.fired[name] < 0:
			out.unexpected = append(out.unexpected, name+" (fired before the fault)")
		case !paged[name] && !slices.Contains(spec.tolerates, name):
			out.unexpected = append(out.unexpected, name)
		}
	}
	return out
}

// passed: every page fired in time and resolved, and nothing else paged;
// for the alerts' negative control, the broken rule's page reported
// missed, and nothing else amiss.
func (a alertOutcome) passed() bool {
	if a.spec.broken != nil {
		return a.err == nil && a.caughtBroken() && len(a.unexpected) == 0 && len(a.unresolved) == 0
	}
	return a.err == nil && len(a.missed) == 0 && len(a.unexpected) == 0 && len(a.unresolved) == 0
}

// caughtBroken: the one missed page is the broken rule's, by name.
func (a alertOutcome) caughtBroken() bool {
	return len(a.missed) == 1 && strings.HasPrefix(a.missed[0], a.spec.broken.alert+" ")
}

func (a alertOutcome) firedPages() int {
	n := 0
	for _, p := range a.spec.pages {
		if after, ok := a.fired[p.alert]; ok && after >= 0 && after <= p.within {
			n++
		}
	}
	return n
}

// describe is the scenario's alerts line: each page with its time to
// fire and whether it resolved, then what else fired.
func (a alertOutcome) describe() string {
	var parts []string
	for _, p := range a.spec.pages {
		parts = append(parts, a.describeOne(p.alert, fmt.Sprintf("page ≤%s", p.within)))
	}
	for _, name := range slices.Sorted(maps.Keys(a.fired)) {
		if slices.ContainsFunc(a.spec.pages, func(p page) bool { return p.alert == name }) {
			continue
		}
		kind := "unexpected"
		switch {
		case a.spec.unjudged:
			kind = "not judged"
		case slices.Contains(a.spec.tolerates, name) && a.fired[name] >= 0:
			kind = "tolerated"
		}
		parts = append(parts, a.describeOne(name, kind))
	}
	if len(parts) == 0 {
		return "none expected, none fired"
	}
	return strings.Join(parts, "; ")
}

func (a alertOutcome) describeOne(name, kind string) string {
	after, ok := a.fired[name]
	if !ok {
		return fmt.Sprintf("%s (%s): not fired", name, kind)
	}
	state := "resolved"
	if !a.resolved[name] {
		state = "still firing"
	}
	return fmt.Sprintf("%s (%s): fired %+.1fs, %s", name, kind, after.Seconds(), state)
}

func printAlerts(w io.Writer, a alertOutcome) {
	fmt.Fprintln(w, "  alerts:", a.describe())
	if a.err != nil {
		fmt.Fprintln(w, "  alerts error:", a.err)
	}
	for _, m := range a.missed {
		fmt.Fprintln(w, "  missed page:", m)
	}
	for _, u := range a.unexpected {
		fmt.Fprintln(w, "  false page:", u)
	}
	for _, u := range a.unresolved {
		fmt.Fprintf(w, "  unresolved page: %s still fired %s after the fault healed\n", u, resolveWait)
	}
}

// alertTotals are the summary's alert counts.
type alertTotals struct{ expected, fired, missed, falsePages int }

func (t *alertTotals) add(a alertOutcome) {
	if a.spec.unjudged || a.spec.broken != nil {
		return
	}
	t.expected += len(a.spec.pages)
	t.fired += a.firedPages()
	t.missed += len(a.missed)
	t.falsePages += len(a.unexpected)
}

// printAlertTable is the summary's second table: per scenario, the pages
// expected, those fired with their time to fire, those resolved, and the
// false pages.
func printAlertTable(w io.Writer, outcomes []outcome) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\texpected\tfired (s from fault start)\tresolved\tunexpected\t")
	for _, o := range outcomes {
		a := o.alerts
		var expected, fired, resolved []string
		for _, p := range a.spec.pages {
			expected = append(expected, p.alert)
		}
		for _, name := range slices.Sorted(maps.Keys(a.fired)) {
			fired = append(fired, fmt.Sprintf("%s %+.1f", name, a.fired[name].Seconds()))
			if a.resolved[name] {
				resolved = append(resolved, name)
			}
		}
		unexpected := strings.Join(a.unexpected, ", ")
		if a.spec.unjudged {
			unexpected = "(not judged)"
		}
		fmt.Fprintf(tw, "%s %s\t%s\t%s\t%s\t%s\t\n", o.s.id, o.s.name, orNone(expected), orNone(fired), orNone(resolved), orDash(unexpected))
	}
	_ = tw.Flush()
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ", ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
