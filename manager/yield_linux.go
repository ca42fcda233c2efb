//go:build linux

package manager

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// osYield gives the processor to another runnable thread, of any process: a
// lock holder sharing this CPU gets to run and release. It alternates with
// Go's own yield so that this process's other goroutines run too.
func osYield(i int) {
	if i&1 == 0 {
		runtime.Gosched()
		return
	}
	unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
}

// cpuYield gives the processor to another runnable thread, of any process.
func cpuYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// cpusAllowed is the number of CPUs this process may run on.
func cpusAllowed() int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return runtime.NumCPU()
	}
	return set.Count()
}
