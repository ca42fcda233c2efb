package table

import (
	"sync/atomic"
	"unsafe"
)

// Entries: one per live name, found by its hash in its bucket's chain,
// kept idle after its last user leaves and reused or reclaimed
// (docs/design.md §1). Every function here runs under the bucket's latch
// unless it says otherwise.

// noEntry is findEntry's and allocEntry's "no entry".
const noEntry = ^uint32(0)

func (t *Table) entryName(eo uint64, n uint32) string {
	return unsafe.String((*byte)(unsafe.Add(t.base, eo+enName)), int(n))
}

// findEntry walks bucket b's chain for name. The walk is bounded and every
// index is checked, so a corrupt chain yields ErrCorrupt, never a hang.
func (t *Table) findEntry(b uint32, name string, h uint64) (uint32, error) {
	bo := t.bucketOff(b)
	next := atomic.LoadUint32(t.u32(bo + bkHead))
	for steps := 0; next != 0; steps++ {
		e := next - 1
		if e >= uint32(t.l.MaxResources) || steps >= t.l.MaxResources {
			return noEntry, corruptf("bucket chain", next, "bucket %d", b)
		}
		eo := t.entryOff(e)
		if atomic.LoadUint32(t.u32(eo+enState)) != b+1 {
			return noEntry, corruptf("entry state", atomic.LoadUint32(t.u32(eo+enState)), "entry %d is in the chain of bucket %d", e, b)
		}
		if t.ld64(eo+enHash) == h {
			n := t.ld32(eo + enNameLen)
			if int(n) == len(name) && t.entryName(eo, n) == name {
				return e, nil
			}
		}
		next = t.ld32(eo + enNext)
	}
	return noEntry, nil
}

// Entries of names nobody holds or waits for. When a name's last holder and
// waiter leave, its entry stays in its bucket's chain, idle, so that the next
// request on the name finds it (no allocation); each bucket keeps at most one
// idle entry (emptying a second one under the latch frees the first; a fast
// release, without the latch, may leave a second one). A request for a new
// name reuses its bucket's idle entry under another name, else claims a free
// entry, else reclaims another bucket's idle entry under that bucket's latch
// taken without waiting. So a name no longer used never keeps an entry from
// a name that needs one: a million distinct names never fill the table.

// entryEmpty: nothing holds, waits on or watches the entry at offset eo (in
// its lists or by the fast path).
func (t *Table) entryEmpty(eo uint64) bool {
	if !t.listsEmpty(eo) || t.watched(eo) {
		return false
	}
	_, held := fastHolder(uint32(atomic.LoadUint64(t.u64(eo + enFast))))
	return !held
}

// heldEmpty: the entry's held list is empty (a fast holder aside). The
// queue may not be: a bounded table hands an entry whose head was left the
// name to the fast path (fairness.go).
func (t *Table) heldEmpty(eo uint64) bool {
	return t.ld32(eo+enNHeld) == 0 && t.ld32(eo+enHHead) == 0
}

// listsEmpty: the entry's held list and queue are empty.
func (t *Table) listsEmpty(eo uint64) bool {
	return t.ld32(eo+enNHeld) == 0 && t.ld32(eo+enQHead) == 0
}

// allocEntry finds an entry for name in bucket b and links it at the head of
// the chain. Its token counter starts at the bucket's high-water mark, so
// tokens of a name keep increasing across entry reuse.
func (t *Table) allocEntry(a *Agent, b uint32, name string, h uint64) (uint32, error) {
	if len(name) > t.l.MaxNameLen {
		return noEntry, corruptf("name length", len(name), "over MaxNameLen %d", t.l.MaxNameLen)
	}
	bo := t.bucketOff(b)
	// The bucket's idle entry, renamed.
	next := atomic.LoadUint32(t.u32(bo + bkHead))
	for steps := 0; next != 0 && next-1 < uint32(t.l.MaxResources) && steps < t.l.MaxResources; steps++ {
		e := next - 1
		eo := t.entryOff(e)
		if t.latchIdle(eo) {
			t.foldToken(eo, bo)
			t.nameEntry(eo, bo, name, h)
			return e, nil
		}
		next = t.ld32(eo + enNext)
	}
	n := uint32(t.l.MaxResources)
	for pass := 0; pass < 2; pass++ {
		start := a.entryHint.Load()
		for i := uint32(0); i < n; i++ {
			e := (start + i) % n
			eo := t.entryOff(e)
			sp := t.u32(eo + enState)
			st := atomic.LoadUint32(sp)
			if st != 0 {
				// Second pass: reclaim another bucket's idle entry.
				if pass == 0 || st-1 == b || st-1 >= t.l.buckets || !t.entryEmpty(eo) || !t.reclaim(a, e, st-1) {
					continue
				}
			}
			if !atomic.CompareAndSwapUint32(sp, 0, b+1) {
				continue
			}
			a.entryHint.Store(e)
			crash("entry.allocated")
			t.st32(eo+enQHead, 0)
			t.st32(eo+enQTail, 0)
			t.st32(eo+enHHead, 0)
			t.st32(eo+enNHeld, 0)
			t.st32(eo+enNWait, 0)
			t.st32(eo+enHMode, 0)
			t.st32(eo+enWHead, 0)
			t.nameEntry(eo, bo, name, h)
			atomic.StoreUint32(t.u32(eo+enNext), atomic.LoadUint32(t.u32(bo+bkHead)))
			atomic.StoreUint32(t.u32(bo+bkHead), e+1)
			crash("entry.linked")
			return e, nil
		}
	}
	return noEntry, fullf("resource entries (MaxResources)", int(n))
}

// nameEntry gives entry eo of bucket bo the name, hash and a token counter
// at or above the bucket's high-water mark (so the new name's tokens exceed
// every token of the names freed from the bucket), whose low word is at
// least the entry's own: the fast counter of an entry does not go back when
// it is renamed, so a fast word value is not reused for another grant before
// the counter wraps (fast.go).
func (t *Table) nameEntry(eo, bo uint64, name string, h uint64) {
	t.st64(eo+enToken, renamedToken(t.ld64(bo+bkMaxToken), t.ld64(eo+enToken)))
	t.st64(eo+enHash, h)
	// The name bytes are written plainly: they are read only under this
	// bucket's latch (or by tools that tolerate a torn read).
	copy(unsafe.Slice((*byte)(unsafe.Add(t.base, eo+enName)), len(name)), name)
	t.st32(eo+enNameLen, uint32(len(name)))
}

// renamedToken is the token a renamed entry starts from: the bucket's
// high-water mark, with the entry's old low word if that is larger. The
// high word is the high-water mark's, never raised: renames do not make
// tokens grow (a million renames must not bring a token near 2^64).
func renamedToken(bucketMax, old uint64) uint64 {
	return bucketMax&^lo32 | uint64(max(uint32(bucketMax), uint32(old)))
}

// foldToken raises bucket bo's token high-water mark to entry eo's counter,
// before the entry is freed or renamed.
func (t *Table) foldToken(eo, bo uint64) {
	if tok := t.ld64(eo + enToken); tok > t.ld64(bo+bkMaxToken) {
		t.st64(bo+bkMaxToken, tok)
	}
}

// reclaim frees idle entry e of another bucket ob, taking ob's latch only if
// it is free at once (we may hold our own bucket's latch: never wait for a
// second one). It reports whether e is now free.
func (t *Table) reclaim(a *Agent, e, ob uint32) bool {
	lw := t.latchWord(ob)
	if !atomic.CompareAndSwapUint32(lw, 0, a.Idx+1) {
		return false
	}
	eo := t.entryOff(e)
	ok := atomic.LoadUint32(t.u32(eo+enState)) == ob+1 && t.latchIdle(eo)
	if ok {
		t.freeEntry(e, ob)
	}
	t.unlatch(a, ob)
	return ok
}

// entryEmptied is called when entry e of bucket b may have become empty: it
// stays as the bucket's idle entry, and any other idle entry of the bucket is freed.
func (t *Table) entryEmptied(e, b uint32) {
	eo := t.entryOff(e)
	if !t.listsEmpty(eo) {
		return
	}
	next := atomic.LoadUint32(t.u32(t.bucketOff(b) + bkHead))
	for steps := 0; next != 0 && next-1 < uint32(t.l.MaxResources) && steps < t.l.MaxResources; steps++ {
		x := next - 1
		next = t.ld32(t.entryOff(x) + enNext)
		if x != e && t.latchIdle(t.entryOff(x)) {
			t.freeEntry(x, b)
		}
	}
	t.arm(eo)
}

// freeEntry frees entry e of bucket b (nothing holds or waits on it, and it
// is latched: see latchIdle): fold its token into the bucket's high-water
// mark, unlink it, free it.
func (t *Table) freeEntry(e, b uint32) {
	eo := t.entryOff(e)
	bo := t.bucketOff(b)
	t.foldToken(eo, bo)
	// Unlink from the chain (chains are short: the table has twice as many buckets as entries).
	prev := t.u32(bo + bkHead)
	for steps := 0; steps <= t.l.MaxResources; steps++ {
		cur := atomic.LoadUint32(prev)
		if cur == 0 || cur-1 >= uint32(t.l.MaxResources) {
			break
		}
		if cur == e+1 {
			atomic.StoreUint32(prev, t.ld32(eo+enNext))
			break
		}
		prev = t.u32(t.entryOff(cur-1) + enNext)
	}
	crash("entry.unlinked")
	t.st32(eo+enNameLen, 0)
	atomic.CompareAndSwapUint32(t.u32(eo+enState), b+1, 0)
}
