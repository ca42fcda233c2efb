package table

import "sync/atomic"

// The fast path: an exclusive request on a name that nobody holds or waits
// for is granted by one CAS on the entry's fast word, without a request slot
// or the bucket latch, and released by another.
//
// Fast word (entry offset enFast, 64 bits, atomic):
//
//	counter<<32 | state
//
//	state 0                 latched: the entry's lists (under the bucket
//	                        latch) are the truth; counter is meaningless.
//	                        Free entries are latched, and so is a zeroed file.
//	state fastIdle          idle: no holder, no waiter (both lists empty);
//	                        the next exclusive request CASes it to held.
//	state A+1               held exclusively by agent A through the fast
//	                        path; both lists are empty. The holder's Ref is
//	                        the entry's reserved slot F(e) = MaxRequests+e
//	                        with the counter as its serial: it needs no slot
//	                        claim, and no slot word says anything yet.
//	state fastInfl | A+1    being moved into the held list by a latch holder
//	                        (only under the latch: repair finishes it).
//
// The holder's grant time is in the entry's stamp word (enStamp), which it
// writes right after its CAS, with the counter of its grant (stamp.go);
// inflate copies it into the reserved slot's grant time.
//
// Tokens: while the entry is idle or fast-held, its token counter is
// hi32(entry token) | counter, and counter ≥ lo32(entry token). A fast grant
// moves the counter up by one in the same CAS that takes the entry, so two
// grants never share a token. Whoever latches the entry (own) first folds the
// counter into the entry's token. A counter at 2^32-1 is never taken by the
// fast path: the latched path carries into the high word. An entry's counter
// does not go back, not even when the entry is freed and given to another
// name (nameEntry keeps the larger low word), so a fast word value, and with
// it a fast Ref, is not reused for another grant before the counter wraps.
//
// Transitions:
//
//	idle  → held(A)      fast acquirer, CAS (counter+1), no latch
//	held(A) → idle       its holder's release, CAS on the exact word, no latch
//	idle  → latched      a latch holder about to queue, steal, share, rename
//	                     or free the entry (own, latchIdle)
//	held(A) → infl(A) → latched
//	                     a latch holder that needs the lists (own): F(e) is
//	                     made A's HELD slot (serial = counter) and linked
//	                     into the held list; the holder's release CAS then
//	                     fails and it releases F(e) under the latch like any
//	                     other holder
//	held(A) → latched    a latch holder that finds the hold orphaned (A's
//	                     record is not in use, or never marked the entry's
//	                     range: see orphan): the hold is dropped
//	latched → idle       the latch holder that leaves the entry empty (arm)
//
// A fast acquirer sets the entry's range bit in its agent record (agEntryMask)
// before its CAS, so a reaper finds every fast hold of a dead agent by
// scanning only those ranges, and a fast word that names an agent whose bit
// is not set is known to be an orphan. It reads the bucket chain and the name
// without the latch, so it may CAS an entry that was renamed or moved
// meanwhile (the counter makes such an ABA rare, not impossible). Once its
// CAS succeeded nobody can rename or free the entry, so it checks the entry's
// bucket and name again and, if they are not what it looked for, releases
// what it took and starts over.
const (
	fastLatched   = 0
	fastIdle      = 1 << 31
	fastInfl      = 1 << 30
	fastAgentMask = 1<<24 - 1
	lo32          = 1<<32 - 1
)

func fastWord(counter, state uint32) uint64 { return uint64(counter)<<32 | uint64(state) }

// fastHolder reports the agent that fast state st names (held or being
// inflated), if any.
func fastHolder(st uint32) (uint32, bool) {
	if st == fastLatched || st == fastIdle || st&^(fastInfl|fastAgentMask) != 0 || st&fastAgentMask == 0 {
		return 0, false
	}
	return st&fastAgentMask - 1, true
}

// fastState is the outcome of fastAcquire.
type fastState int

const (
	fastMiss    fastState = iota // not taken: use the latch path
	fastGranted                  // granted
	fastUndone                   // took the wrong entry and gave it back: try again
)

// fastChainSteps bounds the latch-free walk of a bucket chain (chains are
// short: the table has twice as many buckets as entries).
const fastChainSteps = 4

// entryRange is the range of entry e in agEntryMask: at most 64 ranges of
// 2^entryShift entries each (a shift, not a division: it is on the fast path).
func (t *Table) entryRange(e uint32) uint32 { return e >> t.l.entryShift }

// fastAcquire tries to grant agent a an exclusive hold on name (bucket b)
// with one CAS on an idle entry's fast word.
func (t *Table) fastAcquire(a *Agent, b uint32, name string, h uint64, w *Wakes) (Ref, uint64, fastState) {
	nRes := uint32(t.l.MaxResources)
	next := atomic.LoadUint32(t.u32(t.bucketOff(b) + bkHead))
	for steps := 0; next != 0 && steps < fastChainSteps; steps++ {
		e := next - 1
		if e >= nRes {
			return Ref{}, 0, fastMiss
		}
		eo := t.entryOff(e)
		fp := t.u64(eo + enFast)
		v := atomic.LoadUint64(fp)
		if uint32(v) == fastIdle && t.ld64(eo+enHash) == h && t.nameIs(eo, name) {
			ctr := uint32(v >> 32)
			if ctr == lo32 {
				return Ref{}, 0, fastMiss // the counter carries: the latch path does it
			}
			if t.l.bound != 0 && !t.fastMayBarge(eo) {
				return Ref{}, 0, fastMiss // a bounded table's starved head: the latch path serves it (fairness.go)
			}
			// Mark the entry's range before taking it, so a reaper of ours
			// finds the hold (no atomic once the range is marked).
			if bit := uint64(1) << t.entryRange(e); atomic.LoadUint64(a.entryMask)&bit == 0 {
				atomic.OrUint64(a.entryMask, bit)
			}
			// The token's high word is read before the CAS: while the fast
			// word is idle only a latch holder changes it, and a latch
			// holder first moves the word off idle, so a CAS that succeeds
			// proves this read current. Read after the CAS, it could be the
			// high word of a carry made by a steal of this very hold.
			hi := t.ld64(eo+enToken) &^ lo32
			held := fastWord(ctr+1, a.Idx+1)
			if !atomic.CompareAndSwapUint64(fp, v, held) {
				return Ref{}, 0, fastMiss
			}
			// The grant's time, from the coarse clock (stamp.go): no
			// clock read on this path.
			storeRelease64(t.u64(eo+enStamp), fastStamp(ctr+1))
			crash("fast.held")
			ref := Ref{Slot: t.fastSlot(e), Serial: ctr + 1, Bucket: b}
			if atomic.LoadUint32(t.u32(eo+enState)) != b+1 || t.ld64(eo+enHash) != h || !t.nameIs(eo, name) {
				// Renamed or moved between our look and our CAS: give it back.
				if !atomic.CompareAndSwapUint64(fp, held, fastWord(ctr+1, fastIdle)) {
					ref.Bucket = atomic.LoadUint32(t.u32(eo+enState)) - 1
					t.Release(a, ref, w) // moved to the held list meanwhile
				}
				return Ref{}, 0, fastUndone
			}
			return ref, hi | uint64(ctr+1), fastGranted
		}
		next = atomic.LoadUint32(t.u32(eo + enNext))
	}
	return Ref{}, 0, fastMiss
}

// nameIs compares entry eo's name with name, reading without the latch (a
// torn read only makes the comparison fail, or succeed for a CAS that the
// fast acquirer checks again).
func (t *Table) nameIs(eo uint64, name string) bool {
	n := t.ld32(eo + enNameLen)
	return int(n) == len(name) && len(name) <= t.l.MaxNameLen && t.entryName(eo, n) == name
}

// fastRelease gives up fast hold r of agent a (r.Slot is an entry's
// reserved slot, r.Serial the counter of the grant): one CAS on the exact
// fast word. It reports false when the hold is no longer a fast hold (moved
// to the held list, stolen, reaped) or not a's.
func (t *Table) fastRelease(a *Agent, r Ref) bool {
	e := r.Slot - uint32(t.l.MaxRequests)
	if e >= uint32(t.l.MaxResources) {
		return false
	}
	fp := t.u64(t.entryOff(e) + enFast)
	if !atomic.CompareAndSwapUint64(fp, fastWord(r.Serial, a.Idx+1), fastWord(r.Serial, fastIdle)) {
		return false
	}
	crash("fast.released")
	return true
}

// fastHeld reports whether r is a fast hold of agent a (or one a latch
// holder is moving to the held list right now), and its token. Read without
// the latch.
func (t *Table) fastHeld(a *Agent, r Ref) (uint64, bool) {
	e := r.Slot - uint32(t.l.MaxRequests)
	if e >= uint32(t.l.MaxResources) {
		return 0, false
	}
	eo := t.entryOff(e)
	// Token first, then the fast word: if the word still names this hold,
	// the hold lasted across the token read, so its high word is the
	// grant's (a steal changes it only after moving the word off the hold).
	tok := atomic.LoadUint64(t.u64(eo + enToken))
	v := atomic.LoadUint64(t.u64(eo + enFast))
	if v&^fastInfl != fastWord(r.Serial, a.Idx+1) {
		return 0, false
	}
	return tok&^lo32 | uint64(r.Serial), true
}

// fastView reads entry eo's fast word and a token word whose high word is
// the one a fast holder named by that fast word was granted with: the
// token is read before and after the fast word (the high word only grows,
// and only under the latch), and again if it moved, for a reader without
// the latch.
func (t *Table) fastView(eo uint64) (tok, fw uint64) {
	tp, fp := t.u64(eo+enToken), t.u64(eo+enFast)
	for tries := 0; ; tries++ {
		tok = atomic.LoadUint64(tp)
		fw = atomic.LoadUint64(fp)
		if again := atomic.LoadUint64(tp); again>>32 == tok>>32 || tries == 8 {
			return tok, fw
		}
	}
}

// ---- under the latch of the entry's bucket ----

// foldCounter makes entry eo's token the fast path's counter value.
func (t *Table) foldCounter(eo uint64, ctr uint32) {
	t.st64(eo+enToken, t.ld64(eo+enToken)&^lo32|uint64(ctr))
}

// own latches entry e: afterwards its lists are the truth. An idle entry is
// taken from the fast path; a fast holder is moved into the held list (an
// orphaned one is dropped).
func (t *Table) own(e uint32) { t.ownEntry(e, true) }

// ownEntry is own; with link false (repair, which rebuilds every list from
// the slot words afterwards) a fast holder's reserved slot is only made HELD.
func (t *Table) ownEntry(e uint32, link bool) {
	eo := t.entryOff(e)
	fp := t.u64(eo + enFast)
	for {
		v := atomic.LoadUint64(fp)
		st, ctr := uint32(v), uint32(v>>32)
		switch {
		case st == fastLatched:
			return
		case st == fastIdle:
			t.foldCounter(eo, ctr)
			if atomic.CompareAndSwapUint64(fp, v, fastLatched) {
				return
			}
		case st&fastInfl != 0:
			t.inflate(e, v, link) // left half done by a dead latch owner
			return
		default:
			ag, ok := fastHolder(st)
			if !ok {
				atomic.StoreUint64(fp, fastLatched) // garbage: the checker reports such words
				return
			}
			t.foldCounter(eo, ctr)
			if t.orphan(e, ag) {
				if atomic.CompareAndSwapUint64(fp, v, fastLatched) {
					return
				}
				continue
			}
			if atomic.CompareAndSwapUint64(fp, v, v|fastInfl) {
				crash("fast.inflating")
				t.inflate(e, v|fastInfl, link)
				return
			}
		}
	}
}

// orphan reports whether a fast hold of entry e by agent ag can have no
// owner: ag's record is not in use (a process that died between a Close of
// its Manager and an acquire racing with it), or ag never marked e's range
// (the record was reused by another process). A live holder always marked
// the range before its CAS.
func (t *Table) orphan(e, ag uint32) bool {
	if ag >= uint32(t.l.MaxAgents) {
		return true
	}
	off := t.agentOff(ag)
	if wordState(atomic.LoadUint64(t.u64(off+agWord))) != AgentAlive {
		return true
	}
	return atomic.LoadUint64(t.u64(off+agEntryMask))&(1<<t.entryRange(e)) == 0
}

// inflate finishes moving the fast holder named by fast word v (state
// fastInfl|A+1) into e's held list: e's reserved slot becomes A's HELD slot,
// with the counter as its serial (with link false: only the slot). The
// counter in v is the holder's: it does not move while the word says
// inflating. Every step can be redone: repair finishes what a dead latch
// owner began.
func (t *Table) inflate(e uint32, v uint64, link bool) {
	eo := t.entryOff(e)
	ctr := uint32(v >> 32)
	t.foldCounter(eo, ctr) // again: a dead owner may have stopped anywhere
	ag, _ := fastHolder(uint32(v))
	s := t.fastSlot(e)
	so := t.slotOff(s)
	sp := t.u64(so + slWord)
	want := slotWord(ctr, ag, SlotHeld)
	if ag < uint32(t.l.MaxAgents) && (!link || t.heldEmpty(eo) || atomic.LoadUint64(sp) == want) {
		// The holder's reapers must find the slot: mark its range first.
		am := t.u64(t.agentOff(ag) + agSlotMask)
		if bit := uint64(1) << slotRange(s, t.l.slots); atomic.LoadUint64(am)&bit == 0 {
			atomic.OrUint64(am, bit)
		}
		t.st32(so+slEntry, e+1)
		t.st32(so+slMode, ModeExclusive)
		t.st32(so+slFlags, 0)
		t.st64(so+slToken, t.ld64(eo+enToken))
		t.st64(so+slGrant, uint64(t.fastSince(eo, ctr)))
		t.st64(so+slEnqueue, 0)
		if link && t.heldEmpty(eo) {
			t.st32(so+slPrev, 0)
			t.st32(so+slNext, 0)
			t.st32(eo+enHHead, s+1)
			t.st32(eo+enNHeld, 1)
			t.st32(eo+enHMode, ModeExclusive)
		}
		atomic.StoreUint64(sp, want)
	}
	atomic.StoreUint64(t.u64(eo+enFast), fastLatched)
}

// fastSince is the grant time (unix nanoseconds) of the fast grant with
// counter ctr on entry eo: its stamp's, or now if the holder has not
// stamped it yet (it was granted a moment ago).
func (t *Table) fastSince(eo uint64, ctr uint32) int64 {
	now := nowNano()
	if since := stampTime(atomic.LoadUint64(t.u64(eo+enStamp)), ctr, now); since > 0 {
		return since
	}
	return now
}

// latchIdle latches entry eo if nobody holds, waits on or watches it
// (before it is renamed or freed) and reports whether it did.
func (t *Table) latchIdle(eo uint64) bool {
	if !t.listsEmpty(eo) || t.watched(eo) {
		return false
	}
	fp := t.u64(eo + enFast)
	for {
		v := atomic.LoadUint64(fp)
		switch uint32(v) {
		case fastLatched:
			return true
		case fastIdle:
			t.foldCounter(eo, uint32(v>>32))
			if atomic.CompareAndSwapUint64(fp, v, fastLatched) {
				return true
			}
		default:
			return false // held by the fast path
		}
	}
}

// arm hands latched entry eo, now empty, back to the fast path (not while
// it is watched: a watched entry stays latched, see watch.go).
func (t *Table) arm(eo uint64) {
	fp := t.u64(eo + enFast)
	if atomic.LoadUint64(fp) != fastLatched || !t.listsEmpty(eo) || t.watched(eo) {
		return
	}
	if ctr := uint32(t.ld64(eo + enToken)); ctr != lo32 {
		atomic.StoreUint64(fp, fastWord(ctr, fastIdle))
	}
}

// Holds reports whether request r belongs to agent a and holds its lock (in
// the held list, or by the fast path), read without the latch.
func (t *Table) Holds(a *Agent, r Ref) bool {
	if r.Slot >= t.l.slots {
		return false
	}
	if _, ok := t.fastHeld(a, r); ok {
		return true
	}
	// Not a fast hold (any more): a HELD slot, unless the fast hold was
	// being moved there and we read its slot too early; look once more.
	sp := t.u64(t.slotOff(r.Slot) + slWord)
	for tries := 0; tries < 3; tries++ {
		if atomic.LoadUint64(sp) == slotWord(r.Serial, a.Idx, SlotHeld) {
			return true
		}
		if _, ok := t.fastHeld(a, r); !ok {
			return false
		}
	}
	return false
}

// ClaimsSettled reports whether no slot of agent a is CLAIMED: no request
// of a is between its claim and its outcome.
func (t *Table) ClaimsSettled(a *Agent) bool {
	settled := true
	Guard(func() error {
		mask := atomic.LoadUint64(a.slotMask)
		n := uint32(t.l.MaxRequests)
		for s := uint32(0); s < n; s++ {
			if r := slotRange(s, t.l.slots); mask&(1<<r) == 0 {
				s = rangeEnd(r, t.l.slots) - 1
				continue
			}
			sw := atomic.LoadUint64(t.u64(t.slotOff(s) + slWord))
			if wordAgent(sw) == a.Idx && wordState(sw) == SlotClaimed {
				settled = false
				return nil
			}
		}
		return nil
	})
	return settled
}
