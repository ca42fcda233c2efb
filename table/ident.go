package table

import "sync/atomic"

// Identity says who a process is, in a way a recycled PID cannot fake: the
// PID, the process start time (clock ticks since boot, Linux) and a hash of
// the boot id of the running kernel.
type Identity struct {
	PID   int
	Start uint64
	Boot  uint64
}

// Liveness answers whether the process with this identity is still running.
// A zombie (exited, not yet waited for) counts as dead.
type Liveness func(id Identity) bool

var liveness atomic.Pointer[Liveness]

// SetLiveness replaces the liveness check (nil restores the default). For tests.
func SetLiveness(f Liveness) {
	if f == nil {
		liveness.Store(nil)
		return
	}
	liveness.Store(&f)
}

// Alive reports whether id names a running process of this boot.
func Alive(id Identity) bool {
	if f := liveness.Load(); f != nil {
		return (*f)(id)
	}
	if id.Boot != selfIdentity.Boot {
		return false
	}
	return processAlive(id.PID, id.Start)
}

// Self is the identity of the calling process.
func Self() Identity { return selfIdentity }

var selfIdentity = readSelfIdentity()
