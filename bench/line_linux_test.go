//go:build linux

package bench

import (
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// lineNs measures how long a cache line takes to cross between the first
// two CPUs this process may use: two threads, pinned one to each, hand a
// counter back and forth (n round trips); the result is half the mean
// round trip, in ns. 0 when fewer than two CPUs are usable, pinning fails,
// or the exchange takes over a second (the two threads then share a CPU).
//
// It explains the multi-process rows' two modes: on a guest whose vCPUs the
// hypervisor moves between host cores, the same row switched within seconds
// between two figures, and every run in the slow one had lines crossing in
// about 220 ns instead of about 50 (docs/benchmarks.md, "Two placements").
// A grant that crosses processes moves several lines between CPUs; flock,
// which lets the running process take the lock again, seldom does.
func lineNs(n int) float64 {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 0
	}
	var cpus []int
	for i := 0; i < 1024 && len(cpus) < 2; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) < 2 {
		return 0
	}
	var word atomic.Uint64
	var failed atomic.Bool
	limit := time.Now().Add(time.Second)
	// side pins its goroutine's thread to cpu and answers every value of
	// parity odd (0: it starts). It never unlocks the thread: the runtime
	// ends a locked thread whose goroutine returns, so no pinned thread goes
	// back to the pool.
	side := func(cpu int, odd uint64, ready *atomic.Int32, done chan<- time.Duration) {
		runtime.LockOSThread()
		var one unix.CPUSet
		one.Set(cpu)
		if unix.SchedSetaffinity(0, &one) != nil {
			failed.Store(true)
		}
		ready.Add(1)
		for ready.Load() < 2 && !failed.Load() {
			if time.Now().After(limit) {
				failed.Store(true)
			}
		}
		t0 := time.Now()
		for i := odd; i < uint64(2*n); i += 2 {
			for spins := 0; word.Load() != i; spins++ {
				if spins&0xffff == 0xffff && (failed.Load() || time.Now().After(limit)) {
					failed.Store(true)
					done <- 0
					return
				}
			}
			word.Store(i + 1)
		}
		done <- time.Since(t0)
	}
	var ready atomic.Int32
	done := make(chan time.Duration, 2)
	go side(cpus[0], 0, &ready, done)
	go side(cpus[1], 1, &ready, done)
	d0, d1 := <-done, <-done
	if failed.Load() {
		return 0
	}
	return float64(max(d0, d1).Nanoseconds()) / float64(n) / 2
}

// lineTrips is lineNs's round trips in runLoop: 20-50 ms here.
const lineTrips = 50_000
