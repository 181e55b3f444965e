package main

import (
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// csvPath is the CSV written beside the plot at path: the same name,
// .csv for its extension.
func csvPath(path string) string {
	return strings.TrimSuffix(path, filepath.Ext(path)) + ".csv"
}

// writeSoakOutputs draws rows into the PNG at path and writes them as CSV
// beside it.
func writeSoakOutputs(path string, rows []soakRow, started time.Time, o options) error {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if err := writeSoakCSV(csvPath(path), rows); err != nil {
		return err
	}
	return writeSoakPlot(path, rows, started, o)
}

func writeSoakCSV(path string, rows []soakRow) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write(soakColumns)
	for _, r := range rows {
		_ = w.Write(r.cells())
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// soakLine is one line of a panel: its legend and its value in a row.
type soakLine struct {
	name  string
	value func(soakRow) float64
}

// soakPanel is one panel of the plot.
type soakPanel struct {
	title, unit string
	lines       []soakLine
}

func soakPanels(rows []soakRow, limit time.Duration) []soakPanel {
	kinds := func(f func(soakRow, requestKind) float64, all func(soakRow) float64) []soakLine {
		l := []soakLine{{"all", all}}
		for k := range requestKinds {
			l = append(l, soakLine{requestKindNames[k], func(r soakRow) float64 { return f(r, k) }})
		}
		return l
	}
	autovacuums := int64(0)
	if len(rows) > 0 {
		autovacuums = rows[len(rows)-1].autovacuums
	}
	return []soakPanel{
		{"throughput", "requests/s", kinds(func(r soakRow, k requestKind) float64 { return r.rps[k] }, func(r soakRow) float64 { return r.total })},
		{"p99 latency", "ms", kinds(func(r soakRow, k requestKind) float64 { return r.p99[k] }, func(r soakRow) float64 { return r.p99All })},
		{"idempotency_keys size", "MB", []soakLine{
			{"heap + indexes", func(r soakRow) float64 { return megabytes(r.size()) }},
			{"heap", func(r soakRow) float64 { return megabytes(r.heap) }},
			{"indexes", func(r soakRow) float64 { return megabytes(r.indexes) }},
		}},
		{fmt.Sprintf("idempotency_keys tuples (%d autovacuums in the run)", autovacuums), "thousands", []soakLine{
			{"live", func(r soakRow) float64 { return float64(r.live) / 1000 }},
			{"dead", func(r soakRow) float64 { return float64(r.dead) / 1000 }},
		}},
		{fmt.Sprintf("reaper lag (limit %.1f s)", limit.Seconds()), "s", []soakLine{
			{"prune", func(r soakRow) float64 { return r.pruneLag }},
			{"delete", func(r soakRow) float64 { return r.deleteLag }},
		}},
		{"WAL per create executed (all the WAL written)", "bytes", []soakLine{
			{"WAL / create", func(r soakRow) float64 { return r.walPerCreate }},
		}},
	}
}

// writeSoakPlot draws the panels of rows, stacked, into the PNG at path.
func writeSoakPlot(path string, rows []soakRow, started time.Time, o options) error {
	ttl, retention, interval := soakScaled(soakFactor)
	panels := soakPanels(rows, lagIntervals*interval+o.soakInterval)
	grid := make([][]*plot.Plot, len(panels))
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.title
		if i == 0 {
			p.Title.Text = fmt.Sprintf("soak of %s, %s; horizons ÷%d (TTL %s, retention %s), %s\n%s",
				o.soak, started.Format("2006-01-02"), soakFactor, ttl, retention, soakLoadText(o, false), pn.title)
		}
		p.X.Label.Text = "minutes"
		p.Y.Label.Text = pn.unit
		p.X.Min, p.Y.Min = 0, 0
		p.Legend.Top = true
		var args []any
		for _, l := range pn.lines {
			xy := make(plotter.XYs, len(rows))
			for j, r := range rows {
				xy[j] = plotter.XY{X: r.end.Minutes(), Y: l.value(r)}
			}
			args = append(args, l.name, xy)
		}
		if err := plotutil.AddLines(p, args...); err != nil {
			return err
		}
		grid[i] = []*plot.Plot{p}
	}
	img := vgimg.NewWith(vgimg.UseWH(8*vg.Inch, vg.Length(len(panels))*2.6*vg.Inch), vgimg.UseDPI(80))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6),
		PadLeft: vg.Points(6), PadRight: vg.Points(10), PadY: vg.Points(14)}
	for i, c := range plot.Align(grid, tiles, dc) {
		grid[i][0].Draw(c[0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
