package table

import (
	"sync/atomic"

	"github.com/shmlocks/shmlocks/internal/testhooks"
)

// A name's queue and held list: grants in queue order, the wake-ahead of
// the next head, and steals (docs/design.md §2 and §4). Every function
// here runs under the entry's bucket latch.

// grantable: the queue is empty and mode is compatible with the holders,
// or (a bounded table) the name is free and may be taken ahead of its
// queue (mayBarge, fairness.go); or the stress checkers' test breaks
// exclusion (testhooks.BreakExclusion).
func (t *Table) grantable(eo uint64, mode uint32) bool {
	if testhooks.BreakExclusion.Load() {
		return true
	}
	if t.ld32(eo+enQHead) != 0 {
		return t.l.bound != 0 && t.mayBarge(eo)
	}
	return compatible(t, eo, mode)
}

func compatible(t *Table, eo uint64, mode uint32) bool {
	if t.ld32(eo+enNHeld) == 0 {
		return true
	}
	return mode == ModeShared && t.ld32(eo+enHMode) == ModeShared
}

// grant marks slot s (claimed, in no list) HELD with the next token and
// links it into e's held list.
func (t *Table) grant(s, e, mode uint32, now int64) uint64 {
	head := t.ld32(t.entryOff(e) + enHHead)
	token := t.markHeld(s, e, now, head)
	t.linkHeld(s, e, mode, head)
	return token
}

// markHeld gives slot s the next token of entry e, the grant time and the
// held list's links (prev 0, next head: the current first holder) and then
// marks it HELD, in that order: every store to the slot's cache line is
// made in one burst that ends with the word, on which a queued owner is
// spinning, so that the line crosses to the granter once, not once per
// field, and the grant is visible before the rest of the bookkeeping
// (linkHeld, and the queue's links for a slot taken from the queue).
func (t *Table) markHeld(s, e uint32, now int64, head uint32) uint64 {
	eo, so := t.entryOff(e), t.slotOff(s)
	token := t.ld64(eo+enToken) + 1
	t.st64(eo+enToken, token)
	sp := t.u64(so + slWord)
	sw := atomic.LoadUint64(sp)
	t.st64(so+slToken, token)
	t.st64(so+slGrant, uint64(now))
	t.st32(so+slPrev, 0)
	t.st32(so+slNext, head)
	atomic.StoreUint64(sp, slotWord(wordSerial(sw), wordAgent(sw), SlotHeld))
	crash("grant.marked")
	return token
}

// linkHeld finishes a grant of slot s (markHeld with the same head): the
// slot becomes the first of e's held list, in mode.
func (t *Table) linkHeld(s, e, mode, head uint32) {
	eo := t.entryOff(e)
	if head != 0 && head-1 < t.l.slots {
		t.st32(t.slotOff(head-1)+slPrev, s+1)
	}
	t.st32(eo+enHHead, s+1)
	t.st32(eo+enNHeld, t.ld32(eo+enNHeld)+1)
	t.st32(eo+enHMode, mode)
}

// enqueue marks claimed slot s WAITING and links it at the tail of e's queue.
func (t *Table) enqueue(s, e uint32) {
	eo, so := t.entryOff(e), t.slotOff(s)
	seq := t.ld32(eo + enSeq)
	t.st32(so+slSeq, seq)
	// Its goroutine is awake: it spins, or registers and checks its slot
	// before it sleeps (MarkParked). A plain store: the mark is read only
	// under this latch (ringIfAsleep, wakeAhead), and this request's own
	// MarkParked comes after in program order.
	t.st32(so+slPark, 0)
	sp := t.u64(so + slWord)
	sw := atomic.LoadUint64(sp)
	// Release order suffices (the latch's release follows at once): a
	// reader outside the latch that sees WAITING sees the seq and mark
	// stored above.
	storeRelease64(sp, slotWord(wordSerial(sw), wordAgent(sw), SlotWaiting))
	t.st32(eo+enSeq, seq+1)
	crash("enqueue.marked")
	tail := t.ld32(eo + enQTail)
	t.st32(so+slPrev, tail)
	t.st32(so+slNext, 0)
	if tail != 0 && tail-1 < uint32(t.l.MaxRequests) {
		t.st32(t.slotOff(tail-1)+slNext, s+1)
	} else {
		t.st32(eo+enQHead, s+1)
	}
	t.st32(eo+enQTail, s+1)
	t.st32(eo+enNWait, t.ld32(eo+enNWait)+1)
	crash("enqueue.linked")
}

// unqueue takes waiting slot s out of entry eo's queue, wherever it
// stands, and counts it out of the queue's length.
func (t *Table) unqueue(s uint32, eo uint64) {
	t.unlink(s, eo+enQHead, eo+enQTail)
	if n := t.ld32(eo + enNWait); n > 0 {
		t.st32(eo+enNWait, n-1)
	}
}

// unlink removes slot s from a doubly linked list given the offsets of its
// head (and tail, for the queue; 0 for the held list) words.
func (t *Table) unlink(s uint32, headOff, tailOff uint64) {
	so := t.slotOff(s)
	prev := t.ld32(so + slPrev)
	next := t.ld32(so + slNext)
	if prev != 0 && prev-1 < t.l.slots {
		t.st32(t.slotOff(prev-1)+slNext, next)
	} else {
		t.st32(headOff, next)
	}
	if next != 0 && next-1 < t.l.slots {
		t.st32(t.slotOff(next-1)+slPrev, prev)
	} else if tailOff != 0 {
		t.st32(tailOff, prev)
	}
	t.st32(so+slPrev, 0)
	t.st32(so+slNext, 0)
}

// removeSlot takes waiting or held slot s (word sw) of entry e out of its
// list, frees it, re-processes the queue and frees the entry if it is empty.
func (t *Table) removeSlot(s uint32, sw uint64, e, b uint32, w *Wakes, turn bool) {
	eo := t.entryOff(e)
	// A bounded table's entry with waiters may be on the fast path
	// (fairness.go): take it back first (one load when it is latched).
	t.own(e)
	switch wordState(sw) {
	case SlotHeld:
		t.unlink(s, eo+enHHead, 0)
		if n := t.ld32(eo + enNHeld); n > 0 {
			t.st32(eo+enNHeld, n-1)
		}
		crash("release.unlinked")
	case SlotWaiting:
		t.unqueue(s, eo)
		crash("abort.unlinked")
	}
	atomic.CompareAndSwapUint64(t.u64(t.slotOff(s)+slWord), sw, slotWord(wordSerial(sw), wordAgent(sw), SlotFree))
	crash("release.freed")
	from := uint32(noAgent) // a waiter left: no batch of its agent
	if wordState(sw) == SlotHeld {
		from = wordAgent(sw)
	}
	t.passOn(e, w, false, from, turn) // processQueue, or a bounded table's choice (fairness.go)
	t.wakeAhead(e, w)
	t.touch(e, w)
	t.entryEmptied(e, b)
}

// wakeAhead rings the agent of the request now first in e's queue, one grant
// ahead of its turn, so that it is spinning, not asleep, when its grant lands.
//
// Not when that request sleeps and the name's one holder is a request of
// the same agent: the holder's release will grant it from the same process,
// and the releaser pokes it then by slot (DeliverLocal), a call within the
// process. Woken ahead, it would spin through its sibling's hold and take a
// CPU (or, confined to one, every other turn of it) for a grant that costs
// nothing to deliver (docs/experiments.md).
func (t *Table) wakeAhead(e uint32, w *Wakes) {
	eo := t.entryOff(e)
	head := t.ld32(eo + enQHead)
	if head == 0 || head-1 >= uint32(t.l.MaxRequests) {
		return
	}
	so := t.slotOff(head - 1)
	if h := t.ld32(eo + enHHead); h != 0 && h-1 < uint32(t.l.MaxRequests) && t.ld32(eo+enNHeld) == 1 &&
		atomic.LoadUint32(t.u32(so+slPark)) != 0 &&
		wordAgent(atomic.LoadUint64(t.u64(t.slotOff(h-1)+slWord))) == wordAgent(atomic.LoadUint64(t.u64(so+slWord))) {
		return
	}
	if atomic.LoadUint32(t.u32(so+slPark)) == 1 { // not markRung: rung already, it has yet to run (fairness.go)
		w.addSleeper(wordAgent(atomic.LoadUint64(t.u64(so+slWord))), head-1)
	}
}

// ringIfAsleep notes in w the agent of request slot s, just granted or just
// made the head of its queue, if the request's goroutine sleeps (its park
// mark): its bell is then bumped and its doorbell rung, or, for the
// caller's own agent, the request poked by slot (DeliverLocal). One that
// spins is not noted at all: it sees its slot word change by itself, and a
// ring would cost a datagram and a thread of its process woken for
// nothing. Nor is its bell bumped: that is a locked add on the line of its
// agent's record that holds the parked count, which its spinners read at
// every look: a cache-line transfer per grant between CPUs far apart
// (docs/experiments.md). For a grant no wake-up is lost:
// markHeld's atomic store of the slot word comes before this load of the
// mark, and the waiter stores its mark before it looks at its slot word,
// so one of the two sees the other. The wake-ahead is a hint: a missed one
// only means the request is woken by its grant (a spinner looks whether it
// became the head after it sets its mark).
func (t *Table) ringIfAsleep(s uint32, w *Wakes) {
	so := t.slotOff(s)
	if atomic.LoadUint32(t.u32(so+slPark)) != 0 {
		w.addSleeper(wordAgent(atomic.LoadUint64(t.u64(so+slWord))), s)
	}
}

// processQueue grants the head of e's queue while it is compatible with the
// holders: one exclusive request, or a run of shared ones. A shared request
// behind a waiting exclusive one is never granted before it.
func (t *Table) processQueue(e uint32, w *Wakes) {
	eo := t.entryOff(e)
	var now int64
	for steps := 0; steps <= t.l.MaxRequests; steps++ {
		head := t.ld32(eo + enQHead)
		if head == 0 || head-1 >= uint32(t.l.MaxRequests) {
			return
		}
		s := head - 1
		so := t.slotOff(s)
		mode := t.ld32(so + slMode)
		if !compatible(t, eo, mode) {
			return
		}
		// The head leaves the queue: its queue links are read before
		// markHeld overwrites them with the held list's, and the queue is
		// mended after the grant is visible (all under the latch).
		next := t.ld32(so + slNext)
		if now == 0 {
			now = nowNano()
		}
		held := t.ld32(eo + enHHead)
		t.markHeld(s, e, now, held)
		t.st32(eo+enQHead, next)
		if next != 0 && next-1 < uint32(t.l.MaxRequests) {
			t.st32(t.slotOff(next-1)+slPrev, 0)
		} else {
			t.st32(eo+enQTail, 0)
		}
		if n := t.ld32(eo + enNWait); n > 0 {
			t.st32(eo+enNWait, n-1)
		}
		t.linkHeld(s, e, mode, held)
		crash("grant.linked")
		t.ringIfAsleep(s, w) // after markHeld's store: no lost wake-up (docs/waiting.md)
		if mode != ModeShared {
			return
		}
	}
}

// stealHolders marks every holder of e STOLEN and empties the held list.
func (t *Table) stealHolders(e uint32, w *Wakes) {
	eo := t.entryOff(e)
	next := t.ld32(eo + enHHead)
	for steps := uint32(0); next != 0 && next-1 < t.l.slots && steps <= t.l.slots; steps++ {
		s := next - 1
		so := t.slotOff(s)
		next = t.ld32(so + slNext)
		sp := t.u64(so + slWord)
		sw := atomic.LoadUint64(sp)
		if wordState(sw) == SlotHeld {
			atomic.StoreUint64(sp, slotWord(wordSerial(sw), wordAgent(sw), SlotStolen))
			w.add(wordAgent(sw), true)
		}
		crash("steal.marked")
	}
	t.st32(eo+enHHead, 0)
	t.st32(eo+enNHeld, 0)
}
