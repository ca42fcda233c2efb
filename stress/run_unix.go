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
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	fair    string // the shmlocks table's fairness (Manager.Fairness), for the report

	mu        sync.Mutex
	nextSlot  int
	current   []*worker // per position
	all       []*worker
	posDone   []bool
	posFailed []string
	noSlots   bool
	failed    int // workers that died on their own
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
			secs := cfg.Duration.Seconds()
			if cfg.KillEach {
				secs += KillEachWithin.Seconds()
			}
			extra = int(math.Ceil(cfg.Chaos*secs*2)) + 16
		} else {
			extra = 4096
		}
	}
	perG := recordsPerGoroutine(cfg.Features)
	stride := slotHdr + cfg.Goroutines*perG*recSize
	if limit := (maxRegionBytes-hdrSize-2*cfg.Names*nameSize)/stride - cfg.Procs; extra > limit {
		extra = max(limit, 0)
	}
	slots := cfg.Procs + extra
	// Create the table once, with the defaults and the fairness asked for
	// (an existing --table keeps its own: the report says which), before the
	// check file that lives beside it: Open also creates the default table's
	// directory.
	coalesceDir := ""
	if cfg.Backend == BackendShmlocks {
		o := &manager.OpenOptions{}
		if cfg.Fairness != "" {
			var err error
			if o.Fairness, err = manager.ParseFairness(cfg.Fairness); err != nil {
				os.RemoveAll(dir)
				return nil, err
			}
		}
		m, err := manager.Open(s.table, o)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s.fair = m.Fairness().String()
		m.Close()
		if d := coalesceStore(s.table); slices.Contains(cfg.Features, FeatureCoalesce) {
			if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
				coalesceDir = d // the run's own: removed with the run's files
			}
		}
	}
	shape := RegionShape{Names: cfg.Names, Slots: slots, Goroutines: cfg.Goroutines, Records: perG, Positions: cfg.Procs}
	mp, err := createRegionFile(s.region, RegionSize(shape))
	if err != nil {
		os.RemoveAll(dir)
		if errors.Is(err, os.ErrExist) {
			err = fmt.Errorf("check file %s exists (kept by an earlier run, or another run uses this table): remove it or use another --table", s.region)
		}
		return nil, err
	}
	defer mp.close()
	if s.r, err = InitRegion(mp.buf, shape); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}

	rep := s.run()
	if coalesceDir != "" && !(cfg.Keep || rep.Violations > 0) {
		os.RemoveAll(coalesceDir)
	}

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

func (s *supervisor) workerConfig(slot, pos, ops int) workerConfig {
	c := s.cfg
	return workerConfig{
		Backend: c.Backend, Target: c.Target, Table: s.table, Region: s.region, LockDir: s.lockDir,
		Slot: slot, Goroutines: c.Goroutines, Names: c.Names, Ops: ops,
		Shared: c.Shared, IfAvailable: c.IfAvailable, Steal: c.Steal, Timeout: c.Timeout,
		Deadline: c.Deadline, Hold: c.Hold.String(), Seed: c.Seed, HandOver: c.HandOver,
		Result: s.resultFile(slot), Role: s.role(pos), Stuck: c.Stuck,
		Exec: c.Exec, Worker: c.Worker,
	}
}

// role is the feature of the workers at position pos.
func (s *supervisor) role(pos int) string {
	if len(s.cfg.Features) == 0 {
		return FeaturePlain
	}
	return s.cfg.Features[pos%len(s.cfg.Features)]
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
	s.r.setRole(slot, featureIndex(s.role(pos)))
	wc, _ := json.Marshal(s.workerConfig(slot, pos, ops))
	w := &worker{slot: slot, pos: pos, done: make(chan struct{})}
	w.cmd = exec.Command(s.cfg.Worker[0], s.cfg.Worker[1:]...)
	w.cmd.Env = append(os.Environ(), WorkerEnv+"="+string(wc))
	w.cmd.Stderr = s.stderr
	// Every other worker in namespaces of its own, but exec's: the chaos
	// kills of exec name its command by the pid it checks in with, which
	// means something only in the supervisor's PID namespace (exec across
	// namespaces: cmd/shmlocks TestExecAcrossPIDNamespaces).
	if s.cfg.Namespaces && pos%2 == 1 && s.role(pos) != FeatureExec {
		w.cmd.SysProcAttr = namespaceAttr()
		w.cmd.Env = append(w.cmd.Env, ownProcEnv+"=1")
	}
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
		s.failed++
		s.failures = append(s.failures, fmt.Sprintf("worker pid %d (process %d, %s) failed: %v", w.cmd.Process.Pid, w.pos, s.role(w.pos), err))
		// A run for a duration goes on without it: a replacement takes its
		// position (the failure is a violation all the same).
		if s.current[w.pos] == w && s.cfg.Ops == 0 && !s.r.Stopped() && s.nextSlot < s.r.Slots() {
			if serr := s.spawn(w.pos, 0); serr == nil {
				return
			}
		}
	}
	if s.current[w.pos] == w {
		s.posDone[w.pos] = true
	}
	s.checkAllDone()
}

// checkAllDone closes allDone once every position is done (s.mu held).
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
		s.r.violation(kindFailure, "could not start the workers: "+spawnErr.Error())
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
		finished = s.killEach(cfg)
	case <-s.allDone:
		finished = true
	}
	end = time.Now()
	s.r.Stop()
	if !finished {
		select {
		case <-s.allDone:
		case <-time.After(cfg.Grace):
			s.r.violation(kindStuck, fmt.Sprintf("workers did not stop within %v of the end of the run (a request never returned?)", cfg.Grace))
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
	if s.cfg.Progress != nil && s.cfg.ProgressEvery == 0 {
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

// KillEachWithin bounds how long Config.KillEach extends a run.
const KillEachWithin = time.Minute

// killEach waits, with cfg.KillEach and chaos on, until every feature has
// been killed at least once (at most KillEachWithin); it reports whether
// every worker finished meanwhile.
func (s *supervisor) killEach(cfg Config) bool {
	if !cfg.KillEach || cfg.Chaos <= 0 {
		return false
	}
	feats := cfg.Features
	if len(feats) == 0 {
		feats = []string{FeaturePlain}
	}
	deadline := time.After(KillEachWithin)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		all := true
		for _, f := range feats {
			if s.r.featureKills(featureIndex(f)) == 0 {
				all = false
			}
		}
		if all {
			return false
		}
		select {
		case <-tick.C:
		case <-deadline:
			return false
		case <-s.allDone:
			return true
		}
	}
}
