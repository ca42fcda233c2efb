package table

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/shmlocks/shmlocks/internal/testhooks"
)

// Fairness: the order in which a name's requests are granted, a property
// of the table recorded in its header when the file is created
// (docs/waiting.md, "Bounded fairness").
//
//	FIFO (bound 0)     strict arrival order per request (Web Locks): a
//	                   release hands the name to the head of its queue
//	                   (processQueue), and a request finding a queue joins
//	                   it.
//	Bounded (bound d)  sync.Mutex's normal and starvation modes across
//	                   processes. While the oldest queued request (the head)
//	                   has waited less than d/2, a release that could grant
//	                   the head leaves the name free instead and wakes the
//	                   head, which takes its turn itself (TakeTurn), and a
//	                   new request that finds the name free takes it ahead of
//	                   the queue (a barge: grantable). While the head has
//	                   waited d/2 to d (aging), a release grants the name
//	                   at once: to the oldest queued request of the
//	                   releasing agent if that one has waited d/2 too (a
//	                   batch per process), else to the head if it is awake
//	                   (its park mark 0: it spins); a sleeping head is rung
//	                   and left the name as before d/2. Once the head
//	                   has waited d, releases hand the name to the head as
//	                   FIFO does and nobody barges, until a head that has
//	                   waited less than d comes first again.
//
// The queue stays in arrival order (Query shows it), and the wait-for graph
// is the same: a grant takes a request out of its queue, never moves one.
// The aging batch lets a process that runs serve its own old requests
// with hand-offs inside the process before the name crosses to another
// process, so that the requests queued by processes that are off their CPU
// cost one crossing per process, not one per request. A sleeping head is
// not granted while it ages: the name would wait for its wake-up (across
// processes a datagram, a thread and a goroutine), so it is woken half the
// bound ahead and granted once it runs. The bound: a request
// that has waited d is the head or has only older requests ahead of it, so
// from then on nobody barges and no batch runs until it is granted, and it
// waits at most d plus the hand-offs of the requests ahead of it and the
// one grant in progress (docs/design.md).
//
// Times are the slots' enqueue times (unix ns, written by the enqueuer) read
// against the reader's clock: a head whose enqueue time is ahead of the
// reader's clock (a step of the wall clock back, or skew between two
// processes' readings) counts as having waited the bound, so a clock that
// misbehaves can only make a bounded table behave like a FIFO one.

// MaxFairnessBound is the largest bound a table may record.
const MaxFairnessBound = time.Hour

// Fairness kinds in the header (hdrFairness).
const (
	fairFIFO    = 0
	fairBounded = 1
)

// parseFairness validates the header's fairness fields (untrusted bytes)
// and returns the bound in ns (0: FIFO).
func parseFairness(kind, spare uint32, bound uint64) (int64, error) {
	switch {
	case spare != 0:
		return 0, corruptf("fairness spare", spare, "want 0")
	case kind == fairFIFO && bound != 0:
		return 0, corruptf("fairness bound", bound, "a FIFO table records no bound")
	case kind == fairFIFO:
		return 0, nil
	case kind != fairBounded:
		return 0, corruptf("fairness", kind, "want %d (FIFO) or %d (bounded)", fairFIFO, fairBounded)
	case bound == 0 || bound > uint64(MaxFairnessBound):
		return 0, corruptf("fairness bound", bound, "want 1 to %d ns", int64(MaxFairnessBound))
	}
	return int64(bound), nil
}

// Bound returns the table's fairness bound: 0 for strict arrival order
// (FIFO), else the d of bounded fairness.
func (t *Table) Bound() time.Duration { return time.Duration(t.l.bound) }

// fairnessText is the fairness line of Render (the spelling of the
// manager's Fairness.String and of shmlocks stress --fairness).
func (t *Table) fairnessText() string {
	if t.l.bound == 0 {
		return "fifo (strict arrival order)"
	}
	d := time.Duration(t.l.bound)
	return fmt.Sprintf("bounded:%v (a request may take a free name ahead of the queue while its oldest has waited less than %v)", d, d)
}

// ---- under the latch of the entry's bucket ----

// waitedUnder reports whether the queued request at slot offset so has
// waited less than the bound at now (unix ns); an enqueue time ahead of
// now counts as the bound reached (see above).
func (t *Table) waitedUnder(so uint64, now int64) bool {
	waited := now - int64(t.ld64(so+slEnqueue))
	return waited >= 0 && waited < t.l.bound
}

// mayBarge reports whether a new request may take entry eo ahead of its
// queue now: a bounded table, nothing held, and a head that has waited
// less than the bound. Called with the queue not empty.
func (t *Table) mayBarge(eo uint64) bool {
	if t.l.bound == 0 || t.ld32(eo+enNHeld) != 0 {
		return false
	}
	head := t.ld32(eo + enQHead)
	if head == 0 || head-1 >= uint32(t.l.MaxRequests) {
		return false
	}
	return t.waitedUnder(t.slotOff(head-1), nowNano())
}

// passOn re-processes e's queue after a holder or a waiter left it
// (removeSlot, repair); from is the agent whose hold ended (noAgent for a
// waiter that left, or a repair). FIFO, or a head that has waited the
// bound: the head is granted (processQueue). A turn (ReleaseTurn): from's
// oldest queued request is granted if it fits the holders, ahead of older
// requests of other agents (grantQueued, crash point batch.granted). A head that has waited half
// the bound (aging): from's oldest queued request is granted if it has
// waited half the bound too and fits the holders (batch.granted), else the
// head if it is awake. Otherwise, if the head could be granted, the name is
// left free for it and it is woken to take it (TakeTurn) unless a running
// request takes the name first. With ring (repair, after a dead latch
// owner) the head's agent is rung even if its park mark says it is awake:
// the dead owner may have cleared the mark and never rung.
func (t *Table) passOn(e uint32, w *Wakes, ring bool, from uint32, turn bool) {
	if t.l.bound == 0 {
		t.processQueue(e, w)
		return
	}
	eo := t.entryOff(e)
	head := t.ld32(eo + enQHead)
	if head == 0 || head-1 >= uint32(t.l.MaxRequests) {
		return
	}
	so := t.slotOff(head - 1)
	if !compatible(t, eo, t.ld32(so+slMode)) {
		return
	}
	now := nowNano() + testhooks.FairnessSkew.Load()
	if !t.waitedUnder(so, now) {
		t.processQueue(e, w) // starved: hand-offs in arrival order
		return
	}
	if turn {
		if s := t.firstOf(eo, from); s != noSlot {
			if s == head-1 {
				t.processQueue(e, w)
			} else {
				t.grantQueued(e, s, w) // a turn inside the releasing process
			}
			return
		}
	}
	if !t.waitedUnderHalf(so, now) {
		if s := t.agingOf(eo, from, now); s != noSlot && s != head-1 {
			t.grantQueued(e, s, w) // the releasing process's batch
			return
		}
		if atomic.LoadUint32(t.u32(so+slPark)) == 0 {
			t.processQueue(e, w) // the oldest, awake: its next look sees the grant
			return
		}
		// The oldest sleeps: granted now, the name would wait for its
		// wake-up (a chain of them, across processes). It is rung below
		// and left the name as in the first half, and is granted once it
		// runs (its turn, or this grant at a release that finds it
		// awake), or by the starved hand-off at the bound.
	}
	// The head is asleep: wake it once. The mark moves from 1 (asleep) to
	// markRung so that the releases that follow before it runs do not ring
	// it again (a datagram each, across processes); it sets the mark to 1
	// again before it looks under the latch (TakeTurn), so a later release
	// leaving it the name rings it again. A head that spins (mark 0) looks
	// by itself. markRung is not 0: a grant made before the head ran (a
	// starved hand-off, processQueue) still rings it (ringIfAsleep), so
	// its wake-up never rests on this ring alone (without that second
	// ring, a head granted that way was at times found only by its
	// Manager's 100 ms safety scan: docs/experiments.md).
	if atomic.CompareAndSwapUint32(t.u32(so+slPark), 1, markRung) || ring {
		w.addSleeper(wordAgent(atomic.LoadUint64(t.u64(so+slWord))), head-1)
	}
	crash("passon.leftfree")
	t.armFree(eo)
}

// markRung is a park mark (slot offset 56) that passOn left after it rang a
// sleeping head to take its turn: the head has not run since, so a grant
// rings it as it would a mark of 1 (any mark but 0 means asleep).
const markRung = 2

// waitedUnderHalf reports whether the queued request at slot offset so has
// waited less than half the bound at now (a bounded table): its queue is
// not aging yet. An enqueue time ahead of now counts as waited.
func (t *Table) waitedUnderHalf(so uint64, now int64) bool {
	waited := now - int64(t.ld64(so+slEnqueue))
	return waited >= 0 && waited < t.l.bound/2
}

// noSlot is no slot index.
const noSlot = ^uint32(0)

// agingOf returns the oldest queued request of agent a on entry eo (the
// first of a's in queue order) if it has waited half the bound at now and
// fits the holders, else noSlot.
func (t *Table) agingOf(eo uint64, a uint32, now int64) uint32 {
	s := t.firstOf(eo, a)
	if s == noSlot || t.waitedUnderHalf(t.slotOff(s), now) {
		return noSlot
	}
	return s
}

// firstOf returns the oldest queued request of agent a on entry eo (the
// first of a's in queue order) if it fits the holders, else noSlot.
func (t *Table) firstOf(eo uint64, a uint32) uint32 {
	if a == noAgent {
		return noSlot
	}
	s := t.ld32(eo + enQHead)
	for steps := 0; s != 0 && s-1 < uint32(t.l.MaxRequests) && steps < t.l.MaxRequests; steps++ {
		so := t.slotOff(s - 1)
		if wordAgent(atomic.LoadUint64(t.u64(so+slWord))) == a {
			if !compatible(t, eo, t.ld32(so+slMode)) {
				return noSlot
			}
			return s - 1
		}
		s = t.ld32(so + slNext)
	}
	return noSlot
}

// grantQueued grants queued request s of entry e ahead of older ones (the
// aging batch; processQueue grants the head). It leaves the queue, then is
// marked held and linked into the held list, as processQueue does with the
// head: a crash between the steps leaves a slot that repair puts back in
// its queue (by its seq) or in the held list, by its state.
func (t *Table) grantQueued(e, s uint32, w *Wakes) {
	eo, so := t.entryOff(e), t.slotOff(s)
	mode := t.ld32(so + slMode)
	t.unqueue(s, eo)
	held := t.ld32(eo + enHHead)
	t.markHeld(s, e, nowNano(), held)
	t.linkHeld(s, e, mode, held)
	crash("batch.granted")
	t.ringIfAsleep(s, w)
}

// armFree hands entry eo, its name left free to its queue's head, to the
// fast path (a bounded table): until a latch holder owns it again, new
// exclusive requests take it by one CAS (fastAcquire, which first checks
// that the head has waited less than the bound) and release it by another.
// Not while it is watched (a watched entry stays latched: watch.go).
func (t *Table) armFree(eo uint64) {
	fp := t.u64(eo + enFast)
	if atomic.LoadUint64(fp) != fastLatched || !t.heldEmpty(eo) || t.watched(eo) {
		return
	}
	if ctr := uint32(t.ld64(eo + enToken)); ctr != lo32 {
		atomic.StoreUint64(fp, fastWord(ctr, fastIdle))
	}
}

// fastMayBarge reports, for a fast acquirer of idle entry eo (no latch),
// whether it may take it: its queue is empty (as always on a FIFO table) or
// its head has waited less than the bound. The queue cannot change while
// the entry stays idle (only a latch holder that owns it first changes it),
// so the CAS that takes the entry confirms this look (an ABA of the fast
// word without a grant only ever leaves a head as young or younger).
func (t *Table) fastMayBarge(eo uint64) bool {
	head := atomic.LoadUint32(t.u32(eo + enQHead))
	if head == 0 {
		return true
	}
	if head-1 >= uint32(t.l.MaxRequests) {
		return false
	}
	waited := nowNano() - int64(atomic.LoadUint64(t.u64(t.slotOff(head-1)+slEnqueue)))
	return waited >= 0 && waited < t.l.bound
}

// serveStarved grants the head of e's queue if it has waited the bound and
// nothing in its way holds the name (a bounded table, the entry owned): a
// fast acquirer that found the head starved came to the latch for this,
// and the name may have been left free to a head that has not come yet.
func (t *Table) serveStarved(e uint32, w *Wakes) {
	eo := t.entryOff(e)
	head := t.ld32(eo + enQHead)
	if head == 0 || head-1 >= uint32(t.l.MaxRequests) {
		return
	}
	so := t.slotOff(head - 1)
	if !compatible(t, eo, t.ld32(so+slMode)) || t.waitedUnder(so, nowNano()) {
		return
	}
	t.processQueue(e, w)
	t.wakeAhead(e, w)
	t.touch(e, w)
}

// TakeTurn grants waiting request r of agent a if it is first in its queue
// and compatible with the holders: a bounded table left it the name
// (passOn), or no request holds it now. A run of shared requests behind it
// is granted with it, as processQueue does. It reports whether r holds its
// name now.
func (t *Table) TakeTurn(a *Agent, r Ref, w *Wakes) (bool, error) {
	if r.Slot >= uint32(t.l.MaxRequests) || r.Bucket >= t.l.buckets {
		return false, ErrNotHeld
	}
	so := t.slotOff(r.Slot)
	sp := t.u64(so + slWord)
	if atomic.LoadUint64(sp) != slotWord(r.Serial, a.Idx, SlotWaiting) {
		return false, nil // granted meanwhile, or gone: the caller looks
	}
	if err := t.latch(a, r.Bucket, w); err != nil {
		return false, err
	}
	defer t.unlatch(a, r.Bucket)
	if atomic.LoadUint64(sp) != slotWord(r.Serial, a.Idx, SlotWaiting) {
		return false, nil
	}
	e := t.ld32(so+slEntry) - 1
	if e >= uint32(t.l.MaxResources) || atomic.LoadUint32(t.u32(t.entryOff(e)+enState)) != r.Bucket+1 {
		return false, corruptf("slot entry", e+1, "slot %d waits but its entry is not live in bucket %d", r.Slot, r.Bucket)
	}
	eo := t.entryOff(e)
	t.own(e) // from the fast path: a fast holder is moved into the held list
	if t.ld32(eo+enQHead) != r.Slot+1 || !compatible(t, eo, t.ld32(so+slMode)) {
		return false, nil
	}
	// Our goroutine is awake: the grant need not ring it.
	atomic.StoreUint32(t.u32(so+slPark), 0)
	t.processQueue(e, w)
	crash("turn.taken")
	t.wakeAhead(e, w)
	t.touch(e, w)
	return true, nil
}

// TurnOpen reports, without the latch, whether waiting request r of agent
// a is first in its queue with nothing held, or only shared holds when r is
// shared: a hint for a spinning head of a bounded table that TakeTurn may
// grant it now (read atomically, not under the latch). mark is a reading
// of the name's state that changes with every grant on it (the fast word,
// whose counter every fast grant moves, or the token counter while the
// entry is latched): a head that sees the same mark open twice knows that
// nobody took the name in between. Both are hints: TakeTurn decides under
// the latch, so a mark that repeats across a grant (a token counter equal
// to an idle fast word) only makes the head take its turn sooner.
func (t *Table) TurnOpen(a *Agent, r Ref) (mark uint64, open bool) {
	so, eo, head := t.headOf(a, r)
	if !head {
		return 0, false
	}
	v := atomic.LoadUint64(t.u64(eo + enFast))
	switch st := uint32(v); {
	case st == fastIdle:
		return v, true
	case st != fastLatched:
		return v, false // held by the fast path
	}
	mark = atomic.LoadUint64(t.u64(eo + enToken))
	if atomic.LoadUint32(t.u32(eo+enNHeld)) == 0 {
		return mark, true
	}
	return mark, atomic.LoadUint32(t.u32(so+slMode)) == ModeShared && atomic.LoadUint32(t.u32(eo+enHMode)) == ModeShared
}
