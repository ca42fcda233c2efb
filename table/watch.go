package table

import (
	"sync/atomic"
)

// Watches: an agent that waits for a name's state without requesting it
// (manager.WaitUnlocked, manager.Watch) is told of every change by whoever
// makes it, like a waiter is told of its grant.
//
// A watch is a request slot of the watching agent in state WATCHING, linked
// into its entry's watch list (entry field wHead; slot fields prev and next),
// never into the queue or the held list, so it takes no part in grants: no
// request is granted later or sooner, and no token is consumed, because of it.
// Its slot's entry field names the entry, its mode field the mode it waits
// for (ModeExclusive or ModeShared: until a request in that mode would be
// grantable; ModeAny: every change), and its enqueued field when it began.
//
//	        claim (CAS, no latch)        watch (latch)
//	FREE ───────────────────────▶ CLAIMED ───────────────▶ WATCHING
//	 ▲                               │ grantable already:       │
//	 │  owner (CAS)                  │ nothing is linked        │ unwatch by its owner, or
//	 └───────────────────────────────┘                          │ its reaper (latch)
//	 ▲                                                          │
//	 └──────────────────────────────────────────────────────────┘
//
// Every latched change of a watched entry's holders or queue (a grant at
// once, an enqueue, a steal, a release, an abort, a reap, a repair: they all
// end in AcquireClaimed, removeSlot or repair) bumps the entry's gen word and
// adds every watcher to the operation's Wakes, which rings them after the
// latch like a grant. The watcher's Manager compares gen with the value it
// last saw and re-reads the name under the latch only when it moved; a ring
// may be spurious, a change is never missed: the watch is linked under the
// latch, so every change after it rings, and the watcher reads the state and
// gen under the same latch.
//
// While an entry has a watcher it stays latched (its fast word is 0): a
// watch takes the entry from the fast path when it is linked (own, which
// moves a fast holder into the entry's reserved slot), and neither arm nor
// latchIdle hands a watched entry to the fast path, frees it, renames it or
// reclaims it. So every change of a watched name goes through the latch and
// rings; when nobody watches, the fast path is untouched (it only ever finds
// watched entries latched). The slot words are the truth: repair rebuilds
// the watch lists from them, like the queues.

// NameInfo is the state of one name, read under its bucket latch without
// changing anything.
type NameInfo struct {
	Live     bool       // the name has an entry (held, waited for, watched, or idle)
	Held     []LockInfo // holders (a fast holder included)
	Pending  []LockInfo // waiting requests in queue (grant) order
	Watchers []LockInfo // watches (Mode: ModeExclusive, ModeShared or ModeAny), newest first
	Gen      uint32     // the entry's change counter (moves only while watched)
}

// Grantable reports whether a request in mode would be granted at once:
// nothing queued and nothing held in the way.
func (ni *NameInfo) Grantable(mode uint32) bool {
	if len(ni.Pending) > 0 {
		return false
	}
	for _, h := range ni.Held {
		if mode != ModeShared || h.Mode != ModeShared {
			return false
		}
	}
	return true
}

// Name reads name's holders, queue and watchers under its bucket latch. It
// allocates no entry, takes nothing from the fast path (a fast holder is
// reported as it is) and changes no word of the table.
func (t *Table) Name(a *Agent, name string, h uint64) (NameInfo, error) {
	var ni NameInfo
	err := Guard(func() error {
		var w Wakes
		defer t.Deliver(&w, nil)
		b := t.BucketOf(h)
		if err := t.latch(a, b, &w); err != nil {
			return err
		}
		defer t.unlatch(a, b)
		e, err := t.findEntry(b, name, h)
		if err != nil || e == noEntry {
			return err
		}
		ni.Live = true
		eo := t.entryOff(e)
		ni.Gen = atomic.LoadUint32(t.u32(eo + enGen))
		ni.Held, ni.Pending, err = t.snapEntry(e, name, nil, nil, true)
		if err != nil {
			return err
		}
		s := t.ld32(eo + enWHead)
		for steps := uint32(0); s != 0; steps++ {
			if s-1 >= uint32(t.l.MaxRequests) || steps > uint32(t.l.MaxRequests) {
				return corruptf("watch list index", s, "entry %d", e)
			}
			so := t.slotOff(s - 1)
			li := LockInfo{
				Name:  name,
				Mode:  t.ld32(so + slMode),
				Agent: wordAgent(atomic.LoadUint64(t.u64(so + slWord))),
				Slot:  s - 1,
				Since: int64(t.ld64(so + slEnqueue)),
			}
			t.agentOf(&li)
			ni.Watchers = append(ni.Watchers, li)
			s = t.ld32(so + slNext)
		}
		return nil
	})
	return ni, err
}

// grantableNow reports, under the latch and without owning entry eo,
// whether a request in mode would be granted at once.
func (t *Table) grantableNow(eo uint64, mode uint32) bool {
	if st := uint32(atomic.LoadUint64(t.u64(eo + enFast))); st != fastLatched {
		if _, held := fastHolder(st); held {
			return false
		}
		// Idle: nothing held (a bounded table's queue aside: below).
	}
	if t.ld32(eo+enQHead) != 0 {
		return t.l.bound != 0 && t.mayBarge(eo) // fairness.go
	}
	return compatible(t, eo, mode)
}

// WatchOutcome is the outcome of Watch.
type WatchOutcome int

const (
	WatchReady   WatchOutcome = iota // the condition holds now: nothing was linked, the slot is free again
	WatchLinked                      // the slot is WATCHING, linked into the name's watch list
	WatchRemoved                     // the watch is gone (its condition held and it was removed, or it was unwatched)
)

// Ready reports, under the latch and without a slot, whether a request in
// mode on name would be granted at once (a name without an entry is
// grantable). Nothing is changed.
func (t *Table) Ready(a *Agent, name string, h uint64, mode uint32) (bool, error) {
	ready := false
	err := Guard(func() error {
		var w Wakes
		defer t.Deliver(&w, nil)
		b := t.BucketOf(h)
		if err := t.latch(a, b, &w); err != nil {
			return err
		}
		defer t.unlatch(a, b)
		e, err := t.findEntry(b, name, h)
		if err != nil {
			return err
		}
		ready = e == noEntry || t.grantableNow(t.entryOff(e), mode)
		return nil
	})
	return ready, err
}

// Watch links claimed slot r as a watch of name in mode (see the comment at
// the top of this file). With mode ModeExclusive or ModeShared: if a
// request in mode would be granted at once, or the name has no entry,
// nothing is linked, the slot is freed and the outcome is WatchReady. With
// ModeAny the name gets an entry if it has none (ErrTableFull when none is
// free). The slot is freed on every outcome but WatchLinked.
func (t *Table) Watch(a *Agent, r Ref, name string, h uint64, mode uint32, now int64, w *Wakes) (WatchOutcome, error) {
	s, serial, b := r.Slot, r.Serial, t.BucketOf(h)
	if s >= uint32(t.l.MaxRequests) || mode > ModeAny {
		return WatchRemoved, ErrNotHeld
	}
	if err := t.latch(a, b, w); err != nil {
		t.freeClaimed(s, serial, a.Idx)
		return WatchRemoved, err
	}
	e, err := t.findEntry(b, name, h)
	if err == nil && e == noEntry {
		if mode != ModeAny {
			t.unlatch(a, b)
			t.freeClaimed(s, serial, a.Idx)
			return WatchReady, nil
		}
		e, err = t.allocEntry(a, b, name, h)
	}
	if err != nil {
		t.unlatch(a, b)
		t.freeClaimed(s, serial, a.Idx)
		return WatchRemoved, err
	}
	eo := t.entryOff(e)
	t.own(e)
	if mode != ModeAny && t.grantable(eo, mode) {
		t.arm(eo) // leave it as we found it: back on the fast path if empty
		t.unlatch(a, b)
		t.freeClaimed(s, serial, a.Idx)
		return WatchReady, nil
	}
	so := t.slotOff(s)
	t.st32(so+slEntry, e+1)
	t.st32(so+slMode, mode)
	t.st32(so+slFlags, 0)
	t.st64(so+slEnqueue, uint64(now))
	head := t.ld32(eo + enWHead)
	t.st32(so+slPrev, 0)
	t.st32(so+slNext, head)
	sp := t.u64(so + slWord)
	atomic.StoreUint64(sp, slotWord(serial, a.Idx, SlotWatching))
	crash("watch.marked")
	if head != 0 && head-1 < uint32(t.l.MaxRequests) {
		t.st32(t.slotOff(head-1)+slPrev, s+1)
	}
	t.st32(eo+enWHead, s+1)
	crash("watch.linked")
	t.unlatch(a, b)
	return WatchLinked, nil
}

// WatchCheck looks at watch r of agent a under the latch: if its mode is
// ModeExclusive or ModeShared and a request in that mode would be granted
// at once, or was at the end of a change since the watch was linked (the
// changer marked it fired), the watch is removed (WatchRemoved). Otherwise
// it stays linked (WatchLinked). gen is the entry's change counter, read under
// the same latch. ErrNotHeld: r is no longer a watch of a (reaped).
func (t *Table) WatchCheck(a *Agent, r Ref, w *Wakes) (out WatchOutcome, gen uint32, err error) {
	e, sw, err := t.latchWatch(a, r, w)
	if err != nil {
		return WatchRemoved, 0, err
	}
	eo := t.entryOff(e)
	gen = atomic.LoadUint32(t.u32(eo + enGen))
	so := t.slotOff(r.Slot)
	if mode := t.ld32(so + slMode); mode != ModeAny && (t.ld32(so+slFlags)&flagFired != 0 || t.grantable(eo, mode)) {
		t.removeWatch(r.Slot, sw, e, r.Bucket)
		t.unlatch(a, r.Bucket)
		return WatchRemoved, gen, nil
	}
	t.unlatch(a, r.Bucket)
	return WatchLinked, gen, nil
}

// Unwatch removes watch r of agent a (the watcher gave up): the table is
// left as if the watch had never come, but for the entry's fast word, which
// is handed back to the fast path if nobody else uses the entry.
func (t *Table) Unwatch(a *Agent, r Ref, w *Wakes) error {
	e, sw, err := t.latchWatch(a, r, w)
	if err != nil {
		return err
	}
	t.removeWatch(r.Slot, sw, e, r.Bucket)
	t.unlatch(a, r.Bucket)
	return nil
}

// WatchGen reads, without the latch, the change counter of the entry that
// watch r of agent a watches. ok is false when r is no longer a's watch.
func (t *Table) WatchGen(a *Agent, r Ref) (gen uint32, ok bool) {
	if r.Slot >= uint32(t.l.MaxRequests) {
		return 0, false
	}
	so := t.slotOff(r.Slot)
	if atomic.LoadUint64(t.u64(so+slWord)) != slotWord(r.Serial, a.Idx, SlotWatching) {
		return 0, false
	}
	e := atomic.LoadUint32(t.u32(so+slEntry)) - 1
	if e >= uint32(t.l.MaxResources) {
		return 0, false
	}
	return atomic.LoadUint32(t.u32(t.entryOff(e) + enGen)), true
}

// latchWatch takes the latch of watch r's bucket and checks that r is still
// a's watch on an entry live in it; on success the latch is held.
func (t *Table) latchWatch(a *Agent, r Ref, w *Wakes) (e uint32, sw uint64, err error) {
	if r.Slot >= uint32(t.l.MaxRequests) || r.Bucket >= t.l.buckets {
		return 0, 0, ErrNotHeld
	}
	if err := t.latch(a, r.Bucket, w); err != nil {
		return 0, 0, err
	}
	so := t.slotOff(r.Slot)
	sw = atomic.LoadUint64(t.u64(so + slWord))
	if sw != slotWord(r.Serial, a.Idx, SlotWatching) {
		t.unlatch(a, r.Bucket)
		return 0, 0, ErrNotHeld
	}
	e = t.ld32(so+slEntry) - 1
	if e >= uint32(t.l.MaxResources) || atomic.LoadUint32(t.u32(t.entryOff(e)+enState)) != r.Bucket+1 {
		t.unlatch(a, r.Bucket)
		return 0, 0, corruptf("slot entry", e+1, "slot %d watches but its entry is not live in bucket %d", r.Slot, r.Bucket)
	}
	return e, sw, nil
}

// ---- under the latch of the entry's bucket ----

// removeWatch unlinks WATCHING slot s (word sw) from entry e's watch list,
// frees it, and hands the entry back to the fast path (or keeps it as the
// bucket's idle entry) if nobody else uses it.
func (t *Table) removeWatch(s uint32, sw uint64, e, b uint32) {
	eo := t.entryOff(e)
	t.unlink(s, eo+enWHead, 0)
	crash("unwatch.unlinked")
	atomic.CompareAndSwapUint64(t.u64(t.slotOff(s)+slWord), sw, slotWord(wordSerial(sw), wordAgent(sw), SlotFree))
	t.entryEmptied(e, b)
}

// touch records a change of entry e's holders or queue: if anyone watches
// e, its gen moves and every watcher is rung (after the latch, by Deliver).
// A watch whose mode is grantable now is marked fired: the instant it
// waited for has come, even if another request takes the name before its
// owner looks (a WaitUnlocked on a busy name returns at the first free
// instant, not at the first one its goroutine happens to see). One plain
// load when nobody watches.
func (t *Table) touch(e uint32, w *Wakes) {
	eo := t.entryOff(e)
	s := t.ld32(eo + enWHead)
	if s == 0 {
		return
	}
	atomic.AddUint32(t.u32(eo+enGen), 1)
	excl, shared := t.grantable(eo, ModeExclusive), t.grantable(eo, ModeShared)
	for steps := uint32(0); s != 0 && s-1 < uint32(t.l.MaxRequests) && steps < uint32(t.l.MaxRequests); steps++ {
		so := t.slotOff(s - 1)
		if m := t.ld32(so + slMode); (m == ModeExclusive && excl) || (m == ModeShared && shared) {
			t.st32(so+slFlags, t.ld32(so+slFlags)|flagFired)
		}
		w.add(wordAgent(atomic.LoadUint64(t.u64(so+slWord))), false)
		s = t.ld32(so + slNext)
	}
}

// watched: entry eo has a watcher (it must stay latched and live).
func (t *Table) watched(eo uint64) bool { return t.ld32(eo+enWHead) != 0 }
