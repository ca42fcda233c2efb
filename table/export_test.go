package table

import "github.com/shmlocks/shmlocks/internal/testhooks"

// The test hooks of this package's tests: the liveness check (Alive) and
// the crash points (internal/testhooks, shared with the tests of the
// packages built on the table).

// setLiveness replaces Alive's check (nil restores the default).
func setLiveness(f func(id Identity) bool) {
	if f == nil {
		livenessHook.Store(nil)
		return
	}
	livenessHook.Store(&f)
}

// setCrashHook makes every crash point call f (nil: nothing).
func setCrashHook(f func(point string)) { testhooks.SetCrash(f) }
