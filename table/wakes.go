package table

import "sync/atomic"

// Who is told after a table operation, and how: the agents noted under
// the latch are rung after it is released (docs/waiting.md).

// Wakes collects the agents to notify after a table operation: those whose
// sleeping requests were granted or made the head of their queue, those
// whose holds were stolen, watched or reaped. The caller
// delivers them (Deliver) after the latch is released.
//
// It also keeps the slots of up to two sleeping requests that were
// granted or made the head of their queue (ringIfAsleep; a grant and the
// wake-ahead of the next head), so that DeliverLocal can poke a request of
// the caller's own agent directly, without its bell and without a scan of
// its waiters.
type Wakes struct {
	n        int
	agents   [8]uint32
	steals   uint8
	other    uint8 // agents[i] was noted for more than a grant or a headship (a steal, a watch, a reap), or for a sleeper sleepers could not keep
	nsleep   uint8
	sleepers [2]struct{ agent, slot uint32 } // sleeping requests granted or made the head
	all      bool
	allSteal bool
}

func (w *Wakes) add(agent uint32, steal bool) {
	if i := w.addAgent(agent, steal); i >= 0 {
		w.other |= 1 << i
	}
}

// addSleeper notes agent for its sleeping request at slot s, granted or
// made the head of its queue.
func (w *Wakes) addSleeper(agent, s uint32) {
	i := w.addAgent(agent, false)
	if i < 0 {
		return
	}
	if k := w.nsleep; k < uint8(len(w.sleepers)) {
		w.sleepers[k].agent, w.sleepers[k].slot = agent, s
		w.nsleep = k + 1
	} else {
		w.other |= 1 << i
	}
}

// addAgent notes agent and returns its index in w.agents (-1 once w has
// overflowed to all).
func (w *Wakes) addAgent(agent uint32, steal bool) int {
	for i := 0; i < w.n; i++ {
		if w.agents[i] == agent {
			if steal {
				w.steals |= 1 << i
			}
			return i
		}
	}
	if w.n == len(w.agents) {
		w.all = true
		w.allSteal = w.allSteal || steal
		return -1
	}
	w.agents[w.n] = agent
	if steal {
		w.steals |= 1 << w.n
	}
	w.n++
	return w.n - 1
}

// Empty reports whether there is nobody to notify.
func (w *Wakes) Empty() bool { return w.n == 0 && !w.all }

// Deliver bumps the doorbell sequence of every agent in w (and its steal
// sequence for steals) and calls ring for each one that has parked
// goroutines or was stolen from (ring nil: the table's ringer). w is reset.
func (t *Table) Deliver(w *Wakes, ring func(agent uint32, nonce uint64)) {
	t.DeliverLocal(w, noAgent, nil, ring)
}

// noAgent is an agent index no table has.
const noAgent = ^uint32(0)

// DeliverLocal is Deliver for a caller that is agent self and can wake its
// own requests by slot: when self is in w only because sleeping requests
// of it were granted or made the head of their queue, its bell is not
// bumped and poke is called with the slot of each (requests that spin are
// not in w: ringIfAsleep). A hand-off
// between two requests of one process thus reaches the next one without
// the bell, a scan of the process's waiters or a syscall. The wake-up is
// not lost: the granter reads a request's park mark after it stored the
// grant, and the waiter is findable by poke before it sets its mark.
// It returns how many times it called poke.
func (t *Table) DeliverLocal(w *Wakes, self uint32, poke func(slot uint32), ring func(agent uint32, nonce uint64)) (poked int) {
	if w.Empty() {
		return 0
	}
	if ring == nil {
		if r := t.ringer.Load(); r != nil {
			ring = *r
		}
	}
	if w.all {
		for idx := uint32(0); idx < uint32(t.l.MaxAgents); idx++ {
			if wordState(atomic.LoadUint64(t.u64(t.agentOff(idx)+agWord))) == AgentAlive {
				t.ring(idx, w.allSteal, ring)
			}
		}
	} else {
		for i := 0; i < w.n; i++ {
			if w.agents[i] == self && poke != nil && w.other&(1<<i) == 0 { // a steal is always other (add)
				for k := uint8(0); k < w.nsleep; k++ {
					if w.sleepers[k].agent == self {
						poke(w.sleepers[k].slot)
						poked++
					}
				}
				continue
			}
			t.ring(w.agents[i], w.steals&(1<<i) != 0, ring)
		}
	}
	*w = Wakes{}
	return poked
}

func (t *Table) ring(idx uint32, steal bool, ring func(agent uint32, nonce uint64)) {
	if idx >= uint32(t.l.MaxAgents) {
		return
	}
	off := t.agentOff(idx)
	atomic.AddUint32(t.u32(off+agBell), 1)
	if steal {
		atomic.AddUint32(t.u32(off+agStealSeq), 1)
	}
	if (steal || atomic.LoadUint32(t.u32(off+agParked)) > 0) && ring != nil {
		ring(idx, atomic.LoadUint64(t.u64(off+agNonce)))
	}
}

// SetRinger sets the ring function Deliver uses when given none (the
// Manager's doorbell), for operations that notify from inside the table.
func (t *Table) SetRinger(ring func(agent uint32, nonce uint64)) { t.ringer.Store(&ring) }
