//go:build linux

package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/shmlocks/shmlocks/internal/proctest"

	"github.com/shmlocks/shmlocks/manager"
)

// The parent side of the multi-process benchmarks: runLoop starts the loop
// children of bench_proc_linux_test.go (pinned or not) on a shared control
// file, runs them for the benchmark window and reduces what they counted
// there (loopResult: ops/s, max/min per process, CPU shares, hand-off gaps,
// repeats; bench_goroutines_linux_test.go adds the per-goroutine figures).

// firstCPU returns the lowest CPU this process may run on.
func firstCPU() int {
	var s unix.CPUSet
	if err := unix.SchedGetaffinity(0, &s); err != nil {
		return 0
	}
	for i := 0; i < 1024; i++ {
		if s.IsSet(i) {
			return i
		}
	}
	return 0
}

// startPinned starts cmd; with cpu >= 0 the child is born with its affinity
// restricted to that CPU (every thread it will ever have, and GOMAXPROCS=1):
// the forking thread is pinned for the duration of the fork.
func startPinned(cmd *exec.Cmd, cpu int) error {
	if cpu < 0 {
		return cmd.Start()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return err
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		return err
	}
	err := cmd.Start()
	if rerr := unix.SchedSetaffinity(0, &old); rerr != nil {
		panic(fmt.Sprintf("restore affinity: %v", rerr))
	}
	return err
}

// benchChildInfo is what a child reported in its ready line.
type benchChildInfo struct {
	*child
	maxprocs, cpus int
}

// startBenchChild starts a loop child (role "bench") and waits for "ready".
func startBenchChild(b testing.TB, role, ctlPath string, a benchArgs, cpu int) benchChildInfo {
	b.Helper()
	js, err := json.Marshal(a)
	require.NoError(b, err)
	o := proctest.Options{
		Watchdog: 90 * time.Second, Within: eventually,
		Start: func(cmd *exec.Cmd) error { return startPinned(cmd, cpu) },
	}
	c := &child{Child: proctest.SpawnWith(b, o, "bench", role, ctlPath, string(js)), t: b}
	f := strings.Fields(c.Expect("ready"))
	mp, _ := strconv.Atoi(f[2])
	nc, _ := strconv.Atoi(f[3])
	return benchChildInfo{child: c, maxprocs: mp, cpus: nc}
}

// loopCfg describes one multi-process loop measurement.
type loopCfg struct {
	kind    string
	procs   int
	mode    manager.Mode
	csIters int
	ping    bool
	pinned  bool
	opts    *manager.OpenOptions // shm children's OpenOptions (nil: defaults)
	calib   bool                 // measure the two-processes-vs-one calibration first
	warmup  time.Duration
	window  time.Duration

	// goroutines >= 1: requesting goroutines per child (per-goroutine counts
	// in gops, waits in waitP999 and waitMax); 0: benchLoop's one loop
	goroutines int
}

// loopResult is what the parent saw during the window.
type loopResult struct {
	elapsed  time.Duration
	ops      []uint64 // per process
	gops     []uint64 // per requesting goroutine (goroutines > 1), process-major
	total    uint64
	changes  uint64
	repeats  uint64
	viol     uint64
	calib    float64         // time of the loop in 2 processes at once / alone (0: not measured)
	lineNs   float64         // a cache line's crossing between two CPUs, ns, before and after the loop (lineNs; 0: not measured)
	cpu      []time.Duration // per process: CPU time in the window (all threads, /proc schedstat)
	maxprocs int             // GOMAXPROCS and CPUs of the children (from child 0)
	cpus     int
	gaps     bool               // gapCount and gapSum were recorded
	gapCount [gapBuckets]uint64 // ownership changes in the window, by gap (100 ns buckets)
	gapSum   [gapBuckets]uint64 // their gaps, ns
	waitP50  float64            // goroutines >= 1: the median wait of a request in the window (ns, bucket top)
	waitP999 float64            // its 99.9th percentile
	waitMax  float64            // the longest wait of a request granted in the window (ns)
}

// gapP50 is the median gap between two sections of different processes (ns,
// the middle of its 100 ns bucket; 3000 means 3 µs or more).
func (r loopResult) gapP50() float64 {
	var n, c uint64
	for _, v := range r.gapCount {
		n += v
	}
	for i, v := range r.gapCount {
		if c += v; n > 0 && 2*c >= n {
			return float64(i*100 + 50)
		}
	}
	return 0
}

// gapMean is the mean gap (ns).
func (r loopResult) gapMean() float64 {
	var n, t uint64
	for i := range r.gapCount {
		n, t = n+r.gapCount[i], t+r.gapSum[i]
	}
	if n == 0 {
		return 0
	}
	return float64(t) / float64(n)
}

// stallPct is the share of all gap time spent in gaps of 3 µs or more.
func (r loopResult) stallPct() float64 {
	var t uint64
	for _, v := range r.gapSum {
		t += v
	}
	if t == 0 {
		return 0
	}
	return 100 * float64(r.gapSum[gapBuckets-1]) / float64(t)
}

func (r loopResult) opsPerSec() float64 { return float64(r.total) / r.elapsed.Seconds() }

// nsPerChange is the time per ownership change (handoff) in the window.
func (r loopResult) nsPerChange() float64 {
	if r.changes == 0 {
		return float64(r.elapsed.Nanoseconds())
	}
	return float64(r.elapsed.Nanoseconds()) / float64(r.changes)
}

// maxMin is the ratio of the most to the least operations per process (0 ops: +Inf reported as ops of the max).
func (r loopResult) maxMin() float64 { return spread(r.ops) }

// spread is the ratio of the largest to the smallest of counts (0 smallest:
// the largest itself).
func spread(counts []uint64) float64 {
	lo, hi := counts[0], counts[0]
	for _, v := range counts {
		lo, hi = min(lo, v), max(hi, v)
	}
	if lo == 0 {
		return float64(hi)
	}
	return float64(hi) / float64(lo)
}

// cpuMaxMin is the ratio of the most to the least CPU time one process got
// in the window: how evenly the kernel shared the CPUs, apart from the lock.
func (r loopResult) cpuMaxMin() float64 {
	if len(r.cpu) == 0 {
		return 0
	}
	lo, hi := r.cpu[0], r.cpu[0]
	for _, v := range r.cpu {
		lo, hi = min(lo, v), max(hi, v)
	}
	if lo <= 0 {
		return 0
	}
	return float64(hi) / float64(lo)
}

// opsPerCPUMaxMin is the ratio of the most to the least operations per CPU
// second of one process: unequal ops with equal rates means the kernel, not
// the lock, favoured a process.
func (r loopResult) opsPerCPUMaxMin() float64 {
	lo, hi := -1.0, 0.0
	for i, c := range r.cpu {
		if c <= 0 {
			return 0
		}
		v := float64(r.ops[i]) / c.Seconds()
		if lo < 0 || v < lo {
			lo = v
		}
		hi = max(hi, v)
	}
	if lo <= 0 {
		return 0
	}
	return hi / lo
}

// procCPU is the CPU time process pid has used, summed over its threads
// (first field of /proc/<pid>/task/*/schedstat, in ns); 0 if unknown.
func procCPU(pid int) time.Duration {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			if v, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				sum += time.Duration(v)
			}
		}
	}
	return sum
}

// repeatPct is the share of grants that went to the process that held last.
func (r loopResult) repeatPct() float64 {
	if r.changes+r.repeats == 0 {
		return 0
	}
	return 100 * float64(r.repeats) / float64(r.changes+r.repeats)
}

// benchWindow is the measurement window of one loop (SHMLOCKS_BENCH_WINDOW overrides).
func benchWindow() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("SHMLOCKS_BENCH_WINDOW")); err == nil && d > 0 {
		return d
	}
	return time.Second
}

// startHogs starts the CPU-bound processes of SHMLOCKS_BENCH_HOGS (a
// number: a machine busy with other work, such as a build, beside every
// loop of every kind, so that ratios in one run stay fair) and returns
// their pids and what stops them. They die with this process (Pdeathsig).
func startHogs(b testing.TB) (pids []int, stop func()) {
	n, _ := strconv.Atoi(os.Getenv("SHMLOCKS_BENCH_HOGS"))
	var hogs []*exec.Cmd
	for range n {
		c := exec.Command("/bin/sh", "-c", "while :; do :; done")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		require.NoError(b, c.Start())
		hogs = append(hogs, c)
		pids = append(pids, c.Process.Pid)
	}
	return pids, func() {
		for _, c := range hogs {
			c.Process.Kill()
			c.Wait()
		}
	}
}

// runLoop spawns cfg.procs children, starts them together, samples their
// counters over the window and stops them.
func runLoop(b testing.TB, cfg loopCfg) loopResult {
	b.Helper()
	_, stopHogs := startHogs(b)
	defer stopHogs()
	dir := b.TempDir()
	ctlPath := filepath.Join(dir, "ctl")
	require.NoError(b, os.WriteFile(ctlPath, make([]byte, ctlSize), 0o600))
	ctl, err := mapCtl(ctlPath)
	require.NoError(b, err)
	defer unix.Munmap(ctl)
	if cfg.opts == nil && cfg.kind == kindShm {
		// SHMLOCKS_BENCH_SPIN sets the children's SpinLimit (a diagnostic knob; "-1ns": never spin).
		if d, err := time.ParseDuration(os.Getenv("SHMLOCKS_BENCH_SPIN")); err == nil && d != 0 {
			cfg.opts = &manager.OpenOptions{SpinLimit: d}
		}
	}
	tablePath := filepath.Join(dir, "bench.tbl")
	if cfg.kind == kindShm {
		// Create the table before the children race to (with the children's
		// fairness: the creator's is the table's).
		var o *manager.OpenOptions
		if cfg.opts != nil {
			o = &manager.OpenOptions{Fairness: cfg.opts.Fairness}
		}
		m, err := manager.Open(tablePath, o)
		require.NoError(b, err)
		m.Close()
	}
	cpu := -1
	if cfg.pinned {
		cpu = firstCPU()
	}
	if cfg.warmup == 0 {
		cfg.warmup = 100 * time.Millisecond
	}
	if cfg.window == 0 {
		cfg.window = benchWindow()
	}
	perUS := spinItersPerMicro()
	gaps := os.Getenv("SHMLOCKS_BENCH_GAPS") != ""
	kids := make([]benchChildInfo, cfg.procs)
	for i := range kids {
		kids[i] = startBenchChild(b, "loop", ctlPath, benchArgs{
			Kind: cfg.kind, Table: tablePath, Flock: filepath.Join(dir, "flock"), Name: "contended",
			Index: i, Mode: cfg.mode, CSIters: cfg.csIters, Ping: cfg.ping, Opts: cfg.opts, Calib: int(perUS * 20_000), // ~20 ms
			Limit: cfg.warmup + cfg.window + 30*time.Second, Gaps: gaps, Goroutines: cfg.goroutines,
		}, cpu)
	}
	res := loopResult{ops: make([]uint64, cfg.procs), maxprocs: kids[0].maxprocs, cpus: kids[0].cpus}
	if cfg.calib && cfg.procs >= 2 {
		res.calib = calibrate(kids[0].child, kids[1].child)
	}
	// The placement of the CPUs, measured while the children wait, and
	// again after they stopped: unpinned rows of several processes only.
	measureLine := cfg.kind == kindShm && cfg.procs >= 2 && !cfg.pinned
	var line0 float64
	if measureLine {
		line0 = lineNs(lineTrips)
	}
	for _, k := range kids {
		k.Send("go")
	}
	readGaps := func() (c, t [gapBuckets]uint64) {
		for i := range c {
			c[i] = atomic.LoadUint64(ctlWord64(ctl, ctlGaps+8*i))
			t[i] = atomic.LoadUint64(ctlWord64(ctl, ctlGaps+8*(gapBuckets+i)))
		}
		return c, t
	}
	ng := max(cfg.goroutines, 1)
	read := func() (time.Time, []uint64, uint64, uint64, uint64) {
		ops := make([]uint64, cfg.procs, cfg.procs*(1+ng))
		if cfg.goroutines == 0 {
			for i := range cfg.procs {
				ops[i] = atomic.LoadUint64(ctlWord64(ctl, ctlOps+64*i))
			}
		} else { // per-process sums, then the per-goroutine counts
			for i := range cfg.procs * ng {
				v := atomic.LoadUint64(ctlWord64(ctl, ctlGOps+64*i))
				ops[i/ng] += v
				ops = append(ops, v)
			}
		}
		return time.Now(), ops,
			atomic.LoadUint64(ctlWord64(ctl, ctlChanges)), atomic.LoadUint64(ctlWord64(ctl, ctlRepeats)),
			atomic.LoadUint64(ctlWord64(ctl, ctlViol))
	}
	cpuNow := func() []time.Duration {
		c := make([]time.Duration, len(kids))
		for i, k := range kids {
			c[i] = procCPU(k.Pid)
		}
		return c
	}
	time.Sleep(cfg.warmup)
	cpu0 := cpuNow()
	gc0, gs0 := readGaps()
	resetLongest(ctl, cfg.procs*ng)
	w0 := readWaits(ctl, cfg.procs*ng)
	t0, ops0, ch0, rep0, _ := read()
	time.Sleep(cfg.window)
	t1, ops1, ch1, rep1, viol := read()
	w1 := readWaits(ctl, cfg.procs*ng)
	if cfg.goroutines > 0 {
		res.waitP50, res.waitP999, res.waitMax = quantile(w0, w1, 0.5), quantile(w0, w1, 0.999), readLongest(ctl, cfg.procs*ng)
	}
	gc1, gs1 := readGaps()
	cpu1 := cpuNow()
	atomic.StoreUint32(ctlWord32(ctl, ctlStop), 1)
	for _, k := range kids {
		k.Expect("done")
		k.Wait()
	}
	if measureLine {
		if line1 := lineNs(lineTrips); line0 > 0 && line1 > 0 {
			res.lineNs = (line0 + line1) / 2
		}
	}
	res.elapsed = t1.Sub(t0)
	for i := range cfg.procs {
		res.ops[i] = ops1[i] - ops0[i]
		res.total += res.ops[i]
	}
	for i := cfg.procs; i < len(ops1); i++ {
		res.gops = append(res.gops, ops1[i]-ops0[i])
	}
	res.changes, res.repeats, res.viol = ch1-ch0, rep1-rep0, viol
	res.gaps = gaps
	for i := range gc1 {
		res.gapCount[i], res.gapSum[i] = gc1[i]-gc0[i], gs1[i]-gs0[i]
	}
	for i := range cpu1 {
		res.cpu = append(res.cpu, cpu1[i]-cpu0[i])
	}
	if viol != 0 {
		b.Errorf("%s: %d mutual-exclusion violations", cfg.kind, viol)
	}
	return res
}

// calibrate times a fixed CPU loop in one child alone, then in two children
// at once: ~1 means two CPUs really ran them in parallel, ~2 that they
// shared one.
func calibrate(c0, c1 *child) float64 {
	parse := func(l string) float64 {
		v, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
		return v
	}
	// Best of three each: the machine is shared, and noise only ever slows a loop down.
	var alone, both float64
	for i := 0; i < 3; i++ {
		c0.Send("calib")
		v := parse(c0.Expect("calib"))
		if i == 0 || v < alone {
			alone = v
		}
	}
	for i := 0; i < 3; i++ {
		c0.Send("calib")
		c1.Send("calib")
		v := (parse(c0.Expect("calib")) + parse(c1.Expect("calib"))) / 2
		if i == 0 || v < both {
			both = v
		}
	}
	return both / alone
}

// pinName names the pinning variants of a multi-process benchmark.
func pinName(pinned bool) string {
	if pinned {
		return "pinned"
	}
	return "unpinned"
}

// reportPinning records whether the children really ran pinned (CPUs they could use).
func reportPinning(b *testing.B, r loopResult) {
	b.ReportMetric(float64(r.cpus), "child-cpus")
}

// SHMLOCKS_BENCH_HOGS=N runs N CPU-bound processes beside a loop; none
// without it, and none is left after the loop.
func TestBenchHogs(t *testing.T) {
	t.Setenv("SHMLOCKS_BENCH_HOGS", "")
	pids, stop := startHogs(t)
	require.Empty(t, pids)
	stop()
	t.Setenv("SHMLOCKS_BENCH_HOGS", "2")
	pids, stop = startHogs(t)
	require.Len(t, pids, 2)
	for _, pid := range pids {
		_, err := os.Stat("/proc/" + strconv.Itoa(pid))
		require.NoError(t, err, "hog %d runs", pid)
	}
	stop()
	for _, pid := range pids {
		_, err := os.Stat("/proc/" + strconv.Itoa(pid))
		require.True(t, os.IsNotExist(err), "hog %d gone after stop", pid)
	}
}
