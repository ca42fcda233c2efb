//go:build linux

package manager

import (
	"runtime"

	"golang.org/x/sys/unix"
)

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
