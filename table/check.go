package table

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// Check verifies every invariant of the table (docs/design.md, "Invariants"):
//
//   - each bucket chain is acyclic, in range, and holds only entries live in
//     that bucket whose name hashes to it, with no name twice;
//   - every live entry is in its bucket's chain and its name length is
//     within MaxNameLen; a bucket has at most one latched idle (empty) entry;
//   - each held list is acyclic, doubly linked, of length nHeld, made of HELD
//     slots of that entry, all in the entry's mode, exclusive only alone, with
//     distinct tokens no larger than the entry's token counter;
//   - each queue is acyclic, doubly linked, of length nWait, ends at qTail, is
//     made of WAITING slots of that entry in strictly increasing sequence order,
//     and its head is not grantable (it would have been granted; a bounded
//     table may leave a free name to its head for a moment: fairness.go);
//   - every WAITING, HELD or WATCHING slot is in exactly one list; every used slot
//     belongs to an agent record that is in use; state values are valid;
//   - every free entry is latched; a live entry's fast word is latched, idle
//     or held, with empty lists (a bounded table: an empty held list) and a
//     counter ≥ its token's low word when not latched; a fast holder is an agent in use that marked the entry's
//     range (checked when quiescent: see orphan); a reserved slot is only
//     ever in its own entry's held list, never queued;
//   - each watch list is acyclic, doubly linked, made of WATCHING request
//     slots of that entry; a watched entry is latched and never counts as
//     idle;
//   - with a == nil (the caller guarantees nothing runs): every latch is free.
//
// With a non-nil agent, Check takes every bucket latch (in index order) for a
// consistent view of a live table, then releases them. It returns nil or an
// error wrapping ErrCorrupt that lists the violations found.
func (t *Table) Check(a *Agent) error {
	return Guard(func() error {
		if a != nil {
			var w Wakes
			held := uint32(0)
			defer func() {
				for b := uint32(0); b < held; b++ {
					t.unlatch(a, b)
				}
				t.Deliver(&w, nil)
			}()
			for ; held < t.l.buckets; held++ {
				if err := t.latch(a, held, &w); err != nil {
					return err
				}
			}
		}
		return t.check(a == nil)
	})
}

type checker struct {
	errs []error
}

func (c *checker) fail(format string, args ...any) {
	if len(c.errs) < 50 {
		c.errs = append(c.errs, fmt.Errorf(format, args...))
	}
}

func (t *Table) check(quiescent bool) error {
	c := &checker{}
	nRes, nSlots, nAg := uint32(t.l.MaxResources), t.l.slots, uint32(t.l.MaxAgents)
	inChain := make([]bool, nRes)
	inList := make([]bool, nSlots)

	for b := uint32(0); b < t.l.buckets; b++ {
		bo := t.bucketOff(b)
		if lw := atomic.LoadUint32(t.u32(bo + bkLatch)); quiescent && lw != 0 {
			c.fail("bucket %d: latch held (%#x) in a quiescent table", b, lw)
		}
		names := map[string]bool{}
		idle := 0
		next := atomic.LoadUint32(t.u32(bo + bkHead))
		for steps := 0; next != 0; steps++ {
			e := next - 1
			if e >= nRes {
				c.fail("bucket %d: chain index %d out of range", b, next)
				break
			}
			if inChain[e] {
				c.fail("bucket %d: entry %d reached twice (cycle or shared chain)", b, e)
				break
			}
			inChain[e] = true
			eo := t.entryOff(e)
			if st := atomic.LoadUint32(t.u32(eo + enState)); st != b+1 {
				c.fail("bucket %d: entry %d in chain has state %d, want %d", b, e, st, b+1)
			}
			n := atomic.LoadUint32(t.u32(eo + enNameLen))
			if n > uint32(t.l.MaxNameLen) {
				c.fail("entry %d: name length %d over MaxNameLen %d", e, n, t.l.MaxNameLen)
			} else {
				name := string(t.buf[eo+enName : eo+enName+uint64(n)])
				h := Hash(name)
				if got := atomic.LoadUint64(t.u64(eo + enHash)); got != h {
					c.fail("entry %d %q: stored hash %#x, name hashes to %#x", e, name, got, h)
				}
				if t.BucketOf(h) != b {
					c.fail("entry %d %q: in bucket %d, hashes to bucket %d", e, name, b, t.BucketOf(h))
				}
				if names[name] {
					c.fail("bucket %d: name %q has two entries", b, name)
				}
				names[name] = true
			}
			t.checkEntry(c, e, inList, quiescent)
			// A fast release leaves its entry idle without the latch, so it
			// cannot free the bucket's other idle entry: only latched idle
			// entries are bounded (every idle entry is reused or reclaimed
			// by the next allocation all the same).
			if t.entryEmpty(eo) && uint32(atomic.LoadUint64(t.u64(eo+enFast))) == fastLatched {
				if idle++; idle > 1 {
					c.fail("bucket %d: %d latched idle entries (at most one is kept)", b, idle)
				}
			}
			next = atomic.LoadUint32(t.u32(eo + enNext))
		}
	}
	for e := uint32(0); e < nRes; e++ {
		st := atomic.LoadUint32(t.u32(t.entryOff(e) + enState))
		if st == 0 {
			if fw := atomic.LoadUint64(t.u64(t.entryOff(e) + enFast)); uint32(fw) != fastLatched {
				c.fail("entry %d: free but its fast word is %#x (free entries are latched)", e, fw)
			}
			continue
		}
		if st-1 >= t.l.buckets {
			c.fail("entry %d: state %d names no bucket", e, st)
		} else if !inChain[e] {
			c.fail("entry %d: live in bucket %d but not in its chain", e, st-1)
		}
	}
	for s := uint32(0); s < nSlots; s++ {
		sw := atomic.LoadUint64(t.u64(t.slotOff(s) + slWord))
		st := wordState(sw)
		switch st {
		case SlotFree:
			continue
		case SlotWaiting, SlotHeld, SlotWatching:
			if !inList[s] {
				c.fail("slot %d: state %d but in no list", s, st)
			}
			if e := s - uint32(t.l.MaxRequests); s >= uint32(t.l.MaxRequests) {
				if se := atomic.LoadUint32(t.u32(t.slotOff(s) + slEntry)); st != SlotHeld || se != e+1 {
					c.fail("slot %d: reserved for entry %d but state %d on entry %d", s, e, st, int64(se)-1)
				}
			}
		case SlotClaimed, SlotStolen:
			if st == SlotClaimed && s >= uint32(t.l.MaxRequests) {
				c.fail("slot %d: reserved for entry %d but CLAIMED", s, s-uint32(t.l.MaxRequests))
			}
			if !quiescent {
				continue // changes without a latch
			}
		default:
			c.fail("slot %d: invalid state %d", s, st)
			continue
		}
		ag := wordAgent(sw)
		t.checkTag(c, s, sw, quiescent)
		if ag >= nAg {
			c.fail("slot %d: agent %d out of range", s, ag)
		} else if aw := atomic.LoadUint64(t.u64(t.agentOff(ag) + agWord)); wordState(aw) == AgentFree {
			c.fail("slot %d: state %d owned by free agent record %d", s, st, ag)
		}
	}
	for idx := uint32(0); idx < nAg; idx++ {
		aw := atomic.LoadUint64(t.u64(t.agentOff(idx) + agWord))
		switch wordState(aw) {
		case AgentFree:
			if aw != 0 {
				c.fail("agent %d: free record with non-zero word %#x", idx, aw)
			}
		case AgentRegistering:
			if quiescent {
				c.fail("agent %d: registering in a quiescent table", idx)
			}
		case AgentAlive:
			if agentWordPID(aw) <= 0 {
				c.fail("agent %d: alive with pid %d", idx, agentWordPID(aw))
			}
			if _, _, err := t.coOwner(idx); err != nil {
				c.fail("%v", err)
			}
		default:
			c.fail("agent %d: invalid state %d", idx, wordState(aw))
		}
	}
	if len(c.errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d invariant violations:\n%w", ErrCorrupt, len(c.errs), errors.Join(c.errs...))
}

func (t *Table) checkEntry(c *checker, e uint32, inList []bool, quiescent bool) {
	nReq, nSlots := uint32(t.l.MaxRequests), t.l.slots
	eo := t.entryOff(e)
	nHeld := atomic.LoadUint32(t.u32(eo + enNHeld))
	hMode := atomic.LoadUint32(t.u32(eo + enHMode))
	token := atomic.LoadUint64(t.u64(eo + enToken))
	qHead := atomic.LoadUint32(t.u32(eo + enQHead))
	t.checkFast(c, e, quiescent)
	// Held list.
	var prev, count uint32
	tokens := map[uint64]bool{}
	next := atomic.LoadUint32(t.u32(eo + enHHead))
	for next != 0 {
		s := next - 1
		if s >= nSlots {
			c.fail("entry %d: held list index %d out of range", e, next)
			break
		}
		if inList[s] {
			c.fail("entry %d: held slot %d reached twice", e, s)
			break
		}
		inList[s] = true
		count++
		so := t.slotOff(s)
		sw := atomic.LoadUint64(t.u64(so + slWord))
		if wordState(sw) != SlotHeld {
			c.fail("entry %d: slot %d in held list has state %d", e, s, wordState(sw))
		}
		if se := atomic.LoadUint32(t.u32(so + slEntry)); se != e+1 {
			c.fail("entry %d: held slot %d points at entry %d", e, s, int64(se)-1)
		}
		if p := atomic.LoadUint32(t.u32(so + slPrev)); p != prev {
			c.fail("entry %d: held slot %d prev %d, want %d", e, s, p, prev)
		}
		if m := atomic.LoadUint32(t.u32(so + slMode)); m != hMode {
			c.fail("entry %d: held slot %d mode %d, entry held in mode %d", e, s, m, hMode)
		}
		tok := atomic.LoadUint64(t.u64(so + slToken))
		if tok == 0 || tok > token {
			c.fail("entry %d: held slot %d token %d, entry counter %d", e, s, tok, token)
		}
		if tokens[tok] {
			c.fail("entry %d: token %d held twice", e, tok)
		}
		tokens[tok] = true
		prev = next
		next = atomic.LoadUint32(t.u32(so + slNext))
	}
	if count != nHeld {
		c.fail("entry %d: held list has %d slots, nHeld %d", e, count, nHeld)
	}
	if hMode != ModeShared && nHeld > 1 {
		c.fail("entry %d: %d holders in exclusive mode", e, nHeld)
	}
	// Queue.
	prev, count = 0, 0
	var lastSeq uint32
	next = qHead
	for next != 0 {
		s := next - 1
		if s >= nReq {
			c.fail("entry %d: queue index %d out of range", e, next)
			break
		}
		if inList[s] {
			c.fail("entry %d: queued slot %d reached twice", e, s)
			break
		}
		inList[s] = true
		so := t.slotOff(s)
		sw := atomic.LoadUint64(t.u64(so + slWord))
		if wordState(sw) != SlotWaiting {
			c.fail("entry %d: slot %d in queue has state %d", e, s, wordState(sw))
		}
		if se := atomic.LoadUint32(t.u32(so + slEntry)); se != e+1 {
			c.fail("entry %d: queued slot %d points at entry %d", e, s, int64(se)-1)
		}
		if p := atomic.LoadUint32(t.u32(so + slPrev)); p != prev {
			c.fail("entry %d: queued slot %d prev %d, want %d", e, s, p, prev)
		}
		seq := atomic.LoadUint32(t.u32(so + slSeq))
		if count > 0 && int32(seq-lastSeq) <= 0 {
			c.fail("entry %d: queue out of order: seq %d after %d", e, seq, lastSeq)
		}
		// A bounded table leaves a free name to its head, which takes it
		// itself (passOn, TakeTurn): there a compatible head may wait.
		if count == 0 && t.l.bound == 0 && compatible(t, eo, atomic.LoadUint32(t.u32(so+slMode))) {
			c.fail("entry %d: queue head slot %d is grantable but waits", e, s)
		}
		lastSeq = seq
		count++
		prev = next
		next = atomic.LoadUint32(t.u32(so + slNext))
	}
	if tail := atomic.LoadUint32(t.u32(eo + enQTail)); tail != prev {
		c.fail("entry %d: queue tail %d, last slot %d", e, tail, prev)
	}
	if n := atomic.LoadUint32(t.u32(eo + enNWait)); n != count {
		c.fail("entry %d: queue has %d slots, nWait %d", e, count, n)
	}
	t.checkWatches(c, e, inList)
}

// checkWatches verifies entry e's watch list (watch.go): acyclic, doubly
// linked, made of WATCHING request slots (never a reserved slot) that point
// at e, in a known mode; and a watched entry is latched (off the fast path).
func (t *Table) checkWatches(c *checker, e uint32, inList []bool) {
	eo := t.entryOff(e)
	var prev uint32
	next := atomic.LoadUint32(t.u32(eo + enWHead))
	if fw := atomic.LoadUint64(t.u64(eo + enFast)); next != 0 && uint32(fw) != fastLatched {
		c.fail("entry %d: watched but its fast word is %#x (a watched entry stays latched)", e, fw)
	}
	for next != 0 {
		s := next - 1
		if s >= uint32(t.l.MaxRequests) {
			c.fail("entry %d: watch list index %d out of range (reserved slots never watch)", e, next)
			break
		}
		if inList[s] {
			c.fail("entry %d: watching slot %d reached twice", e, s)
			break
		}
		inList[s] = true
		so := t.slotOff(s)
		if st := wordState(atomic.LoadUint64(t.u64(so + slWord))); st != SlotWatching {
			c.fail("entry %d: slot %d in watch list has state %d", e, s, st)
		}
		if se := atomic.LoadUint32(t.u32(so + slEntry)); se != e+1 {
			c.fail("entry %d: watching slot %d points at entry %d", e, s, int64(se)-1)
		}
		if p := atomic.LoadUint32(t.u32(so + slPrev)); p != prev {
			c.fail("entry %d: watching slot %d prev %d, want %d", e, s, p, prev)
		}
		if m := atomic.LoadUint32(t.u32(so + slMode)); m > ModeAny {
			c.fail("entry %d: watching slot %d mode %d", e, s, m)
		}
		prev = next
		next = atomic.LoadUint32(t.u32(so + slNext))
	}
}

// checkFast verifies entry e's fast word (fast.go). With every latch held,
// only the fast path changes it, and only between idle and held: the lists
// and the latched/fast distinction are stable; whether the holder is an
// orphan is checked only in a quiescent table (a Close racing with an
// acquire leaves one for a moment).
func (t *Table) checkFast(c *checker, e uint32, quiescent bool) {
	eo := t.entryOff(e)
	fw := atomic.LoadUint64(t.u64(eo + enFast))
	st, ctr := uint32(fw), uint32(fw>>32)
	if st == fastLatched {
		return
	}
	if st&fastInfl != 0 {
		c.fail("entry %d: fast word %#x is being moved to the held list with no latch owner", e, fw)
		return
	}
	ag, held := fastHolder(st)
	if st != fastIdle && !held {
		c.fail("entry %d: invalid fast word %#x", e, fw)
		return
	}
	// A bounded table hands an entry with a queue to the fast path while
	// its head was left the name (fairness.go): only its held list is empty.
	if !t.heldEmpty(eo) || t.l.bound == 0 && (!t.listsEmpty(eo) || atomic.LoadUint32(t.u32(eo+enNWait)) != 0) {
		c.fail("entry %d: fast word %#x but its lists are not empty (nHeld %d, qHead %d)", e, fw,
			atomic.LoadUint32(t.u32(eo+enNHeld)), atomic.LoadUint32(t.u32(eo+enQHead)))
	}
	token := atomic.LoadUint64(t.u64(eo + enToken))
	if ctr < uint32(token) {
		c.fail("entry %d: fast counter %d below the low word of its token %d", e, ctr, token)
	}
	if !held {
		return
	}
	if ag >= uint32(t.l.MaxAgents) {
		c.fail("entry %d: fast holder agent %d out of range", e, ag)
		return
	}
	if quiescent && t.orphan(e, ag) {
		c.fail("entry %d: fast holder agent %d is not in use or never marked the entry (orphan)", e, ag)
	}
}
