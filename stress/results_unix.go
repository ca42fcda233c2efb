//go:build unix

package stress

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"github.com/shmlocks/shmlocks/manager"
)

// The supervisor's results: the workers' counters, checkers and histograms
// merged into one Report, and the table's own checker at the end.

// report runs the final checks and assembles the report.
func (s *supervisor) report(elapsed time.Duration, all []*worker) *Report {
	cfg, r := s.cfg, s.r
	rep := &Report{
		Backend: cfg.Backend, Seed: cfg.Seed, Table: s.table, Procs: cfg.Procs, Goroutines: cfg.Goroutines, HandOver: cfg.HandOver && cfg.Backend == BackendShmlocks,
		TableFairness: s.fair,
		Names:         cfg.Names, Hold: cfg.Hold.String(), Seconds: elapsed.Seconds(), Kills: int(r.kills()),
		ViolationMessages: []string{}, Errors: []string{}, Notes: []string{},
	}
	sec := math.Max(elapsed.Seconds(), 1e-9)

	// Counters, from the region (they include the killed workers).
	perPos := make([]int64, cfg.Procs)
	perG := make([][]int64, cfg.Procs)
	for p := range perG {
		perG[p] = make([]int64, cfg.Goroutines)
	}
	var samples, overtaken int64
	for _, w := range all {
		sl := w.slot
		st := func(f int) int64 { return int64(r.stat(sl, f)) }
		// Each count is defined once (Report): a grant is counted once,
		// by mode (Region.countGrant), and each request has one outcome:
		// a grant stolen (before it was seen or at its release) counts as
		// stolen, one whose release failed as an error, the others as
		// granted. So grants = exclusive + shared = granted + stolen +
		// release errors, whatever the kills.
		rep.ExclusiveGrants += st(slExclusive)
		rep.SharedGrants += st(slShared)
		rep.ReleaseErrors += st(slRelErrors)
		rep.Outcomes.NotAvailable += st(slNotAvail)
		rep.Outcomes.TimedOut += st(slTimedOut)
		rep.Outcomes.Stolen += st(slStolen)
		rep.Outcomes.Errors += st(slErrors)
		rep.Steals += st(slSteals)
		samples += st(slFIFOSamp)
		overtaken += st(slFIFOOver)
		perPos[w.pos] += st(slOps)
		for g := range perG[w.pos] {
			perG[w.pos][g] += int64(r.grants(sl, g))
		}
	}
	rep.Grants = rep.ExclusiveGrants + rep.SharedGrants
	rep.Outcomes.Granted = rep.Grants - rep.Outcomes.Stolen - rep.ReleaseErrors
	// Requests are counted by their outcomes, so that they add up even
	// when a worker was killed between two of its counters.
	o := rep.Outcomes
	rep.Ops = o.Granted + o.Stolen + o.NotAvailable + o.TimedOut + o.Errors
	rep.OpsPerSec = float64(rep.Ops) / sec
	rep.OutcomesPerSec = map[string]float64{
		"granted":      float64(rep.Outcomes.Granted) / sec,
		"notAvailable": float64(rep.Outcomes.NotAvailable) / sec,
		"timedOut":     float64(rep.Outcomes.TimedOut) / sec,
		"stolen":       float64(rep.Outcomes.Stolen) / sec,
		"errors":       float64(rep.Outcomes.Errors) / sec,
	}
	rep.FIFO = FIFO{Samples: samples, Overtaken: overtaken}
	rep.Fairness.PerProcess = perPos
	rep.Fairness.Min, rep.Fairness.Max = perPos[0], perPos[0]
	for _, v := range perPos {
		rep.Fairness.Min = min(rep.Fairness.Min, v)
		rep.Fairness.Max = max(rep.Fairness.Max, v)
	}
	rep.Fairness.Ratio = ratio(rep.Fairness.Max, rep.Fairness.Min)
	rep.Fairness.Goroutine = newGoroutineFairness(perG)
	s.featureReport(rep, all)

	// Histograms from the workers' result files (a killed worker's file is
	// its last periodic flush).
	hists := map[string]*hdrhistogram.Histogram{}
	for _, k := range []string{histWaitExclusive, histWaitShared, histHandoffExclusive, histHandoffShared} {
		hists[k] = newHist()
	}
	partial, missing := 0, 0
	for _, w := range all {
		b, err := os.ReadFile(s.resultFile(w.slot))
		if err != nil {
			missing++
			if !w.killed && w.err == nil {
				s.failures = append(s.failures, fmt.Sprintf("worker pid %d left no result: %v", w.cmd.Process.Pid, err))
			}
			continue
		}
		if w.killed || w.err != nil {
			partial++
		}
		var res workerResult
		if err := json.Unmarshal(b, &res); err != nil {
			s.failures = append(s.failures, fmt.Sprintf("worker pid %d: unreadable result: %v", w.cmd.Process.Pid, err))
			continue
		}
		for k, enc := range res.Hist {
			h, err := hdrhistogram.Decode([]byte(enc))
			if err != nil || hists[k] == nil {
				s.failures = append(s.failures, fmt.Sprintf("worker pid %d: bad histogram %s: %v", w.cmd.Process.Pid, k, err))
				continue
			}
			hists[k].Merge(h)
		}
		for _, e := range res.Errors {
			if len(rep.Errors) < 16 {
				rep.Errors = append(rep.Errors, fmt.Sprintf("pid %d: %s", w.cmd.Process.Pid, e))
			}
		}
	}
	if partial+missing > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("latency histograms of %d killed workers end at their last flush (every %v); %d left none",
			partial+missing, resultEvery, missing))
	}
	waitAll, handAll := newHist(), newHist()
	waitAll.Merge(hists[histWaitExclusive])
	waitAll.Merge(hists[histWaitShared])
	handAll.Merge(hists[histHandoffExclusive])
	handAll.Merge(hists[histHandoffShared])
	rep.AcquireWaitUs = percentiles(waitAll)
	rep.HandoffUs = percentiles(handAll)
	rep.AcquireWaitByMode = map[string]Percentiles{"exclusive": percentiles(hists[histWaitExclusive]), "shared": percentiles(hists[histWaitShared])}
	rep.HandoffByMode = map[string]Percentiles{"exclusive": percentiles(hists[histHandoffExclusive]), "shared": percentiles(hists[histHandoffShared])}
	rep.ReapUs = percentiles(s.reap)
	if s.noSlots {
		rep.Notes = append(rep.Notes, "chaos paused: the check region ran out of worker slots")
	}

	// The exclusive-section counter of every name: each exclusive grant
	// added one, except those fenced off after a steal. A worker killed inside
	// its section may not have written, and a stolen-from holder preempted
	// between its fence check and its write may overwrite one increment, so
	// the counter may fall short by up to kills + steals, never exceed.
	var deficit, grants int64
	for n := 0; n < 2*cfg.Names; n++ { // the lock names, then the Coalesce keys
		count := uint32(loadU64(r.nu64(n, nmCounter)))
		want := uint32(loadU64(r.nu64(n, nmGrantsX)) - loadU64(r.nu64(n, nmFenced)))
		d := int64(int32(want - count))
		grants += int64(loadU64(r.nu64(n, nmGrantsX)))
		if d < 0 {
			r.violation(kindCounter, fmt.Sprintf("counter of %s is %d, above its %d unfenced exclusive sections", r.label(n), count, want))
		}
		if d > 0 {
			deficit += d
		}
	}
	// A worker that died on its own (a violation of its own) counts as a kill.
	if tol := int64(rep.Kills+s.failed) + rep.Steals; deficit > tol {
		r.violation(kindCounter, fmt.Sprintf("lost updates: the exclusive-section counters fall %d short of %d exclusive grants (tolerance %d = kills + failed workers + steals)",
			deficit, grants, tol))
	} else if deficit > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("counters fall %d short (within the tolerance of %d kills + %d failed workers + %d steals)", deficit, rep.Kills, s.failed, rep.Steals))
	}

	// The table (or the lock files) must be consistent and empty.
	switch cfg.Backend {
	case BackendShmlocks:
		s.checkTable(rep)
	case BackendFlock:
		if err := flockFree(s.lockDir, cfg.Names); err != nil {
			r.violation(kindTable, err.Error())
		}
	default:
		if p, ok := plugin(cfg.Backend); ok && p.Empty != nil {
			if err := p.Empty(cfg.Target); err != nil {
				r.violation(kindTable, fmt.Sprintf("%s after the run: %v", cfg.Backend, err))
			}
		}
	}
	for _, f := range s.failures {
		r.violation(kindFailure, f)
	}
	// A request that failed with an unexpected error was reported as a
	// violation by its worker when it happened (gstats.addErr).
	rep.Violations, rep.ViolationMessages = r.Violations()
	if len(cfg.Features) > 0 {
		rep.ViolationsByKind = map[string]int{}
		for k := 0; k < numKinds; k++ {
			rep.ViolationsByKind[kindNames[k]] = r.kindCount(k)
		}
	}
	if rep.ViolationMessages == nil {
		rep.ViolationMessages = []string{}
	}
	return rep
}

// checkTable runs the table's consistency checker and verifies that the
// table is empty once every worker is gone.
func (s *supervisor) checkTable(rep *Report) {
	r := s.r
	m, err := manager.Open(s.table, nil)
	if err != nil {
		r.violation(kindTable, "final check: "+err.Error())
		return
	}
	defer m.Close()
	if err := m.Check(); err != nil {
		r.violation(kindTable, "table consistency check: "+err.Error())
	}
	if slices.Contains(s.cfg.Features, FeatureCoalesce) {
		if err := coalesceCheck(m); err != nil {
			r.violation(kindTable, "Coalesce outcome store: "+err.Error())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	snap, err := m.Query(ctx)
	if err != nil {
		r.violation(kindTable, "final query: "+err.Error())
		return
	}
	left := append(snap.Held, snap.Pending...)
	if len(left) == 0 {
		return
	}
	sort.Slice(left, func(i, j int) bool { return left[i].Name < left[j].Name })
	var b strings.Builder
	for i, li := range left {
		if i == 8 {
			fmt.Fprintf(&b, " ...")
			break
		}
		fmt.Fprintf(&b, " %s %s pid %d;", li.Name, li.Mode, li.PID)
	}
	r.violation(kindTable, fmt.Sprintf("%d requests left in the table after every worker exited (dead workers must have been reaped):%s", len(left), b.String()))
}

// featureReport fills the per-feature part of the report.
func (s *supervisor) featureReport(rep *Report, all []*worker) {
	cfg, r := s.cfg, s.r
	if len(cfg.Features) == 0 {
		return
	}
	rep.Features = map[string]FeatureReport{}
	for p := 0; p < cfg.Procs; p++ {
		f := s.role(p)
		fr := rep.Features[f]
		fr.Processes++
		rep.Features[f] = fr
	}
	for _, w := range all {
		f := s.role(w.pos)
		fr := rep.Features[f]
		st := func(field int) int64 { return int64(r.stat(w.slot, field)) }
		fr.Requests += st(slOps)
		switch f {
		case FeaturePlain:
			fr.Grants += int64(r.granted(w.slot))
		case FeatureExec:
			fr.Grants += st(slExecRuns)
		case FeatureChild:
			fr.Grants += int64(r.granted(w.slot))
			fr.Children += st(slChild)
			fr.Stale += st(slStale)
		case FeatureCoalesce:
			fr.Grants += int64(r.granted(w.slot))
			fr.Led += st(slLed)
			fr.Followed += st(slFollowed)
		case FeatureAll:
			fr.Grants += st(slSets)
		}
		rep.Features[f] = fr
	}
	first := map[string]bool{}
	for p, n := range rep.Fairness.PerProcess {
		f := s.role(p)
		fr := rep.Features[f]
		if !first[f] {
			fr.Fairness.Max, fr.Fairness.Min, first[f] = n, n, true
		}
		fr.Fairness.Max, fr.Fairness.Min = max(fr.Fairness.Max, n), min(fr.Fairness.Min, n)
		fr.Fairness.Ratio = ratio(fr.Fairness.Max, fr.Fairness.Min)
		rep.Features[f] = fr
	}
	for f, fr := range rep.Features {
		fr.Kills = r.featureKills(featureIndex(f))
		if f == FeatureExec {
			fr.ExecKills = map[string]int{}
			for t := execKillWrapper; t <= execKillGroup; t++ {
				fr.ExecKills[execKillNames[t]] = r.execKills(t)
			}
		}
		rep.Features[f] = fr
	}
}
