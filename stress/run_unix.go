//go:build unix

package stress

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/shmlocks/shmlocks/manager"
)

// Supported reports whether stress runs on this OS.
const Supported = true

// maxRegionBytes bounds the check region (it sizes the slots for replacements).
const maxRegionBytes = 64 << 20

// worker is one worker process as the supervisor sees it.
type worker struct {
	slot, pos int
	cmd       *exec.Cmd
	killed    bool
	done      chan struct{}
	err       error // from Wait
}

type supervisor struct {
	cfg     Config
	stderr  io.Writer
	r       *Region
	region  string
	table   string
	dir     string // temporary directory: result files (and the default table)
	lockDir string
	start   time.Time

	mu        sync.Mutex
	nextSlot  int
	current   []*worker // per position
	all       []*worker
	posDone   []bool
	posFailed []string
	kills     int
	noSlots   bool
	reap      *hdrhistogram.Histogram
	stuckSeen map[[3]uint64]bool
	failures  []string
	allDone   chan struct{}
	closed    bool
}

// Run performs one stress run and returns its report. It returns an error
// only when the run could not be carried out (the report's Violations say
// whether the lock misbehaved). stderr receives the workers' diagnostics.
func Run(cfg Config, stderr io.Writer) (*Report, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Seed == 0 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		cfg.Seed = binary.LittleEndian.Uint64(b[:]) >> 1
		if cfg.Seed == 0 {
			cfg.Seed = 1
		}
	}
	switch stderr.(type) {
	case nil:
		stderr = io.Discard
	case *os.File: // the workers inherit it
	default: // the workers' output is copied by one goroutine each
		stderr = &lockedWriter{w: stderr}
	}
	dir, err := os.MkdirTemp("", "shmlocks-stress-")
	if err != nil {
		return nil, err
	}
	s := &supervisor{cfg: cfg, stderr: stderr, reap: newHist(), stuckSeen: map[[3]uint64]bool{}, allDone: make(chan struct{})}
	s.dir = dir
	s.table = cfg.Table
	if s.table == "" {
		s.table = filepath.Join(dir, "stress.tbl")
	}
	s.region = s.table + ".check"
	s.lockDir = filepath.Join(dir, "flock")
	if cfg.Backend == BackendFlock {
		s.table = s.lockDir
		s.region = filepath.Join(dir, "stress.check")
		if err := os.Mkdir(s.lockDir, 0o700); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if _, ok := plugin(cfg.Backend); ok {
		s.table = cfg.Target // what the report names; the check file stays in dir
	}

	// Slots: one per process position plus room for the replacements of
	// chaos victims.
	extra := 0
	if cfg.Chaos > 0 {
		if cfg.Ops == 0 {
			extra = int(math.Ceil(cfg.Chaos*cfg.Duration.Seconds()*2)) + 16
		} else {
			extra = 4096
		}
	}
	stride := slotHdr + cfg.Goroutines*recSize
	if limit := (maxRegionBytes-hdrSize-cfg.Names*nameSize)/stride - cfg.Procs; extra > limit {
		extra = max(limit, 0)
	}
	slots := cfg.Procs + extra
	mp, err := createRegionFile(s.region, RegionSize(cfg.Names, slots, cfg.Goroutines))
	if err != nil {
		os.RemoveAll(dir)
		if errors.Is(err, os.ErrExist) {
			err = fmt.Errorf("check file %s exists (kept by an earlier run, or another run uses this table): remove it or use another --table", s.region)
		}
		return nil, err
	}
	defer mp.close()
	if s.r, err = InitRegion(mp.buf, cfg.Names, slots, cfg.Goroutines); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if cfg.Backend == BackendShmlocks {
		m, err := manager.Open(s.table, nil) // create it once, with the defaults
		if err != nil {
			os.RemoveAll(dir)
			os.Remove(s.region)
			return nil, err
		}
		m.Close()
	}

	rep := s.run()

	// Keep everything when something went wrong (or when asked). A table
	// given with --table is never removed (its check file is).
	keep := cfg.Keep || rep.Violations > 0
	rep.TableKept = keep || (cfg.Table != "" && cfg.Backend == BackendShmlocks)
	if !keep {
		os.Remove(s.region)
		os.RemoveAll(dir)
	} else {
		rep.Notes = append(rep.Notes, "kept for inspection: "+s.table+" and the check file "+s.region)
	}
	return rep, nil
}

func (s *supervisor) workerConfig(slot, ops int) workerConfig {
	c := s.cfg
	return workerConfig{
		Backend: c.Backend, Target: c.Target, Table: s.table, Region: s.region, LockDir: s.lockDir,
		Slot: slot, Goroutines: c.Goroutines, Names: c.Names, Ops: ops,
		Shared: c.Shared, IfAvailable: c.IfAvailable, Steal: c.Steal, Timeout: c.Timeout,
		Deadline: c.Deadline, Hold: c.Hold.String(), Seed: c.Seed,
		Result: s.resultFile(slot),
	}
}

func (s *supervisor) resultFile(slot int) string {
	return filepath.Join(s.dir, fmt.Sprintf("result-%d.json", slot))
}

// spawn starts a worker at position pos doing ops requests per goroutine
// (0: until stopped). Called with s.mu held.
func (s *supervisor) spawn(pos, ops int) error {
	if s.nextSlot >= s.r.Slots() {
		return errors.New("no free slot in the check region")
	}
	slot := s.nextSlot
	s.nextSlot++
	s.r.ClaimSlot(slot, pos)
	wc, _ := json.Marshal(s.workerConfig(slot, ops))
	w := &worker{slot: slot, pos: pos, done: make(chan struct{})}
	w.cmd = exec.Command(s.cfg.Worker[0], s.cfg.Worker[1:]...)
	w.cmd.Env = append(os.Environ(), WorkerEnv+"="+string(wc))
	w.cmd.Stderr = s.stderr
	if err := w.cmd.Start(); err != nil {
		return err
	}
	s.r.SetPID(slot, w.cmd.Process.Pid)
	s.current[pos] = w
	s.all = append(s.all, w)
	go s.await(w)
	return nil
}

// await waits for a worker and settles its position.
func (s *supervisor) await(w *worker) {
	err := w.cmd.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	w.err = err
	close(w.done)
	if w.killed {
		return // the chaos loop has replaced it already
	}
	if err == nil {
		s.r.setSlotState(w.slot, slotExited)
	} else {
		s.r.setSlotState(w.slot, slotFailed)
		s.failures = append(s.failures, fmt.Sprintf("worker pid %d (process %d) failed: %v", w.cmd.Process.Pid, w.pos, err))
	}
	if s.current[w.pos] == w {
		s.posDone[w.pos] = true
	}
	for _, d := range s.posDone {
		if !d {
			return
		}
	}
	if !s.closed {
		s.closed = true
		close(s.allDone)
	}
}

func (s *supervisor) run() *Report {
	cfg := s.cfg
	s.current = make([]*worker, cfg.Procs)
	s.posDone = make([]bool, cfg.Procs)
	s.start = time.Now()
	s.mu.Lock()
	var spawnErr error
	for p := 0; p < cfg.Procs && spawnErr == nil; p++ {
		spawnErr = s.spawn(p, cfg.Ops)
	}
	s.mu.Unlock()
	if spawnErr != nil {
		s.r.Violation("could not start the workers: " + spawnErr.Error())
		s.r.Stop()
		s.mu.Lock()
		for p, w := range s.current {
			if w == nil {
				s.posDone[p] = true
			}
		}
		s.mu.Unlock()
	}
	// The run starts once every first worker is ready to make requests
	// (or has exited): starting a worker (a race-enabled binary on a busy
	// machine) can take longer than a short run, which then measured
	// nothing.
	s.waitStarted()
	s.start = time.Now()

	ctx, cancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); s.watchdog(ctx) }()
	go func() { defer bg.Done(); s.progress(ctx) }()
	if cfg.Chaos > 0 {
		bg.Add(1)
		go func() { defer bg.Done(); s.chaos(ctx) }()
	}

	var end time.Time
	var timer <-chan time.Time
	if cfg.Ops == 0 {
		timer = time.After(cfg.Duration)
	}
	finished := false
	select {
	case <-timer:
	case <-s.allDone:
		finished = true
	}
	end = time.Now()
	s.r.Stop()
	if !finished {
		select {
		case <-s.allDone:
		case <-time.After(cfg.Grace):
			s.r.Violation(fmt.Sprintf("workers did not stop within %v of the end of the run (a request never returned?)", cfg.Grace))
			s.mu.Lock()
			for _, w := range s.current {
				if w != nil && !isDone(w) {
					s.r.setSlotState(w.slot, slotFailed)
					w.killed = true
					w.cmd.Process.Kill()
				}
			}
			s.mu.Unlock()
		}
	}
	cancel()
	bg.Wait()
	s.mu.Lock()
	all := append([]*worker(nil), s.all...)
	s.mu.Unlock()
	for _, w := range all {
		<-w.done
	}
	s.collectReaps()
	if s.cfg.Progress != nil {
		fmt.Fprint(s.cfg.Progress, "\r\x1b[K")
	}
	return s.report(end.Sub(s.start), all)
}

// waitStarted waits, at most cfg.Grace, until every current worker has
// marked its slot started or has exited.
func (s *supervisor) waitStarted() {
	deadline := time.Now().Add(s.cfg.Grace)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		ready := true
		for _, w := range s.current {
			if w != nil && !s.r.started(w.slot) && !isDone(w) {
				ready = false
				break
			}
		}
		s.mu.Unlock()
		if ready {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func isDone(w *worker) bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// chaos SIGKILLs a random worker cfg.Chaos times a second and starts a
// replacement at its position. Before the signal it marks the victim's slot
// killed (so the checkers ignore its records from then on) and arms a reap
// watch on every name the victim holds exclusively.
func (s *supervisor) chaos(ctx context.Context) {
	rng := mrand.New(mrand.NewPCG(s.cfg.Seed, 0xc4a05))
	interval := time.Duration(float64(time.Second) / s.cfg.Chaos)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if s.r.Stopped() {
			return
		}
		s.collectReaps()
		s.mu.Lock()
		if s.nextSlot >= s.r.Slots() {
			if !s.noSlots {
				s.noSlots = true
			}
			s.mu.Unlock()
			continue
		}
		var cands []*worker
		for p, w := range s.current {
			if w != nil && !s.posDone[p] && !w.killed && s.r.slotState(w.slot) == slotRunning && !isDone(w) {
				cands = append(cands, w)
			}
		}
		if len(cands) == 0 {
			s.mu.Unlock()
			continue
		}
		// Prefer a worker that holds a lock right now: killing holders is
		// what exercises reaping.
		var holders []*worker
		for _, w := range cands {
			for g := 0; g < s.r.Goroutines(); g++ {
				if s.r.readRecord(w.slot, g).holdName >= 0 {
					holders = append(holders, w)
					break
				}
			}
		}
		if len(holders) > 0 {
			cands = holders
		}
		v := cands[rng.IntN(len(cands))]
		s.kill(v)
		ops := 0
		if s.cfg.Ops > 0 {
			var done uint64
			for _, w := range s.all {
				if w.pos == v.pos {
					done += s.r.stat(w.slot, slOps)
				}
			}
			total := uint64(s.cfg.Ops * s.cfg.Goroutines)
			if done >= total {
				s.posDone[v.pos] = true
				s.checkAllDone()
				s.mu.Unlock()
				continue
			}
			ops = int((total - done + uint64(s.cfg.Goroutines) - 1) / uint64(s.cfg.Goroutines))
		}
		if err := s.spawn(v.pos, ops); err != nil {
			s.failures = append(s.failures, "could not start a replacement worker: "+err.Error())
			s.posDone[v.pos] = true
			s.checkAllDone()
		}
		s.mu.Unlock()
	}
}

func (s *supervisor) checkAllDone() {
	for _, d := range s.posDone {
		if !d {
			return
		}
	}
	if !s.closed {
		s.closed = true
		close(s.allDone)
	}
}

// kill marks v killed, arms the reap watches and sends SIGKILL. s.mu held.
func (s *supervisor) kill(v *worker) {
	r := s.r
	v.killed = true
	r.setSlotState(v.slot, slotKilled)
	var names []int
	now := mono()
	for g := 0; g < r.Goroutines(); g++ {
		rec := r.readRecord(v.slot, g)
		if rec.holdName < 0 {
			continue
		}
		names = append(names, rec.holdName)
		n := rec.holdName
		if rec.holdMode != modeExclusive || atomic32(r.nu32(n, nmReapState)) != 0 {
			continue
		}
		storeU32(r.nu32(n, nmReapSlot), uint32(v.slot))
		storeU32(r.nu32(n, nmReapG), uint32(g))
		storeU64(r.nu64(n, nmReapToken), rec.token)
		storeI64(r.ni64(n, nmReapKill), now)
		storeU32(r.nu32(n, nmReapState), 1)
	}
	r.AddKill()
	v.cmd.Process.Kill()
	s.kills++
	// The watchdog measures "nothing happened on the name" from here.
	for _, n := range names {
		storeI64(r.ni64(n, nmLastChange), mono())
	}
}

// collectReaps takes the reap samples of the grants that followed kills.
func (s *supervisor) collectReaps() {
	r := s.r
	for n := 0; n < r.Names(); n++ {
		switch atomic32(r.nu32(n, nmReapState)) {
		case 2:
			recordNS(s.reap, loadI64(r.ni64(n, nmReapGrant))-loadI64(r.ni64(n, nmReapKill)))
			storeU32(r.nu32(n, nmReapState), 0)
		case 3:
			storeU32(r.nu32(n, nmReapState), 0)
		}
	}
}

// watchdog reports waiters stuck on a free name: a request waiting longer
// than cfg.Stuck while no live process holds the name and nothing was
// granted or released on it for cfg.Stuck; and requests with a deadline
// still waiting cfg.Stuck after it.
func (s *supervisor) watchdog(ctx context.Context) {
	r := s.r
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	stuck := int64(s.cfg.Stuck)
	var lastGranted uint64
	lastGrant, gapReported := mono(), false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		nSlots := s.nextSlot
		s.mu.Unlock()
		if gap := int64(s.cfg.MaxGrantGap); gap > 0 && !r.Stopped() {
			var granted uint64
			for sl := 0; sl < nSlots; sl++ {
				granted += s.r.stat(sl, slGranted)
			}
			if now := mono(); granted != lastGranted {
				lastGranted, lastGrant = granted, now
			} else if now-lastGrant > gap && !gapReported {
				gapReported = true
				r.Violation(fmt.Sprintf("no grant anywhere for %v (limit %v)", time.Duration(now-lastGrant).Round(time.Millisecond), s.cfg.MaxGrantGap))
			}
		}
		held := make([]bool, r.Names())
		var waits []record
		for sl := 0; sl < nSlots; sl++ {
			if r.slotState(sl) != slotRunning {
				continue
			}
			for g := 0; g < r.Goroutines(); g++ {
				rec := r.readRecord(sl, g)
				if rec.holdName >= 0 && rec.holdName < len(held) {
					held[rec.holdName] = true
				}
				if rec.waitName >= 0 && rec.waitName < len(held) {
					waits = append(waits, rec)
				}
			}
		}
		now := mono()
		for _, w := range waits {
			key := [3]uint64{uint64(w.slot), uint64(w.g), w.ticket}
			if s.stuckSeen[key] {
				continue
			}
			n := w.waitName
			last := loadI64(r.ni64(n, nmLastChange))
			switch {
			case w.deadline != 0 && now-w.deadline > stuck:
				s.stuckSeen[key] = true
				r.Violation(fmt.Sprintf("request for %s (pid %d goroutine %d) still waiting %v after its deadline",
					nameOf(n), r.slotPID(w.slot), w.g, time.Duration(now-w.deadline).Round(time.Millisecond)))
			case !held[n] && now-w.waitFrom > stuck && now-last > stuck:
				s.stuckSeen[key] = true
				r.Violation(fmt.Sprintf("stuck waiter: %s request (pid %d goroutine %d) waiting %v while %s is free and unchanged for %v",
					modeName(w.waitMode), r.slotPID(w.slot), w.g, time.Duration(now-w.waitFrom).Round(time.Millisecond),
					nameOf(n), time.Duration(now-last).Round(time.Millisecond)))
			}
		}
	}
}

func (s *supervisor) totals() (ops uint64, viol int) {
	s.mu.Lock()
	n := s.nextSlot
	s.mu.Unlock()
	for sl := 0; sl < n; sl++ {
		ops += s.r.stat(sl, slOps)
	}
	viol, _ = s.r.Violations()
	return ops, viol
}

// progress prints a progress line four times a second (only with cfg.Progress).
func (s *supervisor) progress(ctx context.Context) {
	if s.cfg.Progress == nil {
		return
	}
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ops, viol := s.totals()
		el := time.Since(s.start).Seconds()
		s.mu.Lock()
		kills := s.kills
		s.mu.Unlock()
		total := ""
		if s.cfg.Ops == 0 {
			total = fmt.Sprintf("/%.0fs", s.cfg.Duration.Seconds())
		}
		fmt.Fprintf(s.cfg.Progress, "\r\x1b[K%s %.1fs%s  requests %d (%.0f/s)  kills %d  violations %d",
			s.cfg.Backend, el, total, ops, float64(ops)/math.Max(el, 1e-3), kills, viol)
	}
}

// report runs the final checks and assembles the report.
func (s *supervisor) report(elapsed time.Duration, all []*worker) *Report {
	cfg, r := s.cfg, s.r
	rep := &Report{
		Backend: cfg.Backend, Seed: cfg.Seed, Table: s.table, Procs: cfg.Procs, Goroutines: cfg.Goroutines,
		Names: cfg.Names, Hold: cfg.Hold.String(), Seconds: elapsed.Seconds(), Kills: s.kills,
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
		rep.Ops += st(slOps)
		rep.Outcomes.Granted += st(slGranted)
		rep.Outcomes.NotAvailable += st(slNotAvail)
		rep.Outcomes.TimedOut += st(slTimedOut)
		rep.Outcomes.Stolen += st(slStolen)
		rep.Outcomes.Errors += st(slErrors)
		rep.Steals += st(slSteals)
		rep.ExclusiveGrants += st(slExclusive)
		rep.SharedGrants += st(slShared)
		samples += st(slFIFOSamp)
		overtaken += st(slFIFOOver)
		perPos[w.pos] += st(slOps)
		for g := range perG[w.pos] {
			perG[w.pos][g] += int64(r.grants(sl, g))
		}
	}
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
	for n := 0; n < cfg.Names; n++ {
		count := uint32(loadU64(r.nu64(n, nmCounter)))
		want := uint32(loadU64(r.nu64(n, nmGrantsX)) - loadU64(r.nu64(n, nmFenced)))
		d := int64(int32(want - count))
		grants += int64(loadU64(r.nu64(n, nmGrantsX)))
		if d < 0 {
			r.Violation(fmt.Sprintf("counter of %s is %d, above its %d unfenced exclusive sections", nameOf(n), count, want))
		}
		if d > 0 {
			deficit += d
		}
	}
	if tol := int64(s.kills) + rep.Steals; deficit > tol {
		r.Violation(fmt.Sprintf("lost updates: the exclusive-section counters fall %d short of %d exclusive grants (tolerance %d = kills + steals)",
			deficit, grants, tol))
	} else if deficit > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("counters fall %d short (within the tolerance of %d kills + %d steals)", deficit, s.kills, rep.Steals))
	}

	// The table (or the lock files) must be consistent and empty.
	switch cfg.Backend {
	case BackendShmlocks:
		s.checkTable(rep)
	case BackendFlock:
		if err := flockFree(s.lockDir, cfg.Names); err != nil {
			r.Violation(err.Error())
		}
	default:
		if p, ok := plugin(cfg.Backend); ok && p.Empty != nil {
			if err := p.Empty(cfg.Target); err != nil {
				r.Violation(fmt.Sprintf("%s after the run: %v", cfg.Backend, err))
			}
		}
	}
	for _, f := range s.failures {
		r.Violation(f)
	}
	if rep.Outcomes.Errors > 0 {
		r.Violation(fmt.Sprintf("%d requests failed with unexpected errors: %s", rep.Outcomes.Errors, strings.Join(rep.Errors, "; ")))
	}
	rep.Violations, rep.ViolationMessages = r.Violations()
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
		r.Violation("final check: " + err.Error())
		return
	}
	defer m.Close()
	if err := m.Check(); err != nil {
		r.Violation("table consistency check: " + err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	snap, err := m.Query(ctx)
	if err != nil {
		r.Violation("final query: " + err.Error())
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
	r.Violation(fmt.Sprintf("%d requests left in the table after every worker exited (dead workers must have been reaped):%s", len(left), b.String()))
}

// lockedWriter serialises the writes of several copying goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
