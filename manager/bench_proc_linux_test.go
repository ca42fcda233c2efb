//go:build linux

package manager

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/shmlocks/shmlocks/futex"
)

// Multi-process benchmarks (docs/benchmarks.md) re-exec this test binary as
// loop children (TestBenchHelperProcess, selected by SHMLOCKS_BENCH_ROLE).
// A child prepares (opens the table, the flock file), prints
//
//	ready PID GOMAXPROCS CPUS
//
// and then obeys one command per stdin line:
//
//	calib  -> "calib NS": time a fixed CPU loop (alone, or at once with others)
//	go     -> run the loop until the control file's stop word is set, then
//	          "done OPS" and exit
//	wait   -> (role longwait) request the name once, "waited WALLNS CPUNS"
//
// The loops count into a shared control file (mapped MAP_SHARED): per-process
// operation counters on their own cache lines, and, written under the lock,
// the last owner, the number of ownership changes and of re-acquisitions by
// the same process, and a mutual-exclusion check. The parent samples the
// counters over a window after a warm-up, so process start and stop do not
// count. Every wait is bounded: a context deadline for shmlocks, a futex
// timeout with a stop check, and a watchdog that ends a stuck child.
const (
	envBenchRole = "SHMLOCKS_BENCH_ROLE"
	envBenchCtl  = "SHMLOCKS_BENCH_CTL"
	envBenchArgs = "SHMLOCKS_BENCH_ARGS"
)

// Control file layout (byte offsets; every field on its own cache line).
const (
	ctlStop    = 0    // uint32: the parent sets 1 to end the loops
	ctlOwner   = 64   // uint32: index+1 of the last process granted (exclusive kinds)
	ctlChanges = 128  // uint64: grants to a different process than the previous one
	ctlRepeats = 192  // uint64: grants to the same process as the previous one
	ctlTurn    = 256  // uint32: the futex ping-pong's turn word
	ctlInCS    = 320  // uint32: index+1 of the process inside the critical section
	ctlViol    = 384  // uint64: mutual-exclusion violations seen
	ctlWants   = 448  // uint32 per ping-pong process, at ctlWants + 64*index: about to request
	ctlGapEnd  = 576  // int64: unix ns when the last critical section ended (SHMLOCKS_BENCH_GAPS)
	ctlGapWho  = 584  // uint32: index+1 of the process whose section that was
	ctlOps     = 1024 // uint64 per process, at ctlOps + 64*index
	ctlMaxProc = 48
	ctlGaps    = ctlOps + 64*ctlMaxProc // gapBuckets uint64 counts, then as many sums (ns)
	// ctlGOps: uint64 per requesting goroutine, at ctlGOps + 64*(Index*Goroutines+g),
	// when the children run several goroutines (bench_goroutines_linux_test.go).
	ctlGOps = (ctlGaps + 2*8*gapBuckets + 63) &^ 63
	ctlMaxG = 256
	ctlSize = ctlGOps + 64*ctlMaxG
	// gapBuckets: the gap between one process's critical section and the
	// next one's, in 100 ns buckets; the last one holds every gap of 3 µs
	// or more (a stall: the next holder was off its CPU, or asleep).
	gapBuckets = 31
)

// Loop kinds.
const (
	kindShm   = "shm"   // manager.Request on one name
	kindFlock = "flock" // flock(2) on one file, LOCK_EX (or LOCK_SH when Shared)
	kindFutex = "futex" // strict two-process ping-pong on a futex word
)

// benchArgs configure one child.
type benchArgs struct {
	Kind    string
	Table   string
	Flock   string
	Name    string
	Index   int
	Mode    Mode
	CSIters int  // spinWork iterations inside the critical section
	Ping    bool // ping-pong: hold until the partner (index 1-Index) is about to request
	Calib   int  // spinWork iterations of the calibration loop
	Opts    *OpenOptions
	Limit   time.Duration // bound of every wait
	Gaps    bool          // record the gaps between sections of different processes (SHMLOCKS_BENCH_GAPS)
	// Goroutines > 1: that many goroutines loop greedily (benchLoopGoroutines).
	Goroutines int
}

func TestBenchHelperProcess(t *testing.T) {
	role := os.Getenv(envBenchRole)
	if role == "" {
		t.Skip("helper process for the multi-process benchmarks")
	}
	time.AfterFunc(90*time.Second, func() {
		fmt.Println("error watchdog bench child stuck for 90s")
		os.Exit(3)
	})
	os.Exit(benchChild(role))
}

// benchSink keeps spinWork from being optimised away.
var benchSink atomic.Uint64

// spinWork burns CPU for n iterations of a xorshift step (no memory traffic).
func spinWork(n int) {
	x := benchSink.Load() | 1
	for i := 0; i < n; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	benchSink.Store(x)
}

var (
	itersOnce  sync.Once
	itersPerUS float64
)

// spinItersPerMicro measures spinWork's speed in this process (best of 5).
func spinItersPerMicro() float64 {
	itersOnce.Do(func() {
		const n = 2_000_000
		best := time.Duration(1 << 62)
		for i := 0; i < 5; i++ {
			t0 := time.Now()
			spinWork(n)
			if d := time.Since(t0); d < best {
				best = d
			}
		}
		itersPerUS = n / (float64(best) / 1e3)
	})
	return itersPerUS
}

// recordGap adds to the gap histogram the time since the critical section
// of another process ended (called by the process whose section begins).
func recordGap(ctl []byte, me uint32) {
	end := atomic.LoadInt64((*int64)(unsafe.Pointer(&ctl[ctlGapEnd])))
	if end == 0 || atomic.LoadUint32(ctlWord32(ctl, ctlGapWho)) == me {
		return
	}
	g := time.Now().UnixNano() - end
	if g < 0 {
		g = 0
	}
	i := gapBuckets - 1
	if g < int64(i)*100 {
		i = int(g / 100)
	}
	atomic.AddUint64(ctlWord64(ctl, ctlGaps+8*i), 1)
	atomic.AddUint64(ctlWord64(ctl, ctlGaps+8*(gapBuckets+i)), uint64(g))
}

func ctlWord32(b []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }
func ctlWord64(b []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&b[off])) }

func mapCtl(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return unix.Mmap(int(f.Fd()), 0, ctlSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

func benchChild(role string) int {
	var a benchArgs
	if err := json.Unmarshal([]byte(os.Getenv(envBenchArgs)), &a); err != nil {
		fmt.Printf("error args %v\n", err)
		return 2
	}
	ctl, err := mapCtl(os.Getenv(envBenchCtl))
	if err != nil {
		fmt.Printf("error ctl %v\n", err)
		return 2
	}
	var m *Manager
	var fd int
	switch a.Kind {
	case kindShm:
		if m, err = Open(a.Table, a.Opts); err != nil {
			fmt.Printf("error open %v\n", err)
			return 2
		}
		defer m.Close()
	case kindFlock:
		f, err := os.OpenFile(a.Flock, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			fmt.Printf("error flock open %v\n", err)
			return 2
		}
		defer f.Close()
		fd = int(f.Fd())
	}
	var cpus unix.CPUSet
	unix.SchedGetaffinity(0, &cpus)
	fmt.Printf("ready %d %d %d\n", os.Getpid(), runtime.GOMAXPROCS(0), cpus.Count())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch strings.TrimSpace(in.Text()) {
		case "calib":
			t0 := time.Now()
			spinWork(a.Calib)
			fmt.Printf("calib %d\n", time.Since(t0).Nanoseconds())
		case "go":
			loop := benchLoop
			if a.Goroutines > 1 || a.Kind == kindChan || a.Kind == kindTicket {
				loop = benchLoopGoroutines
			}
			ops, err := loop(a, ctl, m, fd)
			if err != nil {
				fmt.Printf("error loop %v\n", err)
				return 2
			}
			fmt.Printf("done %d\n", ops)
			return 0
		case "share0", "share1":
			// 1 s of 1 µs work units, with a sched_yield after each unit
			// (share1) or none (share0): BenchmarkYieldShare.
			perUS := int(spinItersPerMicro())
			yield := strings.TrimSpace(in.Text()) == "share1"
			var units uint64
			for end := time.Now().Add(time.Second); time.Now().Before(end); units++ {
				spinWork(perUS)
				if yield {
					schedYield()
				}
			}
			fmt.Printf("share %d\n", units)
		case "wait":
			wall, cpu, err := benchLongWait(a, m)
			if err != nil {
				fmt.Printf("error wait %v\n", err)
				return 2
			}
			fmt.Printf("waited %d %d\n", wall.Nanoseconds(), cpu.Nanoseconds())
		}
	}
	return 0
}

// schedYield gives the CPU to another runnable thread of this CPU, if any
// (runtime.Gosched only switches goroutines).
func schedYield() { syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }

// benchLoop runs the child's loop until the stop word is set.
//
// Without Ping it is a greedy loop: lock, critical section, unlock, again.
// With Ping (two processes, exclusive) each ownership is a handoff:
//
//	wants[me] = 1; lock; wants[me] = 0
//	if I held it last: unlock, yield, retry (the partner has not had it yet; counted as a repeat)
//	else: wait (yielding the CPU) until wants[partner] = 1; unlock
//
// so the unlock always happens while the partner is about to request or
// already waiting. With a FIFO lock the partner is normally queued and the
// unlock is a grant to it; flock lets the releaser barge back in, which shows
// as repeats.
func benchLoop(a benchArgs, ctl []byte, m *Manager, fd int) (uint64, error) {
	stop := ctlWord32(ctl, ctlStop)
	ops := ctlWord64(ctl, ctlOps+64*a.Index)
	me := uint32(a.Index + 1)
	exclusive := a.Mode == Exclusive
	owner, inCS := ctlWord32(ctl, ctlOwner), ctlWord32(ctl, ctlInCS)
	changes, repeats, viol := ctlWord64(ctl, ctlChanges), ctlWord64(ctl, ctlRepeats), ctlWord64(ctl, ctlViol)
	var wantMe, wantPartner *uint32
	if a.Ping {
		wantMe = ctlWord32(ctl, ctlWants+64*a.Index)
		wantPartner = ctlWord32(ctl, ctlWants+64*(1-a.Index))
	}
	// critical runs while the lock is held; false: a ping-pong repeat.
	critical := func() bool {
		if !exclusive {
			spinWork(a.CSIters)
			return true
		}
		if !atomic.CompareAndSwapUint32(inCS, 0, me) {
			atomic.AddUint64(viol, 1)
		}
		defer atomic.CompareAndSwapUint32(inCS, me, 0)
		if atomic.LoadUint32(owner) == me {
			atomic.AddUint64(repeats, 1)
			if a.Ping {
				return false
			}
		} else {
			atomic.StoreUint32(owner, me)
			atomic.AddUint64(changes, 1)
			if a.Gaps {
				recordGap(ctl, me)
			}
		}
		if a.Gaps {
			defer func() {
				atomic.StoreInt64((*int64)(unsafe.Pointer(&ctl[ctlGapEnd])), time.Now().UnixNano())
				atomic.StoreUint32(ctlWord32(ctl, ctlGapWho), me)
			}()
		}
		spinWork(a.CSIters)
		if a.Ping {
			for atomic.LoadUint32(wantPartner) == 0 && atomic.LoadUint32(stop) == 0 {
				schedYield()
			}
		}
		return true
	}
	var n uint64
	done := func(ok bool) {
		if ok {
			n++
			atomic.AddUint64(ops, 1)
		} else {
			schedYield()
		}
	}
	switch a.Kind {
	case kindShm:
		ctx, cancel := context.WithTimeout(context.Background(), a.Limit)
		defer cancel()
		var ok bool
		fn := func(context.Context, *Lock) error {
			if a.Ping {
				atomic.StoreUint32(wantMe, 0)
			}
			ok = critical()
			return nil
		}
		o := RequestOptions{Mode: a.Mode}
		for atomic.LoadUint32(stop) == 0 {
			if a.Ping {
				atomic.StoreUint32(wantMe, 1)
			}
			if err := m.Request(ctx, a.Name, o, fn); err != nil {
				return n, err
			}
			done(ok)
		}
	case kindFlock:
		how := syscall.LOCK_EX
		if !exclusive {
			how = syscall.LOCK_SH
		}
		for atomic.LoadUint32(stop) == 0 {
			if a.Ping {
				atomic.StoreUint32(wantMe, 1)
			}
			if err := syscall.Flock(fd, how); err != nil {
				return n, err
			}
			if a.Ping {
				atomic.StoreUint32(wantMe, 0)
			}
			ok := critical()
			if err := syscall.Flock(fd, syscall.LOCK_UN); err != nil {
				return n, err
			}
			done(ok)
		}
	case kindFutex:
		// Strict alternation between index 0 and 1: wait for our turn, pass it on.
		turn := ctlWord32(ctl, ctlTurn)
		mine, next := uint32(a.Index), uint32(1-a.Index)
		for atomic.LoadUint32(stop) == 0 {
			for v := atomic.LoadUint32(turn); v != mine; v = atomic.LoadUint32(turn) {
				if atomic.LoadUint32(stop) != 0 {
					return n, nil
				}
				if err := futex.Wait(turn, v, 50*time.Millisecond); err != nil {
					return n, err
				}
			}
			critical()
			atomic.StoreUint32(turn, next)
			if _, err := futex.Wake(turn, 1); err != nil {
				return n, err
			}
			done(true)
		}
		// Let the partner out of its wait.
		atomic.StoreUint32(turn, next)
		futex.Wake(turn, 1)
	default:
		return 0, fmt.Errorf("unknown kind %q", a.Kind)
	}
	return n, nil
}

// benchLongWait requests the name once (the parent holds it) and reports the
// wall time of the wait and the CPU time (user+system, the whole process)
// spent during it.
func benchLongWait(a benchArgs, m *Manager) (wall, cpu time.Duration, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), a.Limit)
	defer cancel()
	var r0, r1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &r0)
	t0 := time.Now()
	l, err := m.Acquire(ctx, a.Name, RequestOptions{Mode: a.Mode})
	wall = time.Since(t0)
	unix.Getrusage(unix.RUSAGE_SELF, &r1)
	if err != nil {
		return 0, 0, err
	}
	l.Release()
	tv := func(r *unix.Rusage) time.Duration {
		return time.Duration(r.Utime.Nano() + r.Stime.Nano())
	}
	return wall, tv(&r1) - tv(&r0), nil
}

// ---- parent side ----

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

// startBenchChild re-execs the test binary as a loop child and waits for "ready".
func startBenchChild(b testing.TB, role, ctlPath string, a benchArgs, cpu int) benchChildInfo {
	b.Helper()
	exe, err := os.Executable()
	require.NoError(b, err)
	cmd := exec.Command(exe, "-test.run=^TestBenchHelperProcess$", "-test.v=false")
	js, _ := json.Marshal(a)
	cmd.Env = append(os.Environ(), envBenchRole+"="+role, envBenchCtl+"="+ctlPath, envBenchArgs+"="+string(js))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(b, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, startPinned(cmd, cpu))
	c := &child{t: b, cmd: cmd, stdin: stdin, lines: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	b.Cleanup(c.kill)
	f := strings.Fields(c.expect("ready"))
	c.pid, _ = strconv.Atoi(f[1])
	mp, _ := strconv.Atoi(f[2])
	nc, _ := strconv.Atoi(f[3])
	return benchChildInfo{child: c, maxprocs: mp, cpus: nc}
}

// loopCfg describes one multi-process loop measurement.
type loopCfg struct {
	kind    string
	procs   int
	mode    Mode
	csIters int
	ping    bool
	pinned  bool
	opts    *OpenOptions // shm children's OpenOptions (nil: defaults)
	calib   bool         // measure the two-processes-vs-one calibration first
	warmup  time.Duration
	window  time.Duration

	// goroutines > 1: requesting goroutines per child (per-goroutine counts in gops)
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
	cpu      []time.Duration // per process: CPU time in the window (all threads, /proc schedstat)
	maxprocs int             // GOMAXPROCS and CPUs of the children (from child 0)
	cpus     int
	gaps     bool               // gapCount and gapSum were recorded
	gapCount [gapBuckets]uint64 // ownership changes in the window, by gap (100 ns buckets)
	gapSum   [gapBuckets]uint64 // their gaps, ns
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
func (r loopResult) maxMin() float64 {
	lo, hi := r.ops[0], r.ops[0]
	for _, v := range r.ops {
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

// runLoop spawns cfg.procs children, starts them together, samples their
// counters over the window and stops them.
func runLoop(b testing.TB, cfg loopCfg) loopResult {
	b.Helper()
	dir := b.TempDir()
	ctlPath := filepath.Join(dir, "ctl")
	require.NoError(b, os.WriteFile(ctlPath, make([]byte, ctlSize), 0o600))
	ctl, err := mapCtl(ctlPath)
	require.NoError(b, err)
	defer unix.Munmap(ctl)
	if cfg.opts == nil && cfg.kind == kindShm {
		// SHMLOCKS_BENCH_SPIN sets the children's SpinLimit (a diagnostic knob; "-1ns": never spin).
		if d, err := time.ParseDuration(os.Getenv("SHMLOCKS_BENCH_SPIN")); err == nil && d != 0 {
			cfg.opts = &OpenOptions{SpinLimit: d}
		}
	}
	tablePath := filepath.Join(dir, "bench.tbl")
	if cfg.kind == kindShm {
		// Create the table before the children race to.
		m, err := Open(tablePath, nil)
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
	for _, k := range kids {
		k.send("go")
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
		if ng == 1 {
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
			c[i] = procCPU(k.pid)
		}
		return c
	}
	time.Sleep(cfg.warmup)
	cpu0 := cpuNow()
	gc0, gs0 := readGaps()
	t0, ops0, ch0, rep0, _ := read()
	time.Sleep(cfg.window)
	t1, ops1, ch1, rep1, viol := read()
	gc1, gs1 := readGaps()
	cpu1 := cpuNow()
	atomic.StoreUint32(ctlWord32(ctl, ctlStop), 1)
	for _, k := range kids {
		k.expect("done")
		k.wait()
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
		c0.send("calib")
		v := parse(c0.expect("calib"))
		if i == 0 || v < alone {
			alone = v
		}
	}
	for i := 0; i < 3; i++ {
		c0.send("calib")
		c1.send("calib")
		v := (parse(c0.expect("calib")) + parse(c1.expect("calib"))) / 2
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
