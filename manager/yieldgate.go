package manager

import (
	"runtime"
	"sync/atomic"
	"time"
)

// The yield gate: a Manager gives its CPU to the OS (sched_yield) so that
// the other processes on a crowded table run: they hold the name, or were
// just granted it (waitpolicy.go). That pays only while the threads the
// kernel runs instead are those processes. On a machine busy with other
// work (a build, a batch job: threads that never block), a yield hands the
// CPU to such a thread until the scheduler's next tick, and every grant
// waits for it: with two CPU-bound processes beside the 2-vCPU benchmark,
// 4 x 16 on a bounded table fell from 3.4M grants per second to 2k, 4 x 1
// from 5.1M to 68k, where flock kept 1.8-2.0M (docs/experiments.md).
//
// So the Manager watches its yields: one that comes back after lateYield
// or more is late. When lateMax of yieldWindow yields in a row of its yields
// were late, its yields give the P to its own goroutines only (Gosched)
// for offFor, which doubles (up to offMax) each time the yields that follow
// are late again, and starts over from offFirst once they are not. While
// the gate is closed a waiting request on a crowded table (more agents
// than the process's usable CPUs) parks at once rather than spin: a
// spinner shares its CPU with the other work by time slice, where a thread
// woken from a sleep goes ahead of it, as flock's waiters do (beside the
// same two processes, 8 x 2 0.48M → 2.48M grants per second, 4 x 16 1.1-1.3M
// → 1.47M, 4 x 1 2.3M → 3.05M; FIFO 4 x 1 0.62M → 1.20M). Without
// other work on the machine a yield is late about once in ten thousand (a
// thread of another locker that ran its whole slice), so the gate stays
// open. It decides who burns a CPU, never who is granted.
const (
	lateYield   = time.Millisecond
	yieldWindow = 16
	lateMax     = 8
	offFirst    = 100 * time.Millisecond
	offMax      = 1600 * time.Millisecond
)

// yieldGate is the Manager's record of its recent yields.
type yieldGate struct {
	yields   atomic.Uint32 // OS yields made (the window is every yieldWindow-th)
	late     atomic.Uint32 // late ones in the current window
	offUntil atomic.Int64  // m.mono() until which yields skip the OS (0: open)
	offFor   atomic.Int64  // the last closed period (0: the gate was open after it)

	osYieldHook func() // tests: called instead of cpuYield by osYield
}

// osYield gives the CPU to another runnable thread (cpuYield), or, while
// this Manager's recent yields came back late, the P to its own goroutines
// (runtime.Gosched).
func (m *Manager) osYield() {
	start := m.mono()
	if start < m.gate.offUntil.Load() {
		runtime.Gosched()
		return
	}
	if h := m.gate.osYieldHook; h != nil {
		h()
	} else {
		cpuYield()
	}
	end := m.mono()
	if end-start >= int64(lateYield) {
		m.gate.late.Add(1)
	}
	if m.gate.yields.Add(1)%yieldWindow != 0 {
		return
	}
	if m.gate.late.Swap(0) < lateMax {
		m.gate.offFor.Store(0)
		return
	}
	off := min(max(2*m.gate.offFor.Load(), int64(offFirst)), int64(offMax))
	m.gate.offFor.Store(off)
	m.gate.offUntil.Store(end + off)
}

// yieldsSkipped reports whether the gate is closed now: then a waiting
// request on a crowded table also parks at once instead of spinning
// (spinHead).
func (m *Manager) yieldsSkipped() bool {
	u := m.gate.offUntil.Load()
	return u != 0 && m.mono() < u
}
