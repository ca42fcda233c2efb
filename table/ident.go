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

// livenessHook, when set, replaces Alive's check (the tests of this
// package, export_test.go).
var livenessHook atomic.Pointer[func(id Identity) bool]

// Alive reports whether id names a running process of this boot.
func Alive(id Identity) bool {
	if f := livenessHook.Load(); f != nil {
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
