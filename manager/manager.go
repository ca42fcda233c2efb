package manager

import (
	"fmt"
	"sync/atomic"

	"github.com/shmlocks/shmlocks/manager/internal/wake"
)

// Manager is one agent of a lock table: the handle through which a process
// requests, holds and releases locks. It is safe for concurrent use.
//
// Its state is in named parts, each declared and documented by the file
// that owns it.
type Manager struct {
	life  lifecycle     // the table and our agent in it (or the backend); open, closing, closed (lifecycle.go)
	cfg   settings      // what OpenOptions set for the waits (options.go)
	dl    deadlockState // this Manager's deadlock checks (deadlock.go)
	held  registry      // our granted locks whose loss is watched, by slot (registry.go)
	obs   observers     // our watches of names (WaitUnlocked, Watch), by slot (observe.go)
	stats *stats        // nil unless OpenOptions.Stats; written once by Open
	log   eventLog      // OpenOptions.Logger (events.go)

	waits waiters     // our parked requests, and mu, which guards them (waitlist.go)
	dw    doneWatches // the Done channels of parked requests watched once for all (donewatch.go)
	view  machineView // the waiting policy's view of the machine (waitpolicy.go)
	turn  turnState   // who yields the P at a release (turns.go)
	gate  yieldGate   // whether our OS yields still pay (yieldgate.go)

	wk        wakes        // whom a grant wakes, the last scan's words (scan.go)
	bell      *wake.Bell   // our doorbell and its loop (manager/internal/wake)
	reaper    *wake.Reaper // our death watcher (manager/internal/wake)
	lastInWay atomic.Int64 // unix ns of the last reapHolders look (reap.go)
}

// errNeverOpened is what every method of a zero Manager (not made by Open
// or NewBackendManager) returns.
var errNeverOpened = fmt.Errorf("%w: the Manager was never opened (make one with Open)", ErrClosed)

// unopened reports whether m is a zero Manager.
func (m *Manager) unopened() bool { return m.life.t == nil && m.life.be == nil }

// ClientID is an opaque identifier, unique per Manager and stable for its life.
func (m *Manager) ClientID() string { return m.life.clientID }

// Path returns the table file's path.
func (m *Manager) Path() string { return m.life.path }

// Check runs the table's consistency checker on the live table.
func (m *Manager) Check() error {
	if m.unopened() {
		return errNeverOpened
	}
	if !m.enter() {
		return ErrClosed
	}
	if m.life.be != nil {
		m.leave()
		return nil
	}
	defer m.leave()
	return m.life.t.Check(m.life.a)
}
