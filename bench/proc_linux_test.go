//go:build linux

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shmlocks/shmlocks/futex"
	"github.com/shmlocks/shmlocks/internal/proctest"

	"github.com/shmlocks/shmlocks/manager"
)

// Multi-process benchmarks (docs/benchmarks.md) re-exec this test binary as
// loop children (the role "bench" of internal/proctest).
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
	// ctlWaits: per requesting goroutine, the histogram of its waits and its
	// longest, at ctlWaits + waitStride64*(Index*Goroutines+g)
	// (bench_waits_linux_test.go).
	ctlWaits = ctlGOps + 64*ctlMaxG
	ctlSize  = ctlWaits + waitStride64*ctlMaxG
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
	Mode    manager.Mode
	CSIters int  // spinWork iterations inside the critical section
	Ping    bool // ping-pong: hold until the partner (index 1-Index) is about to request
	Calib   int  // spinWork iterations of the calibration loop
	Opts    *manager.OpenOptions
	Limit   time.Duration // bound of every wait
	Gaps    bool          // record the gaps between sections of different processes (SHMLOCKS_BENCH_GAPS)
	// Goroutines >= 1: that many goroutines loop greedily (benchLoopGoroutines).
	Goroutines int
}

func init() { childRoles["bench"] = benchChild }

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

// benchChild is the role "bench": args are the loop's role, the control
// file and the benchArgs (JSON).
func benchChild(args []string) int {
	var a benchArgs
	if err := json.Unmarshal([]byte(args[2]), &a); err != nil {
		fmt.Printf("error args %v\n", err)
		return 2
	}
	ctl, err := mapCtl(args[1])
	if err != nil {
		fmt.Printf("error ctl %v\n", err)
		return 2
	}
	var m *manager.Manager
	var fd int
	switch a.Kind {
	case kindShm:
		if m, err = manager.Open(a.Table, a.Opts); err != nil {
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
	for f := range proctest.Commands() {
		switch f[0] {
		case "calib":
			t0 := time.Now()
			spinWork(a.Calib)
			fmt.Printf("calib %d\n", time.Since(t0).Nanoseconds())
		case "go":
			loop := benchLoop
			if a.Goroutines >= 1 || a.Kind == kindChan || a.Kind == kindTicket {
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
			yield := f[0] == "share1"
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
func benchLoop(a benchArgs, ctl []byte, m *manager.Manager, fd int) (uint64, error) {
	stop := ctlWord32(ctl, ctlStop)
	ops := ctlWord64(ctl, ctlOps+64*a.Index)
	me := uint32(a.Index + 1)
	exclusive := a.Mode == manager.Exclusive
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
		fn := func(context.Context, *manager.Lock) error {
			if a.Ping {
				atomic.StoreUint32(wantMe, 0)
			}
			ok = critical()
			return nil
		}
		o := manager.RequestOptions{Mode: a.Mode}
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
func benchLongWait(a benchArgs, m *manager.Manager) (wall, cpu time.Duration, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), a.Limit)
	defer cancel()
	var r0, r1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &r0)
	t0 := time.Now()
	l, err := m.Acquire(ctx, a.Name, manager.RequestOptions{Mode: a.Mode})
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
