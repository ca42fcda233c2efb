//go:build unix

package stress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/shmlocks/shmlocks/internal/testhooks"
)

// workerConfig is what the supervisor passes to a worker (JSON in WorkerEnv).
type workerConfig struct {
	Backend     string        `json:"backend"`
	Target      string        `json:"target,omitempty"`
	Table       string        `json:"table"`
	Region      string        `json:"region"`
	LockDir     string        `json:"lockDir"`
	Slot        int           `json:"slot"`
	Goroutines  int           `json:"goroutines"`
	Names       int           `json:"names"`
	Ops         int           `json:"ops"` // per goroutine; 0: until stopped
	Shared      float64       `json:"shared"`
	IfAvailable float64       `json:"ifAvailable"`
	Steal       float64       `json:"steal"`
	Timeout     float64       `json:"timeout"`
	Deadline    time.Duration `json:"deadline"`
	Hold        string        `json:"hold"`
	HandOver    bool          `json:"handOver,omitempty"`
	Seed        uint64        `json:"seed"`
	Result      string        `json:"result"`         // file for the workerResult, rewritten every resultEvery
	Role        string        `json:"role,omitempty"` // a feature (FeaturePlain when empty)
	Stuck       time.Duration `json:"stuck,omitempty"`
	Exec        []string      `json:"exec,omitempty"`    // argv of "shmlocks exec" (FeatureExec)
	Worker      []string      `json:"worker,omitempty"`  // argv of this binary's worker (an exec command runs it)
	Command     *execCommand  `json:"command,omitempty"` // set: this process is an exec command, not a worker
}

// resultEvery: how often a worker rewrites its result file, so that a
// killed worker's histograms are lost for at most that long.
const resultEvery = 250 * time.Millisecond

// workerResult is what a worker leaves in its result file.
type workerResult struct {
	Hist   map[string]string `json:"hist"` // encoded HdrHistograms (ns)
	Errors []string          `json:"errors"`
}

// Histogram names.
const (
	histWaitExclusive    = "waitExclusive"
	histWaitShared       = "waitShared"
	histHandoffExclusive = "handoffExclusive"
	histHandoffShared    = "handoffShared"
)

// IsWorker reports whether this process was started as a stress worker.
func IsWorker() bool { return os.Getenv(WorkerEnv) != "" }

// WorkerMain runs a worker process: it maps the check region, opens the
// backend and makes requests from its goroutines until the supervisor stops
// it (or its share of --ops is done). Its latency histograms and error
// messages go to its result file, rewritten every resultEvery and at the
// end. It returns the process exit status.
func WorkerMain(stdout, stderr io.Writer) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "stress worker %d: %s\n", os.Getpid(), fmt.Sprintf(format, args...))
		return 1
	}
	var wc workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(WorkerEnv)), &wc); err != nil {
		return fail("bad %s: %v", WorkerEnv, err)
	}
	if wc.Command != nil {
		return execCommandMain(&wc, stderr)
	}
	if os.Getenv(ownProcEnv) != "" {
		// A worker in namespaces of its own (Config.Namespaces) sees its
		// own PID namespace's /proc, as a container does.
		if err := mountOwnProc(); err != nil {
			return fail("mount /proc in its namespaces: %v", err)
		}
		os.Unsetenv(ownProcEnv)
	}
	switch f := os.Getenv(FaultEnv); f {
	case "":
	case "break-exclusion":
		testhooks.BreakExclusion.Store(true)
	default:
		return fail("unknown %s=%q (known: break-exclusion)", FaultEnv, f)
	}
	hold, err := ParseHold(wc.Hold)
	if err != nil {
		return fail("%v", err)
	}
	mp, err := openRegionFile(wc.Region)
	if err != nil {
		return fail("%v", err)
	}
	defer mp.close()
	r, err := OpenRegion(mp.buf)
	if err != nil {
		return fail("%v", err)
	}
	if wc.Slot < 0 || wc.Slot >= r.Slots() || wc.Goroutines > r.Goroutines() || wc.Names > r.Names() {
		return fail("configuration does not fit the check region")
	}
	var be backend
	c := NewChecker(r, wc.Slot, os.Getpid(), mono)
	switch {
	case wc.Role == FeatureExec: // no lock of its own: its wrappers and commands
		be = nopBackend{}
	case wc.Backend == BackendShmlocks:
		sb, err := newShmBackend(wc.Table, wc.HandOver)
		if err != nil {
			return fail("%v", err)
		}
		be = sb
	case wc.Backend == BackendFlock:
		be = newFlockBackend(wc.LockDir, wc.Goroutines, wc.Names)
		c.Tokens = false
	default:
		p, ok := plugin(wc.Backend)
		if !ok {
			return fail("unknown backend %q (not registered in this binary)", wc.Backend)
		}
		m, err := p.Open(wc.Target)
		if err != nil {
			return fail("%v", err)
		}
		be = &shmBackend{m: m}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // the supervisor's stop flag ends the run
		for !r.Stopped() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		cancel()
	}()

	r.markStarted(wc.Slot)
	stats := make([]*gstats, wc.Goroutines)
	var wg sync.WaitGroup
	run := runGoroutine
	switch wc.Role {
	case FeaturePlain, "":
	case FeatureExec:
		run = runExec
	case FeatureChild:
		run = runChild
	case FeatureCoalesce:
		run = runCoalesce
	case FeatureAll:
		run = runAll
	default:
		return fail("unknown role %q", wc.Role)
	}
	if wc.Role != FeaturePlain && wc.Role != "" && wc.Role != FeatureExec && !backendFeature(wc.Role) {
		if _, ok := be.(*shmBackend); !ok {
			return fail("feature %s needs the shmlocks backend", wc.Role)
		}
	}
	for g := 0; g < wc.Goroutines; g++ {
		stats[g] = newGStats()
		stats[g].fail = func(msg string) { r.violation(kindFailure, fmt.Sprintf("pid %d: %s", os.Getpid(), msg)) }
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			run(ctx, &wc, hold, r, c, be, g, stats[g])
		}(g)
	}
	flushed := make(chan struct{})
	go func() { // keep the result file fresh for the case of a SIGKILL
		defer close(flushed)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(resultEvery):
			}
			if err := writeResult(wc.Result, stats, nil); err != nil {
				fmt.Fprintf(stderr, "stress worker %d: %v\n", os.Getpid(), err)
			}
		}
	}()
	wg.Wait()
	cerr := be.close()
	cancel()
	<-flushed
	var extra []string
	if cerr != nil {
		extra = append(extra, "close: "+cerr.Error())
	}
	if err := writeResult(wc.Result, stats, extra); err != nil {
		return fail("%v", err)
	}
	return 0
}

// gstats is one goroutine's latency histograms and error messages.
type gstats struct {
	mu   sync.Mutex
	hist map[string]*hdrhistogram.Histogram
	errs []string
	fail func(msg string) // reports an unexpected error as a violation at once
}

func newGStats() *gstats {
	return &gstats{hist: map[string]*hdrhistogram.Histogram{
		histWaitExclusive: newHist(), histWaitShared: newHist(),
		histHandoffExclusive: newHist(), histHandoffShared: newHist(),
	}}
}

func (s *gstats) record(name string, ns int64) {
	s.mu.Lock()
	recordNS(s.hist[name], ns)
	s.mu.Unlock()
}

// addErr records a request's unexpected error: a violation in the region
// at once (so that a worker killed later loses nothing of it), and among
// the messages of its result file.
func (s *gstats) addErr(msg string) {
	if s.fail != nil {
		s.fail(msg)
	}
	s.mu.Lock()
	if len(s.errs) < 4 {
		s.errs = append(s.errs, msg)
	}
	s.mu.Unlock()
}

// writeResult merges the goroutines' statistics and replaces the result
// file atomically (write, then rename).
func writeResult(path string, stats []*gstats, extra []string) error {
	res := workerResult{Hist: map[string]string{}, Errors: extra}
	merged := newGStats().hist
	for _, s := range stats {
		s.mu.Lock()
		for k, h := range s.hist {
			merged[k].Merge(h)
		}
		res.Errors = append(res.Errors, s.errs...)
		s.mu.Unlock()
	}
	for k, h := range merged {
		enc, err := h.Encode(hdrhistogram.V2CompressedEncodingCookieBase)
		if err != nil {
			return fmt.Errorf("encode histogram: %w", err)
		}
		res.Hist[k] = string(enc)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// runGoroutine makes requests until ctx ends or its ops are done.
func runGoroutine(ctx context.Context, wc *workerConfig, hold Hold, r *Region, c *Checker, be backend,
	g int, st *gstats) {
	rng := rand.New(rand.NewPCG(wc.Seed, uint64(wc.Slot)<<20|uint64(g)))
	slot := wc.Slot
	for i := 0; wc.Ops == 0 || i < wc.Ops; i++ {
		if ctx.Err() != nil {
			break
		}
		name := rng.IntN(wc.Names)
		mode := uint32(modeExclusive)
		if rng.Float64() < wc.Shared {
			mode = modeShared
		}
		ifAvailable := rng.Float64() < wc.IfAvailable
		steal := !ifAvailable && mode == modeExclusive && rng.Float64() < wc.Steal && wc.Backend != BackendFlock
		timed := !ifAvailable && !steal && rng.Float64() < wc.Timeout
		rctx, cancel := ctx, context.CancelFunc(func() {})
		var deadline int64
		if timed {
			rctx, cancel = context.WithTimeout(ctx, wc.Deadline)
			deadline = mono() + int64(wc.Deadline)
		}
		q := c.Begin(g, name, mode, steal, !ifAvailable && !steal, deadline)
		h, token, err := be.acquire(rctx, g, name, mode, ifAvailable, steal)
		q.End()
		cancel()
		waited := mono() - q.From()
		if errors.Is(err, errAborted) {
			r.addStat(slot, slAborted, 1)
			break
		}
		r.addStat(slot, slOps, 1)
		switch {
		case err == nil:
			r.countGrant(slot, g, mode)
			if steal {
				r.addStat(slot, slSteals, 1)
			}
			gr := q.Granted(token)
			if mode == modeExclusive {
				st.record(histWaitExclusive, waited)
				if gr.Handoff >= 0 {
					st.record(histHandoffExclusive, gr.Handoff)
				}
			} else {
				st.record(histWaitShared, waited)
				if gr.Handoff >= 0 {
					st.record(histHandoffShared, gr.Handoff)
				}
			}
			q.Enter()
			holdFor(hold.Sample(rng))
			q.Exit()
			q.Release()
			switch err := be.release(h); {
			case err == nil:
			case errors.Is(err, errLost):
				r.addStat(slot, slLostRel, 1)
				r.addStat(slot, slStolen, 1)
				q.LostAtRelease()
			default:
				r.addStat(slot, slRelErrors, 1)
				r.addStat(slot, slErrors, 1)
				st.addErr("release: " + err.Error())
			}
		case errors.Is(err, errNotAvailable):
			r.addStat(slot, slNotAvail, 1)
		case errors.Is(err, errTimedOut):
			r.addStat(slot, slTimedOut, 1)
		case errors.Is(err, errStolenEarly): // granted (counted first), then stolen before it was seen
			r.countGrant(slot, g, mode)
			if steal {
				r.addStat(slot, slSteals, 1)
			}
			r.addStat(slot, slStolen, 1)
			q.StolenBeforeSeen()
		default:
			r.addStat(slot, slErrors, 1)
			st.addErr("acquire: " + err.Error())
		}
	}
}

// holdFor holds a lock for d: busy below a millisecond (a sleep would add the
// scheduler's latency to every short hold), asleep above.
func holdFor(d time.Duration) {
	if d <= 0 {
		return
	}
	if d >= time.Millisecond {
		time.Sleep(d)
		return
	}
	end := mono() + int64(d)
	for mono() < end {
	}
}

// markStarted records that the worker of slot s is ready to make requests
// (beside the worker: mono is the unix clock, sys_unix.go).
func (r *Region) markStarted(s int) { atomic.StoreInt64(r.i64(r.slotOff(s)+slStarted), mono()) }
