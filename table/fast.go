package table

import "sync/atomic"

// The fast path: an exclusive request on a name that nobody holds or waits
// for is granted by one CAS on the entry's fast word, without the bucket
// latch, and released by another.
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
//	state s+1               held by slot s, exclusively, by the fast path;
//	                        both lists are empty and slot s is CLAIMED by the
//	                        holder with its entry field naming this entry.
//	state fastInfl | s+1    being moved into the held list by a latch holder
//	                        (only under the latch: repair finishes it).
//
// Tokens: while the entry is idle or fast-held, its token counter is
// hi32(entry token) | counter, and counter ≥ lo32(entry token). A fast grant
// moves the counter up by one in the same CAS that takes the entry, so two
// grants never share a token. Whoever latches the entry (own) first folds the
// counter into the entry's token. A counter at 2^32-1 is never taken by the
// fast path: the latched path carries into the high word.
//
// Transitions:
//
//	idle  → held(s)      fast acquirer, CAS (counter+1), no latch
//	held(s) → idle       its holder's release, CAS, no latch
//	idle  → latched      a latch holder about to queue, steal, share, rename
//	                     or free the entry (own, latchIdle)
//	held(s) → infl(s) → latched
//	                     a latch holder that needs the lists (own): slot s is
//	                     linked into the held list and marked HELD; the
//	                     holder's release CAS then fails and it releases
//	                     under the latch like any other holder
//	latched → idle       the latch holder that leaves the entry empty (arm)
//
// A fast acquirer reads the bucket chain and the name without the latch, so
// it may CAS an entry that was renamed or moved meanwhile (the counter makes
// such an ABA rare, not impossible). Once its CAS succeeded nobody can rename
// or free the entry, so it checks the entry's bucket and name again and, if
// they are not what it looked for, releases what it took and starts over.
const (
	fastLatched  = 0
	fastIdle     = 1 << 31
	fastInfl     = 1 << 30
	fastSlotMask = 1<<30 - 1
	lo32         = 1<<32 - 1
)

func fastWord(counter, state uint32) uint64 { return uint64(counter)<<32 | uint64(state) }

// fastHolder reports the slot that fast state st names (held or being
// inflated), if any.
func fastHolder(st uint32) (uint32, bool) {
	if st == fastLatched || st == fastIdle || st&^(fastInfl|fastSlotMask) != 0 || st&fastSlotMask == 0 {
		return 0, false
	}
	return st&fastSlotMask - 1, true
}

// fastState is the outcome of fastAcquire.
type fastState int

const (
	fastMiss    fastState = iota // not taken: use the latch path with the same slot
	fastGranted                  // granted
	fastUndone                   // took the wrong entry and gave it back: the slot is freed
)

// fastChainSteps bounds the latch-free walk of a bucket chain (chains are
// short: the table has twice as many buckets as entries).
const fastChainSteps = 4

// fastAcquire tries to grant claimed slot s an exclusive hold on name
// (bucket b) with one CAS on an idle entry's fast word.
func (t *Table) fastAcquire(a *Agent, s, serial, b uint32, name string, h uint64, w *Wakes) (uint64, fastState) {
	nRes := uint32(t.l.MaxResources)
	next := atomic.LoadUint32(t.u32(t.bucketOff(b) + bkHead))
	for steps := 0; next != 0 && steps < fastChainSteps; steps++ {
		e := next - 1
		if e >= nRes {
			return 0, fastMiss
		}
		eo := t.entryOff(e)
		fp := t.u64(eo + enFast)
		v := atomic.LoadUint64(fp)
		if uint32(v) == fastIdle && t.ld64(eo+enHash) == h && t.nameIs(eo, name) {
			ctr := uint32(v >> 32)
			if ctr == lo32 {
				return 0, fastMiss // the counter carries: the latch path does it
			}
			so := t.slotOff(s)
			t.st32(so+slEntry, e+1)
			t.st32(so+slMode, ModeExclusive)
			t.st32(so+slFlags, 0)
			t.st64(so+slGrant, 0)
			t.st64(so+slToken, t.ld64(eo+enToken)&^lo32|uint64(ctr+1))
			if !atomic.CompareAndSwapUint64(fp, v, fastWord(ctr+1, s+1)) {
				return 0, fastMiss
			}
			crash("fast.held")
			if atomic.LoadUint32(t.u32(eo+enState)) != b+1 || t.ld64(eo+enHash) != h || !t.nameIs(eo, name) {
				// Renamed or moved between our look and our CAS: give it back.
				t.Release(a, Ref{Slot: s, Serial: serial, Bucket: atomic.LoadUint32(t.u32(eo+enState)) - 1}, w)
				return 0, fastUndone
			}
			// The entry's token is stable now (only a latch holder changes
			// it, and only after moving us to the held list, where it keeps
			// our token): this is the token the CAS reserved.
			token := t.ld64(eo+enToken)&^lo32 | uint64(ctr+1)
			t.st64(so+slToken, token)
			return token, fastGranted
		}
		next = atomic.LoadUint32(t.u32(eo + enNext))
	}
	return 0, fastMiss
}

// nameIs compares entry eo's name with name, reading without the latch (a
// torn read only makes the comparison fail, or succeed for a CAS that the
// fast acquirer checks again).
func (t *Table) nameIs(eo uint64, name string) bool {
	n := t.ld32(eo + enNameLen)
	return int(n) == len(name) && len(name) <= t.l.MaxNameLen && t.entryName(eo, n) == name
}

// fastRelease gives up the fast hold of claimed slot s (word sw). It
// reports false when the hold was moved to the held list meanwhile (the
// caller then releases under the latch).
func (t *Table) fastRelease(s uint32, sw uint64) bool {
	e := t.ld32(t.slotOff(s)+slEntry) - 1
	if e >= uint32(t.l.MaxResources) {
		return false
	}
	fp := t.u64(t.entryOff(e) + enFast)
	v := atomic.LoadUint64(fp)
	if uint32(v) != s+1 || !atomic.CompareAndSwapUint64(fp, v, v&^lo32|fastIdle) {
		return false
	}
	crash("fast.released")
	atomic.CompareAndSwapUint64(t.u64(t.slotOff(s)+slWord), sw, slotWord(wordSerial(sw), wordAgent(sw), SlotFree))
	return true
}

// ---- under the latch of the entry's bucket ----

// foldCounter makes entry eo's token the fast path's counter value.
func (t *Table) foldCounter(eo uint64, ctr uint32) {
	t.st64(eo+enToken, t.ld64(eo+enToken)&^lo32|uint64(ctr))
}

// own latches entry e: afterwards its lists are the truth. An idle entry is
// taken from the fast path; a fast holder is moved into the held list.
func (t *Table) own(e uint32) { t.ownEntry(e, true) }

// ownEntry is own; with link false (repair, which rebuilds every list from
// the slot words afterwards) a fast holder's slot is only marked HELD.
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
			if _, ok := fastHolder(st); !ok {
				atomic.StoreUint64(fp, fastLatched) // garbage: the checker reports such words
				return
			}
			t.foldCounter(eo, ctr)
			if atomic.CompareAndSwapUint64(fp, v, v|fastInfl) {
				crash("fast.inflating")
				t.inflate(e, v|fastInfl, link)
				return
			}
		}
	}
}

// inflate finishes moving the fast holder named by fast word v (state
// fastInfl|s+1) into e's held list (with link false: only marks its slot
// HELD). The counter in v is the holder's: it does not move while the word
// says inflating.
func (t *Table) inflate(e uint32, v uint64, link bool) {
	eo := t.entryOff(e)
	t.foldCounter(eo, uint32(v>>32)) // again: a dead owner may have stopped anywhere
	s, _ := fastHolder(uint32(v))
	if s < uint32(t.l.MaxRequests) && (!link || t.listsEmpty(eo)) {
		so := t.slotOff(s)
		sp := t.u64(so + slWord)
		sw := atomic.LoadUint64(sp)
		if t.ld32(so+slEntry) == e+1 && (wordState(sw) == SlotClaimed || wordState(sw) == SlotHeld) {
			t.st64(so+slToken, t.ld64(eo+enToken))
			t.st32(so+slMode, ModeExclusive)
			if link {
				t.st32(so+slPrev, 0)
				t.st32(so+slNext, 0)
				t.st32(eo+enHHead, s+1)
				t.st32(eo+enNHeld, 1)
				t.st32(eo+enHMode, ModeExclusive)
			}
			if wordState(sw) == SlotClaimed {
				atomic.CompareAndSwapUint64(sp, sw, slotWord(wordSerial(sw), wordAgent(sw), SlotHeld))
			}
		}
	}
	atomic.StoreUint64(t.u64(eo+enFast), fastLatched)
}

// latchIdle latches entry eo if nobody holds or waits on it (before it is
// renamed or freed) and reports whether it did.
func (t *Table) latchIdle(eo uint64) bool {
	if !t.listsEmpty(eo) {
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

// arm hands latched entry eo, now empty, back to the fast path.
func (t *Table) arm(eo uint64) {
	fp := t.u64(eo + enFast)
	if atomic.LoadUint64(fp) != fastLatched || !t.listsEmpty(eo) {
		return
	}
	if ctr := uint32(t.ld64(eo + enToken)); ctr != lo32 {
		atomic.StoreUint64(fp, fastWord(ctr, fastIdle))
	}
}

// fastHolds reports whether claimed slot s is the fast holder of its entry
// (or is being moved to the held list), read without the latch.
func (t *Table) fastHolds(s uint32) bool {
	e := atomic.LoadUint32(t.u32(t.slotOff(s)+slEntry)) - 1
	if e >= uint32(t.l.MaxResources) {
		return false
	}
	h, ok := fastHolder(uint32(atomic.LoadUint64(t.u64(t.entryOff(e) + enFast))))
	return ok && h == s
}

// Holds reports whether slot s belongs to agent a and holds its lock (in the
// held list, or by the fast path), read without the latch.
func (t *Table) Holds(a *Agent, s uint32) bool {
	if s >= uint32(t.l.MaxRequests) {
		return false
	}
	sp := t.u64(t.slotOff(s) + slWord)
	for tries := 0; tries < 3; tries++ {
		sw := atomic.LoadUint64(sp)
		if wordAgent(sw) != a.Idx {
			return false
		}
		switch wordState(sw) {
		case SlotHeld:
			return true
		case SlotClaimed:
			if t.fastHolds(s) {
				return true
			}
			if atomic.LoadUint64(sp) != sw {
				continue // moved to the held list meanwhile: look again
			}
		}
		return false
	}
	return false
}

// ClaimsSettled reports whether no slot of agent a is CLAIMED except its
// fast holds: no request of a is between its claim and its outcome.
func (t *Table) ClaimsSettled(a *Agent) bool {
	settled := true
	Guard(func() error {
		mask := atomic.LoadUint64(a.slotMask)
		n := uint32(t.l.MaxRequests)
		for s := uint32(0); s < n; s++ {
			if r := slotRange(s, n); mask&(1<<r) == 0 {
				s = rangeEnd(r, n) - 1
				continue
			}
			sw := atomic.LoadUint64(t.u64(t.slotOff(s) + slWord))
			if wordAgent(sw) == a.Idx && wordState(sw) == SlotClaimed && !t.fastHolds(s) {
				settled = false
				return nil
			}
		}
		return nil
	})
	return settled
}
