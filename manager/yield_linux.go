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
