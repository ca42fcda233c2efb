package manager

import (
	"sync/atomic"

	"github.com/shmlocks/shmlocks/table"
)

// What the bell loop does on a ring (and on its periodic safety scan):
// wake the parked requests whose slot changed or that became the head of
// their queue, and mark lost the held locks that were stolen.

// wakes are how a Manager wakes others and scans for its own wake-ups: the
// functions a grant's wakes are delivered with (bound once, so that a
// delivery allocates nothing) and the sequence words at the last scan. Its
// doorbell and death watcher are the Manager's bell and reaper.
type wakes struct {
	ringFn   func(agent uint32, nonce uint64) // ring
	pokeFn   func(slot uint32)                // pokeSlot
	faultFn  func()                           // noteFault (EndGuard's onFault)
	lastBell atomic.Uint32                    // the bell word at the last scan
	lastStl  atomic.Uint32                    // the steal word at the last scan
}

// scan looks at every waiting request and held lock of this Manager: wakes
// the waiters whose slot changed and marks lost the locks that were stolen.
// With force it looks even if the sequence words did not change.
func (m *Manager) scan(force bool) {
	bell := atomic.LoadUint32(m.life.a.Bell())
	if m.wk.lastBell.Swap(bell) != bell || force {
		m.scanWaiters(force)
	}
	stl := atomic.LoadUint32(m.life.a.StealSeq())
	if m.wk.lastStl.Swap(stl) != stl || force {
		m.scanHeld()
	}
}

// scanWaiters wakes every waiter whose slot is no longer waiting, and every
// one that became the head of its queue and has not spun yet. Per name it
// looks only at the requests up to the first one still waiting (see
// waitList); with all it looks at every waiter (after a reap, which may
// remove requests anywhere in a queue, and on the periodic safety scan).
func (m *Manager) scanWaiters(all bool) {
	m.scanObservers() // a ring may be for a watch (observe.go)
	m.waits.mu.Lock()
	defer m.waits.mu.Unlock() // also when a read of a truncated file faults (Guard)
	for _, q := range m.waits.queues {
		for w := q.head; w != nil; w = w.next {
			st, _, ok := m.life.t.Status(m.life.a, w.ref)
			waiting := ok && st == table.SlotWaiting
			// A head of a bounded table is poked even after it spun: it may
			// have been left its name (fairness.go).
			if !waiting || ((!w.spun.Load() || m.cfg.bounded) && m.life.t.IsHead(m.life.a, w.ref)) {
				w.poke()
			}
			if waiting && !all {
				break
			}
		}
	}
}

// pokeAll asks every parked waiter (and watch) to look at its slot again.
func (m *Manager) pokeAll() {
	m.pokeObservers()
	m.waits.mu.Lock()
	m.eachWaiter(func(w *waiter) { w.poke() })
	m.waits.mu.Unlock()
}

// scanHeld marks lost every registered lock whose slot is no longer held by
// us. It reads nothing of a Lock but its atomic state word: the registry
// index is the slot, and the Lock is changed only by a CAS on the held
// state word it validated.
func (m *Manager) scanHeld() { m.held.each(m.loseIfGone) }

// loseIfGone marks the Lock of registration e (at slot) lost if the grant
// it was registered for is no longer held by us. It reads nothing of the
// Lock but its state word. The registration must still be the slot's
// current one: an entry's reserved slot serves one grant after another, so
// a registration seen by an earlier look at the registry may be of a grant
// that has ended, while another grant's Lock is registered at the same slot.
func (m *Manager) loseIfGone(slot uint32, e *regEntry) {
	l := e.l
	word := l.state.Load()
	if word&stateMask != lockHeld || m.held.load(slot) != e {
		return // released, re-granted elsewhere, or registered anew
	}
	if m.life.t.Holds(m.life.a, table.Ref{Slot: slot, Serial: e.serial}) {
		return
	}
	st, serial, mine := m.life.t.SlotState(m.life.a, slot)
	if l.markLost(word, lockStolen) {
		// Lost for good (a Lock serves one grant), so its name is stable.
		m.noteLost(l)
		m.held.dropEntry(slot, e)
		if mine && st == table.SlotStolen && serial == e.serial {
			m.life.t.FreeStolen(m.life.a, table.Ref{Slot: slot, Serial: serial})
		}
	}
}

// ring is called by Deliver for an agent that must be woken.
func (m *Manager) ring(agent uint32, nonce uint64) {
	if m.life.a != nil && agent == m.life.a.Idx {
		m.scan(false)
		return
	}
	if !m.life.t.SameNetNS(agent) {
		// Its abstract doorbell may not exist in this network namespace:
		// ring through the table (its sentinel thread wakes on it).
		m.life.t.RingAcross(agent)
	}
	m.bell.Ring(nonce)
}

// deliver delivers w: a sleeping request of this Manager that was granted
// or made the head is poked directly (pokeSlot), every other agent rung.
// It returns how many requests of ours it poked.
func (m *Manager) deliver(w *table.Wakes) int {
	return m.life.t.DeliverLocal(w, m.life.a.Idx, m.wk.pokeFn, m.wk.ringFn)
}

// pokeSlot pokes the parked waiter of ours at slot s, if any. A waiter
// is indexed before it sets its park mark, and a poke only makes it look
// at its slot again, so a poke for a waiter that has just left (or for
// the next request parked at the same slot) costs one look.
func (m *Manager) pokeSlot(s uint32) {
	if w := m.waits.bySlot.load(s); w != nil {
		w.poke()
	}
}

// wakeHost is the Manager as package wake calls it back (cold paths).
type wakeHost struct{ m *Manager }

func (h wakeHost) Enter() bool        { return h.m.enter() }
func (h wakeHost) Leave()             { h.m.leave() }
func (h wakeHost) Scan(force bool)    { h.m.scan(force) }
func (h wakeHost) NoteFault()         { h.m.noteFault() }
func (h wakeHost) ReapAll()           { h.m.reap() }
func (h wakeHost) ReapOne(idx uint32) { h.m.reapOne(idx) }
func (h wakeHost) Busy() bool {
	h.m.waits.mu.Lock()
	n := h.m.waits.nwait
	h.m.waits.mu.Unlock()
	return n > 0 || h.m.watching()
}
