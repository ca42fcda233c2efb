package stress

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Histograms record nanoseconds from 1ns to 10 minutes with 3 significant digits.
const (
	histMin    = 1
	histMax    = int64(600e9)
	histDigits = 3
)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(histMin, histMax, histDigits) }

func recordNS(h *hdrhistogram.Histogram, ns int64) {
	if ns < histMin {
		ns = histMin
	}
	if ns > histMax {
		ns = histMax
	}
	_ = h.RecordValue(ns)
}

// Percentiles of a latency distribution in microseconds.
type Percentiles struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p999"`
	Max   float64 `json:"max"`
}

func percentiles(h *hdrhistogram.Histogram) Percentiles {
	if h == nil || h.TotalCount() == 0 {
		return Percentiles{}
	}
	us := func(ns int64) float64 { return math.Round(float64(ns)/100) / 10 }
	return Percentiles{
		Count: h.TotalCount(),
		P50:   us(h.ValueAtQuantile(50)),
		P90:   us(h.ValueAtQuantile(90)),
		P99:   us(h.ValueAtQuantile(99)),
		P999:  us(h.ValueAtQuantile(99.9)),
		Max:   us(h.Max()),
	}
}

// Outcomes counts requests by how they ended: each request has exactly
// one outcome, and they add up to Report.Ops. Requests withdrawn when the
// run ended, and those in progress in a worker when --chaos killed it, did
// not end and are in no count.
//
// The sums, exact in every run (TestReportSums): Ops = Granted + Stolen +
// NotAvailable + TimedOut + Errors; Report.Grants = ExclusiveGrants +
// SharedGrants = Granted + Stolen + ReleaseErrors.
type Outcomes struct {
	Granted      int64 `json:"granted"`      // granted and released (or held when its worker was killed)
	Stolen       int64 `json:"stolen"`       // granted, then taken away by a steal (before the requester saw the grant, or before its release)
	NotAvailable int64 `json:"notAvailable"` // IfAvailable, and not available
	TimedOut     int64 `json:"timedOut"`     // its deadline passed while it waited
	Errors       int64 `json:"errors"`       // the request or its release failed (a violation); ReleaseErrors of them after a grant
}

// Fairness compares the requests completed by each process position, and
// the grants obtained by each requesting goroutine.
type Fairness struct {
	Max        int64   `json:"max"`
	Min        int64   `json:"min"`
	Ratio      float64 `json:"ratio"` // max/min (0 when min is 0)
	PerProcess []int64 `json:"perProcess"`
	// Goroutine is the same comparison one level down: grants per
	// requesting goroutine, not only per process.
	Goroutine GoroutineFairness `json:"goroutine"`
}

// GoroutineFairness compares the grants obtained by each requesting
// goroutine: goroutine g of process position p, summed over the workers
// that filled the position (a --chaos replacement continues its victim's
// goroutines).
type GoroutineFairness struct {
	Max    int64     `json:"max"`
	Min    int64     `json:"min"`
	Ratio  float64   `json:"ratio"`  // max/min (0 when min is 0)
	Grants [][]int64 `json:"grants"` // [process position][goroutine]
}

// newGoroutineFairness summarises grants[position][goroutine].
func newGoroutineFairness(grants [][]int64) GoroutineFairness {
	f := GoroutineFairness{Grants: grants}
	first := true
	for _, gs := range grants {
		for _, v := range gs {
			if first {
				f.Min, f.Max, first = v, v, false
			}
			f.Min, f.Max = min(f.Min, v), max(f.Max, v)
		}
	}
	f.Ratio = ratio(f.Max, f.Min)
	return f
}

// maxMinText renders a max/min comparison: "max/min = ratio", or, when
// one of those compared had none, "max/0 (one had none)" (its ratio, 0,
// is no ratio).
func maxMinText(hi, lo int64, r float64) string {
	if lo <= 0 && hi > 0 {
		return fmt.Sprintf("%d/%d (one had none)", hi, lo)
	}
	return fmt.Sprintf("%d/%d = %.2f", hi, lo, r)
}

// ratio is hi/lo rounded to two decimals, 0 when lo is 0.
func ratio(hi, lo int64) float64 {
	if lo <= 0 {
		return 0
	}
	return math.Round(float64(hi)/float64(lo)*100) / 100
}

// FIFO is the FIFO sampling statistic (see the package documentation).
type FIFO struct {
	Samples   int64 `json:"samples"`
	Overtaken int64 `json:"overtaken"`
}

// FeatureReport is what the processes of one feature did and suffered.
type FeatureReport struct {
	Processes int            `json:"processes"`          // process positions
	Requests  int64          `json:"requests"`           // operations made (a Request, an exec wrapper, a Coalesce call, an AcquireAll)
	Grants    int64          `json:"grants"`             // operations that got their lock (exec: commands that checked in; coalesce: results and errors received)
	Children  int64          `json:"children,omitempty"` // child: child grants (fanned-out and nested)
	Stale     int64          `json:"stale,omitempty"`    // child: requests made with the ctx of an ended grant
	Led       int64          `json:"led,omitempty"`      // coalesce: flights whose fn ran
	Followed  int64          `json:"followed,omitempty"` // coalesce: results received from another caller's fn
	Kills     int            `json:"kills"`
	ExecKills map[string]int `json:"execKills,omitempty"` // exec: kills by target (wrapper, command, group)
	// Fairness compares the requests of the feature's process positions:
	// max/min (0 when one made none). Report.Fairness compares all
	// positions, which do different work when the features differ.
	Fairness FeatureFairness `json:"fairness"`
}

// FeatureFairness is Fairness's max/min within one feature.
type FeatureFairness struct {
	Max   int64   `json:"max"`
	Min   int64   `json:"min"`
	Ratio float64 `json:"ratio"` // max/min (0 when min is 0)
}

// Report is the result of one run.
type Report struct {
	Backend           string                   `json:"backend"`
	Seed              uint64                   `json:"seed"`
	Table             string                   `json:"table"`
	TableKept         bool                     `json:"tableKept"`
	Procs             int                      `json:"procs"`
	Goroutines        int                      `json:"goroutines"`
	Names             int                      `json:"names"`
	Hold              string                   `json:"hold"`
	HandOver          bool                     `json:"handOver,omitempty"`      // shmlocks opened with OpenOptions.HandOver
	TableFairness     string                   `json:"tableFairness,omitempty"` // the shmlocks table's manager.Fairness ("fifo", "bounded:1ms")
	Seconds           float64                  `json:"seconds"`
	Ops               int64                    `json:"ops"` // requests that ended: the sum of Outcomes
	OpsPerSec         float64                  `json:"opsPerSec"`
	Outcomes          Outcomes                 `json:"outcomes"`
	OutcomesPerSec    map[string]float64       `json:"outcomesPerSec"`
	Grants            int64                    `json:"grants"`          // every grant: ExclusiveGrants + SharedGrants = Outcomes.Granted + Outcomes.Stolen + ReleaseErrors
	ExclusiveGrants   int64                    `json:"exclusiveGrants"` // grants in exclusive mode (a Coalesce result counts as one: its flight ran under an exclusive lock)
	SharedGrants      int64                    `json:"sharedGrants"`
	ReleaseErrors     int64                    `json:"releaseErrors"` // grants whose release failed (in Outcomes.Errors)
	Steals            int64                    `json:"steals"`        // of Grants, those obtained by stealing (a steal of a free lock takes nothing; one of a shared lock may take several)
	Violations        int                      `json:"violations"`
	ViolationMessages []string                 `json:"violationMessages"`
	Errors            []string                 `json:"errorMessages"`
	Kills             int                      `json:"kills"`                      // processes SIGKILLed by --chaos (workers, exec wrappers and commands)
	Features          map[string]FeatureReport `json:"features,omitempty"`         // per feature (with Config.Features)
	ViolationsByKind  map[string]int           `json:"violationsByKind,omitempty"` // per kind (with Config.Features)
	ReapUs            Percentiles              `json:"reapUs"`                     // from the kill of a worker holding an exclusive lock to the name's next grant (count: kills so timed)
	AcquireWaitUs     Percentiles              `json:"acquireWaitUs"`
	AcquireWaitByMode map[string]Percentiles   `json:"acquireWaitUsByMode"`
	HandoffUs         Percentiles              `json:"handoffUs"`
	HandoffByMode     map[string]Percentiles   `json:"handoffUsByMode"`
	Fairness          Fairness                 `json:"fairness"`
	FIFO              FIFO                     `json:"fifo"`
	Notes             []string                 `json:"notes"`
}

// OK reports whether the run found no violation.
func (r *Report) OK() bool { return r.Violations == 0 }

// reportLegend says what the counters of the text report count.
const reportLegend = `
Each request has one outcome: requests = granted and released + granted,
then stolen + not available + timed out + errors. Requests withdrawn when
the run ended, and those in progress in a worker when --chaos killed it,
are not counted. Each grant is counted once: grants = exclusive + shared =
granted and released + granted, then stolen + release errors (of the
errors). "granted, then stolen" are grants a steal (by stealing) took
away, before or after the requester saw them: a steal of a free lock
takes nothing, one of a shared lock may take several holders. A Coalesce
result counts as an exclusive grant (its flight's lock). "reap" times, for
each kill of a worker that held an exclusive lock, the kill to the next
grant of its name; its count is the kills so timed, of all the processes
killed.
`

// WriteText prints reports side by side, one column per backend.
func WriteText(w io.Writer, reps []*Report) error {
	if len(reps) == 0 {
		return nil
	}
	r0 := reps[0]
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d procs x %d goroutines on %d names, hold %s", r0.Seed, r0.Procs, r0.Goroutines, r0.Names, r0.Hold)
	if r0.HandOver {
		b.WriteString(", shmlocks with HandOver")
	}
	for _, r := range reps {
		if r.TableFairness != "" {
			fmt.Fprintf(&b, ", shmlocks table %s", r.TableFairness)
		}
	}
	b.WriteString("\n")
	for _, r := range reps {
		kept := "removed"
		if r.TableKept {
			kept = "kept"
		}
		fmt.Fprintf(&b, "%s: %s (%s)\n", r.Backend, r.Table, kept)
	}
	b.WriteString("\n")
	// Labels left-aligned (sub-items indented), values right-aligned.
	var rows [][]string
	row := func(label string, f func(r *Report) string) {
		cells := []string{label}
		for _, r := range reps {
			cells = append(cells, f(r))
		}
		rows = append(rows, cells)
	}
	i64 := func(v int64) string { return fmt.Sprint(v) }
	f0 := func(v float64) string { return fmt.Sprintf("%.0f", v) }
	row("", func(r *Report) string { return r.Backend })
	row("seconds", func(r *Report) string { return fmt.Sprintf("%.2f", r.Seconds) })
	row("requests (by outcome below)", func(r *Report) string { return i64(r.Ops) })
	row("  granted and released", func(r *Report) string { return i64(r.Outcomes.Granted) })
	row("  granted, then stolen", func(r *Report) string { return i64(r.Outcomes.Stolen) })
	row("  not available", func(r *Report) string { return i64(r.Outcomes.NotAvailable) })
	row("  timed out", func(r *Report) string { return i64(r.Outcomes.TimedOut) })
	row("  errors", func(r *Report) string { return i64(r.Outcomes.Errors) })
	row("    of them release errors", func(r *Report) string { return i64(r.ReleaseErrors) })
	row("requests/s", func(r *Report) string { return f0(r.OpsPerSec) })
	row("grants (by mode below)", func(r *Report) string { return i64(r.Grants) })
	row("  exclusive", func(r *Report) string { return i64(r.ExclusiveGrants) })
	row("  shared", func(r *Report) string { return i64(r.SharedGrants) })
	row("of the grants, by stealing", func(r *Report) string { return i64(r.Steals) })
	row("grants/s", func(r *Report) string { return f0(float64(r.Grants) / math.Max(r.Seconds, 1e-9)) })
	row("processes killed (--chaos)", func(r *Report) string { return fmt.Sprint(r.Kills) })
	row("fairness max/min", func(r *Report) string {
		if len(r.Features) > 1 {
			return "per feature (features)"
		}
		return maxMinText(r.Fairness.Max, r.Fairness.Min, r.Fairness.Ratio)
	})
	row("fairness per goroutine (grants) max/min", func(r *Report) string {
		if len(r.Features) > 1 {
			return "per feature (features)"
		}
		g := r.Fairness.Goroutine
		return maxMinText(g.Max, g.Min, g.Ratio)
	})
	row("FIFO overtaken/sampled", func(r *Report) string { return fmt.Sprintf("%d/%d", r.FIFO.Overtaken, r.FIFO.Samples) })
	row("violations", func(r *Report) string { return fmt.Sprint(r.Violations) })
	widths := make([]int, len(reps)+1)
	for _, cells := range rows {
		for i, c := range cells {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	for _, cells := range rows {
		line := fmt.Sprintf("%-*s", widths[0], cells[0])
		for i, c := range cells[1:] {
			line += fmt.Sprintf("  %*s", widths[i+1], c)
		}
		b.WriteString(strings.TrimRight(line, " ") + "\n")
	}

	for _, r := range reps {
		writeFeatures(&b, r, len(reps) > 1)
	}

	b.WriteString("\nlatency (µs)\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\t\tcount\tp50\tp90\tp99\tp99.9\tmax\t")
	lat := func(label string, f func(r *Report) Percentiles) {
		for _, r := range reps {
			p := f(r)
			name := label
			if len(reps) > 1 {
				name += " [" + r.Backend + "]"
			}
			fmt.Fprintf(tw, "%s\t\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", name, p.Count, p.P50, p.P90, p.P99, p.P999, p.Max)
		}
	}
	lat("acquire wait, exclusive", func(r *Report) Percentiles { return r.AcquireWaitByMode["exclusive"] })
	lat("acquire wait, shared", func(r *Report) Percentiles { return r.AcquireWaitByMode["shared"] })
	lat("acquire wait, all", func(r *Report) Percentiles { return r.AcquireWaitUs })
	lat("handoff, exclusive", func(r *Report) Percentiles { return r.HandoffByMode["exclusive"] })
	lat("handoff, shared", func(r *Report) Percentiles { return r.HandoffByMode["shared"] })
	lat("handoff, all", func(r *Report) Percentiles { return r.HandoffUs })
	lat("reap (kill to next grant)", func(r *Report) Percentiles { return r.ReapUs })
	tw.Flush()
	b.WriteString(reportLegend)

	for _, r := range reps {
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "note (%s): %s\n", r.Backend, n)
		}
	}
	for _, r := range reps {
		if r.Violations == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s: %d VIOLATIONS\n", r.Backend, r.Violations)
		for _, m := range r.ViolationMessages {
			fmt.Fprintf(&b, "  %s\n", m)
		}
		if r.Violations > len(r.ViolationMessages) {
			fmt.Fprintf(&b, "  ... (%d more)\n", r.Violations-len(r.ViolationMessages))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeFeatures prints the per-feature table and the violations per kind
// of a run with features.
func writeFeatures(b *strings.Builder, r *Report, label bool) {
	if len(r.Features) == 0 {
		return
	}
	b.WriteString("\nfeatures")
	if label {
		b.WriteString(" [" + r.Backend + "]")
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tprocesses\trequests\tgrants\tkills\tmax/min\t\t")
	for _, f := range AllFeatures {
		fr, ok := r.Features[f]
		if !ok {
			continue
		}
		var more []string
		switch f {
		case FeatureExec:
			more = append(more, fmt.Sprintf("commands run; kills: wrapper %d, command %d, group %d",
				fr.ExecKills["wrapper"], fr.ExecKills["command"], fr.ExecKills["group"]))
		case FeatureChild:
			more = append(more, fmt.Sprintf("child grants %d, requests through an ended grant's ctx %d", fr.Children, fr.Stale))
		case FeatureCoalesce:
			more = append(more, fmt.Sprintf("flights led %d, results followed %d", fr.Led, fr.Followed))
		case FeatureAll:
			more = append(more, "sets of names")
		}
		fair := "-" // one process: nothing to compare
		if fr.Processes > 1 {
			fair = fmt.Sprintf("%.2f", fr.Fairness.Ratio)
			if fr.Fairness.Min <= 0 && fr.Fairness.Max > 0 {
				fair = "one had none"
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t\t%s\n", f, fr.Processes, fr.Requests, fr.Grants, fr.Kills, fair, strings.Join(more, "; "))
	}
	tw.Flush()
	b.WriteString("violations by kind:")
	for k := 0; k < numKinds; k++ {
		fmt.Fprintf(b, " %s %d", kindNames[k], r.ViolationsByKind[kindNames[k]])
		if k < numKinds-1 {
			b.WriteString(",")
		}
	}
	b.WriteString("\n")
}
