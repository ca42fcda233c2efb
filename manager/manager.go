package manager

import (
	"fmt"
	"sync/atomic"
)

// Manager is one agent of a lock table: the handle through which a process
// requests, holds and releases locks. It is safe for concurrent use.
//
// Its state is in parts, each declared and documented by the file that owns
// it: the Manager's life (lifecycle: the table, its agent, open or
// closed), the options of its waits (settings), its parked requests (waiters,
// waitlist.go, and the Done channels they share, doneWatches,
// donewatch.go), the wake-ups it receives (wakes, scan.go), its view of the
// machine for the waiting policy (machineView, waitpolicy.go), the turn
// rules (turnState, turns.go), its yields' record (yieldGate,
// yieldgate.go), the death watcher (reaper), its registries
// of watched locks and observers, its counters and its log.
type Manager struct {
	lifecycle               // the table and our agent in it (or the backend); open, closing, closed (lifecycle.go)
	settings                // what OpenOptions set for the waits (options.go)
	dl        deadlockState // this Manager's deadlock checks (deadlock.go)
	held      registry      // our granted locks whose loss is watched, by slot (registry.go)
	obs       observers     // our watches of names (WaitUnlocked, Watch), by slot (observe.go)

	waiters     // our parked requests, and mu, which guards them (waitlist.go)
	doneWatches // the Done channels of parked requests watched once for all (donewatch.go)

	wakes                    // the doorbell, the bell loop and whom a grant wakes (scan.go)
	machineView              // the waiting policy's view of the machine (waitpolicy.go)
	turnState                // who yields the P at a release (turns.go)
	yieldGate                // whether our OS yields still pay (yieldgate.go)
	lastInWay   atomic.Int64 // unix ns of the last reapHolders look (reap.go)

	stats *stats   // nil unless OpenOptions.Stats; written once by Open
	log   eventLog // OpenOptions.Logger (events.go)
}

// errNeverOpened is what every method of a zero Manager (not made by Open
// or NewBackendManager) returns.
var errNeverOpened = fmt.Errorf("%w: the Manager was never opened (make one with Open)", ErrClosed)

// unopened reports whether m is a zero Manager.
func (m *Manager) unopened() bool { return m.t == nil && m.be == nil }

// ClientID is an opaque identifier, unique per Manager and stable for its life.
func (m *Manager) ClientID() string { return m.clientID }

// Path returns the table file's path.
func (m *Manager) Path() string { return m.path }

// Check runs the table's consistency checker on the live table.
func (m *Manager) Check() error {
	if m.unopened() {
		return errNeverOpened
	}
	if !m.enter() {
		return ErrClosed
	}
	if m.be != nil {
		m.leave()
		return nil
	}
	defer m.leave()
	return m.t.Check(m.a)
}
