package manager

import (
	"context"
	"github.com/shmlocks/shmlocks/manager/internal/wake"

	"github.com/shmlocks/shmlocks/table"
)

// Internals the tests of this package (and its external test package) use.

// Table returns the table behind m.
func (m *Manager) Table() *table.Table { return m.life.t }

// Agent returns m's agent record.
func (m *Manager) Agent() *table.Agent { return m.life.a }

// ParkedCount returns how many requests of m are parked, and how many of
// them are registered with a done watch.
func ParkedCount(m *Manager) (parked, watched int) {
	m.waits.mu.Lock()
	defer m.waits.mu.Unlock()
	m.eachWaiter(func(w *waiter) {
		parked++
		if w.dw != nil {
			watched++
		}
	})
	return parked, watched
}

// KidsWaiting is the number of child requests of p waiting for its other
// children.
func KidsWaiting(p *Lock) int {
	e := p.ext.Load()
	if e == nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.kids == nil {
		return 0
	}
	return len(e.kids.queue)
}

// CarriedRefs are the holds ctx carries (a child grant's, for deadlock tags).
func CarriedRefs(ctx context.Context) []table.Ref { return carriedRefs(ctx) }

// ClosedParkHook, when set, runs in Close while it waits for parked requests.
var ClosedParkHook = &closedParkHook

// RoundsStopped reports whether m has no parked request and no deadlock
// round scheduled.
func RoundsStopped(m *Manager) bool {
	m.waits.mu.Lock()
	defer m.waits.mu.Unlock()
	return !m.dl.armed && m.waits.nwait == 0
}

// RoundsEpoch is the number of deadlock rounds m has run.
func RoundsEpoch(m *Manager) uint64 {
	m.waits.mu.Lock()
	defer m.waits.mu.Unlock()
	return m.dl.epoch
}

// BellLoops is the number of rounds m's bell loop has done.
func BellLoops(m *Manager) uint64 { return m.bell.Loops() }

// OwnWaiting reports whether a request of m is parked or spinning (what a
// turn needs).
func OwnWaiting(m *Manager) bool { return m.ownWaiting() }

// ScanAll is one look of the bell loop at every waiting request and held
// lock of m (when m is open).
func ScanAll(m *Manager) {
	if m.enter() {
		m.scan(true)
		m.leave()
	}
}

// SetVictimHook makes a deadlock victim run f before it withdraws (before
// any Manager is opened).
func SetVictimHook(f func()) { victimHook = f }

// WatchLooks is the number of latched looks at the table by m's watches.
func WatchLooks(m *Manager) int64 { return m.obs.looks.Load() }

// SafetyScan is the period of the bell loop's look when nothing rang.
const SafetyScan = wake.SafetyScan

// WaitBounds are the upper bounds of the wait histogram's buckets (Stats).
var WaitBounds = waitBounds
