package table

import (
	"slices"
	"sync/atomic"
)

// repair rebuilds bucket b from the truth after its latch was taken over
// from a dead owner, who may have stopped at any instruction of any update.
//
// The truth is the state words: an entry belongs to bucket b when its state
// is b+1; a request belongs to entry e when its slot is WAITING or HELD and
// its entry field is e+1, or when the entry's fast word names its agent
// (first turned into a HELD reserved slot, see ownEntry). Everything else (the chain, queue and held links,
// holder and waiter counts) is a cache that repair recomputes: waiting slots
// are re-queued in order of their sequence numbers, held slots relinked, the
// token counter raised to the highest token handed out, and then every queue
// is re-processed (the dead owner may have been releasing) and empty entries
// are freed (an idle entry may have been half renamed). Watch lists are
// rebuilt from the WATCHING slots, and watched entries count as changed. Every agent with a request in the bucket is rung, so that
// waiters re-check and victims of a half-finished steal learn of it.
func (t *Table) repair(a *Agent, b uint32, w *Wakes) {
	nRes, nSlots := uint32(t.l.MaxResources), t.l.slots
	var live []uint32
	for e := uint32(0); e < nRes; e++ {
		if atomic.LoadUint32(t.u32(t.entryOff(e)+enState)) == b+1 {
			live = append(live, e)
		}
	}
	// Take every entry back from the fast path first: a fast holder (or one
	// the dead owner was moving to the held list) becomes a HELD slot that
	// the rebuild below links like the others.
	for _, e := range live {
		t.ownEntry(e, false)
	}
	type member struct {
		slot uint32
		seq  uint32
	}
	held := map[uint32][]uint32{}
	waiting := map[uint32][]member{}
	watching := map[uint32][]uint32{}
	for s := uint32(0); s < nSlots; s++ {
		so := t.slotOff(s)
		sw := atomic.LoadUint64(t.u64(so + slWord))
		st := wordState(sw)
		if st != SlotWaiting && st != SlotHeld && st != SlotStolen && st != SlotWatching {
			continue
		}
		e := t.ld32(so+slEntry) - 1
		if e >= nRes || atomic.LoadUint32(t.u32(t.entryOff(e)+enState)) != b+1 {
			continue
		}
		switch st {
		case SlotHeld:
			held[e] = append(held[e], s)
		case SlotWaiting:
			waiting[e] = append(waiting[e], member{s, t.ld32(so + slSeq)})
		case SlotWatching:
			if s < uint32(t.l.MaxRequests) { // a reserved slot never watches: the checker reports it
				watching[e] = append(watching[e], s)
			}
		}
		w.add(wordAgent(sw), st == SlotStolen)
	}
	bo := t.bucketOff(b)
	var chain uint32
	for _, e := range live {
		eo := t.entryOff(e)
		// Held list.
		var head uint32
		var mode uint32 = ModeShared
		token := t.ld64(eo + enToken)
		for _, s := range held[e] {
			so := t.slotOff(s)
			t.st32(so+slPrev, 0)
			t.st32(so+slNext, head)
			if head != 0 {
				t.st32(t.slotOff(head-1)+slPrev, s+1)
			}
			head = s + 1
			if t.ld32(so+slMode) != ModeShared {
				mode = ModeExclusive
			}
			token = max(token, t.ld64(so+slToken))
		}
		t.st32(eo+enHHead, head)
		t.st32(eo+enNHeld, uint32(len(held[e])))
		t.st32(eo+enHMode, mode)
		t.st64(eo+enToken, token)
		// Queue, in sequence order (wrap-around safe: the queue spans far less than 2^31).
		q := waiting[e]
		slices.SortFunc(q, func(x, y member) int { return int(int32(x.seq - y.seq)) })
		var prev uint32
		for _, m := range q {
			so := t.slotOff(m.slot)
			t.st32(so+slPrev, prev)
			t.st32(so+slNext, 0)
			if prev != 0 {
				t.st32(t.slotOff(prev-1)+slNext, m.slot+1)
			} else {
				t.st32(eo+enQHead, m.slot+1)
			}
			prev = m.slot + 1
		}
		if len(q) == 0 {
			t.st32(eo+enQHead, 0)
		} else if next := q[len(q)-1].seq + 1; int32(next-t.ld32(eo+enSeq)) > 0 {
			t.st32(eo+enSeq, next)
		}
		t.st32(eo+enQTail, prev)
		t.st32(eo+enNWait, uint32(len(q)))
		// Watch list, in slot order (its order carries no meaning).
		prev = 0
		for _, s := range watching[e] {
			so := t.slotOff(s)
			t.st32(so+slPrev, prev)
			t.st32(so+slNext, 0)
			if prev != 0 {
				t.st32(t.slotOff(prev-1)+slNext, s+1)
			} else {
				t.st32(eo+enWHead, s+1)
			}
			prev = s + 1
		}
		if len(watching[e]) == 0 {
			t.st32(eo+enWHead, 0)
		}
		if n := t.ld32(eo + enNameLen); n > uint32(t.l.MaxNameLen) {
			t.st32(eo+enNameLen, 0)
		}
		t.st32(eo+enNext, chain)
		chain = e + 1
	}
	atomic.StoreUint32(t.u32(bo+bkHead), chain)
	crash("repair.rebuilt")
	for _, e := range live {
		t.passOn(e, w, true, noAgent, false) // processQueue, or a bounded table's choice (fairness.go)
		t.touch(e, w)                        // the dead owner may have changed it without ringing
		if t.latchIdle(t.entryOff(e)) {
			t.freeEntry(e, b) // the dead owner may have been renaming it
		}
	}
	atomic.AddUint64(t.u64(hdrRepairs), 1)
	t.emit(Event{Kind: EventRepair, Bucket: b})
}
