package table

import "sync/atomic"

// Task tags: how a waiting request says which of its agent's held locks its
// task holds while it waits, so that a deadlock detector in any process can
// follow the wait-for graph through that agent (docs/multi-and-deadlock.md).
//
// A tag lives in the flags word of a HELD slot (bits 1..31; bit 0 is
// flagSteal) and names one WAITING slot of the same agent:
//
//	bits 8..31: the waiting slot's index + 1 (a request slot: < MaxRequests ≤ 2^24−2)
//	bits 1..7:  the low 7 bits of the waiting request's serial
//
// Only the holding agent writes it, under the hold's bucket latch, and only
// for a wait that has lasted its Manager's deadlock delay (never on the fast
// path). A fast hold is first moved into its entry's reserved slot (own), so
// that it has a flags word. A slot's flags are rewritten when the slot is
// granted again, so a tag never outlives its hold; the owner also clears its
// tags when the wait ends, before it gives the waiting slot back.
const (
	tagShift      = 8
	tagSerialBits = 0x7f << 1
)

// TaskTag returns the tag that links holds to waiting request w.
func TaskTag(w Ref) uint32 { return (w.Slot+1)<<tagShift | (w.Serial&0x7f)<<1 }

// TagNames reports whether tag (from LockInfo.Tag of a hold) names the
// waiting request at slot with serial.
func TagNames(tag, slot, serial uint32) bool {
	return tag != 0 && tag == (slot+1)<<tagShift|(serial&0x7f)<<1
}

// TagSlot returns the waiting slot that tag (from LockInfo.Tag of a hold)
// names; ok is false for no tag.
func TagSlot(tag uint32) (slot uint32, ok bool) {
	return tag>>tagShift - 1, tag>>tagShift != 0
}

// TagHolds writes tag into the flags of every hold in holds that agent a
// still holds (a fast hold is first moved into its reserved slot), and
// reports how many it tagged. tag 0 clears. Each hold is tagged under its
// own bucket latch; a process that dies between two (crash point
// "tag.partial") leaves some holds tagged, which only links them to a
// request of the dead agent that the reaper removes with them.
func (t *Table) TagHolds(a *Agent, holds []Ref, tag uint32, w *Wakes) (int, error) {
	n := 0
	for i, r := range holds {
		if i == 1 {
			crash("tag.partial")
		}
		ok, err := t.tagHold(a, r, tag, w)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

func (t *Table) tagHold(a *Agent, r Ref, tag uint32, w *Wakes) (bool, error) {
	if r.Slot >= t.l.slots || r.Bucket >= t.l.buckets {
		return false, nil
	}
	if err := t.latch(a, r.Bucket, w); err != nil {
		return false, err
	}
	defer t.unlatch(a, r.Bucket)
	if r.Slot >= uint32(t.l.MaxRequests) {
		// A reserved slot: the hold may still be a fast hold; own the
		// entry (if it is live in this bucket) to give it a HELD slot.
		e := r.Slot - uint32(t.l.MaxRequests)
		if atomic.LoadUint32(t.u32(t.entryOff(e)+enState)) != r.Bucket+1 {
			return false, nil
		}
		if _, fast := t.fastHeld(a, r); fast {
			t.own(e)
		}
	}
	so := t.slotOff(r.Slot)
	if atomic.LoadUint64(t.u64(so+slWord)) != slotWord(r.Serial, a.Idx, SlotHeld) {
		return false, nil // released, stolen or reaped meanwhile
	}
	t.st32(so+slFlags, t.ld32(so+slFlags)&flagSteal|tag&^flagSteal)
	return true, nil
}

// checkTag verifies slot s's task tag (invariant 7): a waiting slot carries
// none (nor the steal flag); a held slot's tag names a request slot, and in
// a quiescent table a WAITING or HELD one of the same agent (the owner
// clears its tags when the wait ends, before it frees the waiting slot).
func (t *Table) checkTag(c *checker, s uint32, sw uint64, quiescent bool) {
	flags := atomic.LoadUint32(t.u32(t.slotOff(s) + slFlags))
	switch wordState(sw) {
	case SlotWaiting:
		if flags != 0 {
			c.fail("slot %d: waiting with flags %#x", s, flags)
		}
	case SlotHeld:
		tag := flags &^ flagSteal
		if tag == 0 {
			return
		}
		ws := tag>>tagShift - 1
		if tag>>tagShift == 0 || ws >= uint32(t.l.MaxRequests) {
			c.fail("slot %d: task tag %#x names no request slot", s, tag)
			return
		}
		if !quiescent {
			return
		}
		ww := atomic.LoadUint64(t.u64(t.slotOff(ws) + slWord))
		if st := wordState(ww); (st != SlotWaiting && st != SlotHeld) || wordAgent(ww) != wordAgent(sw) ||
			!TagNames(tag, ws, wordSerial(ww)) {
			c.fail("slot %d: task tag %#x names slot %d (word %#x), not a request of agent %d", s, tag, ws, ww, wordAgent(sw))
		}
	}
}
