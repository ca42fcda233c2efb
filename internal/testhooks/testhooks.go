// Package testhooks holds the two places where the tests of this module
// reach inside the lock table: the crash points of its multi-step updates
// and a deliberately broken mutual exclusion. The table (and the record
// stores of internal/seam) call Crash and read BreakExclusion; the tests
// of any package, and stress's fault injection, set them. Nothing here is
// public API, and in a process that sets nothing both cost one atomic load.
package testhooks

import "sync/atomic"

var crashHook atomic.Pointer[func(point string)]

// Crash marks a crash point: the hook set by SetCrash, if any, is called
// with its name (table.CrashPoints lists the table's points). A test's hook
// SIGKILLs the process at one point, or pauses it there.
func Crash(point string) {
	if f := crashHook.Load(); f != nil {
		(*f)(point)
	}
}

// SetCrash makes Crash call f (nil: nothing).
func SetCrash(f func(point string)) {
	if f == nil {
		crashHook.Store(nil)
		return
	}
	crashHook.Store(&f)
}

// BreakExclusion, when true, makes every request of this process grantable
// at once: a broken lock, for proving that the stress checkers notice.
var BreakExclusion atomic.Bool

// FairnessSkew is added to this process's clock where a bounded table
// decides how long its queued requests have waited (table/fairness.go), so
// that a test can make requests look as old as it needs (a second half of
// an hour-long bound) without waiting.
var FairnessSkew atomic.Int64

// TurnEvery, when not 0, makes every Manager of this process on a table of
// bounded fairness hand the name to its own oldest queued request at every
// TurnEvery-th grant of a name (manager/turns.go), crowded table or not,
// so that a test can make a release a turn when it needs one.
var TurnEvery atomic.Uint64
