package table

import (
	"sync/atomic"
	"unsafe"
)

// Ref names one request of this process: its slot, the slot's serial at
// claim time (so a reused slot is never mistaken for ours) and the bucket of
// its name.
type Ref struct {
	Slot   uint32
	Serial uint32
	Bucket uint32
}

// Wakes collects the agents to notify after a table operation: those that
// were granted a request and those whose holds were stolen. The caller
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
	quiet    uint8 // agents[i] only needs its bell bumped: every request of it in w spins
	other    uint8 // agents[i] was noted for more than a grant or a headship (a steal, a watch, a reap), or for a sleeper sleepers could not keep
	nsleep   uint8
	sleepers [2]struct{ agent, slot uint32 } // sleeping requests granted or made the head
	all      bool
	allSteal bool
}

func (w *Wakes) add(agent uint32, steal bool) {
	if i := w.addAgent(agent, steal, false); i >= 0 {
		w.other |= 1 << i
	}
}

// addSleeper notes agent for its sleeping request at slot s, granted or
// made the head of its queue.
func (w *Wakes) addSleeper(agent, s uint32) {
	i := w.addAgent(agent, false, false)
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
// overflowed to all); quiet: only because a request of it that spins was
// granted or made the head (its bell is bumped, its doorbell not rung).
func (w *Wakes) addAgent(agent uint32, steal, quiet bool) int {
	for i := 0; i < w.n; i++ {
		if w.agents[i] == agent {
			if steal {
				w.steals |= 1 << i
			}
			if !quiet {
				w.quiet &^= 1 << i
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
	if quiet {
		w.quiet |= 1 << w.n
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
// own requests by slot: when self is in w only because requests of it were
// granted or made the head of their queue, its bell is not bumped and
// poke is called with the slot of each such request that sleeps (a
// request that spins sees its slot word change by itself). A hand-off
// between two requests of one process thus reaches the next one without
// the bell, a scan of the process's waiters or a syscall. The wake-up is
// not lost: the granter reads a request's park mark after it stored the
// grant, and the waiter is findable by poke before it sets its mark.
func (t *Table) DeliverLocal(w *Wakes, self uint32, poke func(slot uint32), ring func(agent uint32, nonce uint64)) {
	if w.Empty() {
		return
	}
	if ring == nil {
		if r := t.ringer.Load(); r != nil {
			ring = *r
		}
	}
	if w.all {
		for idx := uint32(0); idx < uint32(t.l.MaxAgents); idx++ {
			if wordState(atomic.LoadUint64(t.u64(t.agentOff(idx)+agWord))) == AgentAlive {
				t.ring(idx, w.allSteal, false, ring)
			}
		}
	} else {
		for i := 0; i < w.n; i++ {
			if w.agents[i] == self && poke != nil && w.other&(1<<i) == 0 { // a steal is always other (add)
				for k := uint8(0); k < w.nsleep; k++ {
					if w.sleepers[k].agent == self {
						poke(w.sleepers[k].slot)
					}
				}
				continue
			}
			t.ring(w.agents[i], w.steals&(1<<i) != 0, w.quiet&(1<<i) != 0, ring)
		}
	}
	*w = Wakes{}
}

func (t *Table) ring(idx uint32, steal, quiet bool, ring func(agent uint32, nonce uint64)) {
	if idx >= uint32(t.l.MaxAgents) {
		return
	}
	off := t.agentOff(idx)
	atomic.AddUint32(t.u32(off+agBell), 1)
	if steal {
		atomic.AddUint32(t.u32(off+agStealSeq), 1)
	}
	if (steal || !quiet && atomic.LoadUint32(t.u32(off+agParked)) > 0) && ring != nil {
		ring(idx, atomic.LoadUint64(t.u64(off+agNonce)))
	}
}

// SetRinger sets the ring function Deliver uses when given none (the
// Manager's doorbell), for operations that notify from inside the table.
func (t *Table) SetRinger(ring func(agent uint32, nonce uint64)) { t.ringer.Store(&ring) }

// Outcome of Acquire.
type Outcome int

const (
	Granted      Outcome = iota // the request holds the lock
	Queued                      // the request waits in the queue
	NotAvailable                // if-available and not grantable: nothing was queued
)

// Acquire requests name (hash h) in mode for agent a: by the fast path if
// it applies, else with a claimed slot under the bucket latch. With steal,
// every holder is marked STOLEN and the request is granted at once, ahead
// of the queue. With ifAvailable, the request is granted only if it is
// grantable at once; otherwise nothing is left behind.
func (t *Table) Acquire(a *Agent, name string, h uint64, mode uint32, ifAvailable, steal bool, w *Wakes) (Ref, Outcome, uint64, error) {
	if mode == ModeExclusive && !steal {
		if ref, token, out := t.AcquireFast(a, name, h, w); out == Granted {
			return ref, Granted, token, nil
		}
	}
	ref, err := t.Claim(a, h)
	if err != nil {
		return Ref{}, NotAvailable, 0, err
	}
	return t.AcquireClaimed(a, ref, name, h, mode, ifAvailable, steal, w)
}

// Claim claims a free request slot for agent a, for a request on a name of
// hash h (no latch: one CAS). The slot is then the caller's: it passes it
// to AcquireClaimed, or gives it back with FreeClaimed.
func (t *Table) Claim(a *Agent, h uint64) (Ref, error) {
	s, serial, err := t.claimSlot(a)
	if err != nil {
		return Ref{}, err
	}
	return Ref{Slot: s, Serial: serial, Bucket: t.BucketOf(h)}, nil
}

// FreeClaimed gives back a slot from Claim that was not used.
func (t *Table) FreeClaimed(a *Agent, r Ref) {
	if r.Slot < uint32(t.l.MaxRequests) {
		t.freeClaimed(r.Slot, r.Serial, a.Idx)
	}
}

// AcquireFast tries to grant agent a an exclusive hold on name by the fast
// path (fast.go), without a slot claim or the latch. Granted: the returned
// Ref holds it (entry e's reserved slot, with the counter as its serial),
// with the token. Queued: the fast path does not apply now; nothing was
// taken (use Claim and AcquireClaimed).
func (t *Table) AcquireFast(a *Agent, name string, h uint64, w *Wakes) (Ref, uint64, Outcome) {
	if faultBreakExclusion.Load() {
		return Ref{}, 0, Queued
	}
	b := t.BucketOf(h)
	for tries := 0; tries < 2; tries++ {
		ref, token, st := t.fastAcquire(a, b, name, h, w)
		switch st {
		case fastGranted:
			return ref, token, Granted
		case fastMiss:
			return Ref{}, 0, Queued
		}
		// fastUndone: took a renamed entry by mistake and gave it back.
	}
	return Ref{}, 0, Queued
}

// AcquireClaimed requests name for claimed slot r under the bucket latch
// (see Acquire). The slot is freed unless the outcome is Granted or Queued.
func (t *Table) AcquireClaimed(a *Agent, r Ref, name string, h uint64, mode uint32, ifAvailable, steal bool, w *Wakes) (Ref, Outcome, uint64, error) {
	s, serial, b := r.Slot, r.Serial, t.BucketOf(h)
	if s >= uint32(t.l.MaxRequests) {
		return Ref{}, NotAvailable, 0, ErrNotHeld
	}
	ref := Ref{Slot: s, Serial: serial, Bucket: b}
	if err := t.latch(a, b, w); err != nil {
		t.freeClaimed(s, serial, a.Idx)
		return Ref{}, NotAvailable, 0, err
	}
	e, err := t.findEntry(b, name, h)
	if err == nil && e == noEntry {
		e, err = t.allocEntry(a, b, name, h)
	}
	if err != nil {
		t.unlatch(a, b)
		t.freeClaimed(s, serial, a.Idx)
		return Ref{}, NotAvailable, 0, err
	}
	t.own(e)
	so := t.slotOff(s)
	t.st32(so+slEntry, e+1)
	t.st32(so+slMode, mode)
	var flags uint32
	if steal {
		flags = flagSteal
	}
	t.st32(so+slFlags, flags)
	eo := t.entryOff(e)
	out := Granted
	var token uint64
	switch {
	case steal:
		t.stealHolders(e, w)
		token = t.grant(s, e, mode, nowNano())
		crash("steal.granted")
	case t.grantable(eo, mode):
		token = t.grant(s, e, mode, 0) // uncontended: no clock read (grant time unrecorded)
	case ifAvailable:
		out = NotAvailable
	default:
		t.st64(so+slEnqueue, uint64(nowNano()))
		t.enqueue(s, e)
		out = Queued
	}
	if out == NotAvailable {
		t.unlatch(a, b)
		t.freeClaimed(s, serial, a.Idx)
		return Ref{}, NotAvailable, 0, nil
	}
	t.touch(e, w)
	t.unlatch(a, b)
	return ref, out, token, nil
}

// Status reads the state of request r without the latch (for waiters). ok is
// false when the slot no longer belongs to r (freed by a reaper or reused).
func (t *Table) Status(a *Agent, r Ref) (state uint8, token uint64, ok bool) {
	if r.Slot >= t.l.slots {
		return 0, 0, false
	}
	if token, ok := t.fastHeld(a, r); ok {
		return SlotHeld, token, true
	}
	so := t.slotOff(r.Slot)
	sw := atomic.LoadUint64(t.u64(so + slWord))
	if wordSerial(sw) != r.Serial || wordAgent(sw) != a.Idx || wordState(sw) == SlotFree {
		return 0, 0, false
	}
	st := wordState(sw)
	if st == SlotHeld {
		token = t.ld64(so + slToken)
	}
	return st, token, true
}

// MarkParked sets or clears the park mark of waiting request r (its
// owner's goroutine is about to sleep, or is awake again). A grant, or the
// wake-ahead of a new queue head, rings the request's agent's doorbell only
// while the mark is set (ringIfAsleep). The owner sets it before its last
// look at its slot word (sequentially consistent atomics on both sides).
func (t *Table) MarkParked(r Ref, parked bool) {
	if r.Slot >= uint32(t.l.MaxRequests) {
		return // reserved slots never wait
	}
	var v uint32
	if parked {
		v = 1
	}
	atomic.StoreUint32(t.u32(t.slotOff(r.Slot)+slPark), v)
}

// Release gives up held request r. It returns ErrStolen if the request was
// stolen (the slot is freed, nothing else is touched) and ErrNotHeld if it is
// not held by a (released already, reaped, or never granted).
func (t *Table) Release(a *Agent, r Ref, w *Wakes) error {
	if r.Slot >= t.l.slots || r.Bucket >= t.l.buckets {
		return ErrNotHeld
	}
	fast := r.Slot >= uint32(t.l.MaxRequests)
	// Granted by the fast path: one CAS gives it back, unless a latch
	// holder moved it into the held list meanwhile.
	if fast && t.fastRelease(a, r) {
		return nil
	}
	sp := t.u64(t.slotOff(r.Slot) + slWord)
	sw := atomic.LoadUint64(sp)
	switch sw {
	case slotWord(r.Serial, a.Idx, SlotStolen):
		if atomic.CompareAndSwapUint64(sp, sw, slotWord(r.Serial, a.Idx, SlotFree)) {
			return ErrStolen
		}
		return ErrNotHeld
	case slotWord(r.Serial, a.Idx, SlotHeld):
	default:
		if !fast {
			return ErrNotHeld
		}
		// Maybe being moved to the held list right now: the latch decides.
	}
	if err := t.latch(a, r.Bucket, w); err != nil {
		return err
	}
	if fast && t.fastRelease(a, r) {
		// Still a fast hold (only a latch holder moves it, and we hold the latch).
		t.unlatch(a, r.Bucket)
		return nil
	}
	sw = atomic.LoadUint64(sp)
	if sw != slotWord(r.Serial, a.Idx, SlotHeld) {
		t.unlatch(a, r.Bucket)
		if sw == slotWord(r.Serial, a.Idx, SlotStolen) && atomic.CompareAndSwapUint64(sp, sw, slotWord(r.Serial, a.Idx, SlotFree)) {
			return ErrStolen
		}
		return ErrNotHeld
	}
	e := t.ld32(t.slotOff(r.Slot)+slEntry) - 1
	if e >= uint32(t.l.MaxResources) || atomic.LoadUint32(t.u32(t.entryOff(e)+enState)) != r.Bucket+1 ||
		(fast && e != r.Slot-uint32(t.l.MaxRequests)) {
		t.unlatch(a, r.Bucket)
		return corruptf("slot entry", e+1, "slot %d is held but its entry is not live in bucket %d", r.Slot, r.Bucket)
	}
	t.removeSlot(r.Slot, sw, e, r.Bucket, w)
	t.unlatch(a, r.Bucket)
	return nil
}

// Abort withdraws waiting request r. If it was granted meanwhile, Abort
// leaves it held and returns Granted with its token; the caller owns it.
// If it was granted and then stolen, the slot is freed and ErrStolen returned.
func (t *Table) Abort(a *Agent, r Ref, w *Wakes) (Outcome, uint64, error) {
	if r.Slot >= uint32(t.l.MaxRequests) || r.Bucket >= t.l.buckets {
		return NotAvailable, 0, ErrNotHeld
	}
	sp := t.u64(t.slotOff(r.Slot) + slWord)
	if err := t.latch(a, r.Bucket, w); err != nil {
		return NotAvailable, 0, err
	}
	sw := atomic.LoadUint64(sp)
	if wordSerial(sw) != r.Serial || wordAgent(sw) != a.Idx {
		t.unlatch(a, r.Bucket)
		return NotAvailable, 0, ErrNotHeld
	}
	switch wordState(sw) {
	case SlotHeld:
		token := t.ld64(t.slotOff(r.Slot) + slToken)
		t.unlatch(a, r.Bucket)
		return Granted, token, nil
	case SlotStolen:
		atomic.CompareAndSwapUint64(sp, sw, slotWord(r.Serial, a.Idx, SlotFree))
		t.unlatch(a, r.Bucket)
		return NotAvailable, 0, ErrStolen
	case SlotWaiting:
	default:
		t.unlatch(a, r.Bucket)
		return NotAvailable, 0, ErrNotHeld
	}
	e := t.ld32(t.slotOff(r.Slot)+slEntry) - 1
	if e >= uint32(t.l.MaxResources) || atomic.LoadUint32(t.u32(t.entryOff(e)+enState)) != r.Bucket+1 {
		t.unlatch(a, r.Bucket)
		return NotAvailable, 0, corruptf("slot entry", e+1, "slot %d waits but its entry is not live in bucket %d", r.Slot, r.Bucket)
	}
	t.removeSlot(r.Slot, sw, e, r.Bucket, w)
	t.unlatch(a, r.Bucket)
	return NotAvailable, 0, nil
}

// FreeStolen frees request r after its owner learnt that it was stolen.
func (t *Table) FreeStolen(a *Agent, r Ref) bool {
	if r.Slot >= t.l.slots {
		return false
	}
	sp := t.u64(t.slotOff(r.Slot) + slWord)
	return atomic.CompareAndSwapUint64(sp, slotWord(r.Serial, a.Idx, SlotStolen), slotWord(r.Serial, a.Idx, SlotFree))
}

// ---- internals; every function below runs under bucket b's latch unless it says otherwise ----

const noEntry = ^uint32(0)

// claimSlot finds a free slot and claims it for a (no latch: one CAS).
func (t *Table) claimSlot(a *Agent) (uint32, uint32, error) {
	n := uint32(t.l.MaxRequests)
	start := a.slotHint.Load()
	for i := uint32(0); i < n; i++ {
		s := start + i
		if s >= n {
			s -= n
			if s >= n {
				s %= n
			}
		}
		sp := t.u64(t.slotOff(s) + slWord)
		sw := atomic.LoadUint64(sp)
		if wordState(sw) != SlotFree {
			continue
		}
		// Mark the slot's range in our record before claiming, so a reaper
		// of ours finds every slot we may own (no atomic once it is marked).
		if bit := uint64(1) << slotRange(s, t.l.slots); atomic.LoadUint64(a.slotMask)&bit == 0 {
			atomic.OrUint64(a.slotMask, bit)
		}
		serial := wordSerial(sw) + 1
		if atomic.CompareAndSwapUint64(sp, sw, slotWord(serial, a.Idx, SlotClaimed)) {
			if i > 0 {
				a.slotHint.Store(s) // the slot we free next is where we look next
			}
			crash("slot.claimed")
			return s, serial, nil
		}
	}
	return 0, 0, fullf("request slots (MaxRequests)", int(n))
}

// freeClaimed returns a claimed slot (no latch).
func (t *Table) freeClaimed(s, serial, agent uint32) {
	atomic.CompareAndSwapUint64(t.u64(t.slotOff(s)+slWord), slotWord(serial, agent, SlotClaimed), slotWord(serial, agent, SlotFree))
}

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

// faultBreakExclusion, when set, makes every request grantable at once: a
// deliberately broken lock for testing that the stress checker notices.
var faultBreakExclusion atomic.Bool

// SetFaultBreakExclusion breaks (true) or restores mutual exclusion in this
// process. For tests of the independent checkers only.
func SetFaultBreakExclusion(on bool) { faultBreakExclusion.Store(on) }

// grantable: the queue is empty and mode is compatible with the holders.
func (t *Table) grantable(eo uint64, mode uint32) bool {
	if faultBreakExclusion.Load() {
		return true
	}
	if t.ld32(eo+enQHead) != 0 {
		return false
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
	atomic.StoreUint32(t.u32(so+slPark), 0) // its goroutine is awake: it spins or checks before it sleeps
	sp := t.u64(so + slWord)
	sw := atomic.LoadUint64(sp)
	atomic.StoreUint64(sp, slotWord(wordSerial(sw), wordAgent(sw), SlotWaiting))
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
func (t *Table) removeSlot(s uint32, sw uint64, e, b uint32, w *Wakes) {
	eo := t.entryOff(e)
	switch wordState(sw) {
	case SlotHeld:
		t.unlink(s, eo+enHHead, 0)
		if n := t.ld32(eo + enNHeld); n > 0 {
			t.st32(eo+enNHeld, n-1)
		}
		crash("release.unlinked")
	case SlotWaiting:
		t.unlink(s, eo+enQHead, eo+enQTail)
		if n := t.ld32(eo + enNWait); n > 0 {
			t.st32(eo+enNWait, n-1)
		}
		crash("abort.unlinked")
	}
	atomic.CompareAndSwapUint64(t.u64(t.slotOff(s)+slWord), sw, slotWord(wordSerial(sw), wordAgent(sw), SlotFree))
	crash("release.freed")
	t.processQueue(e, w)
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
// nothing to deliver: 64 goroutines of one process on one name, with 2 Ps,
// BenchmarkGoroutines 1.22-1.28x flock against 0.63-1.19x
// (docs/experiments.md).
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
	t.ringIfAsleep(head-1, w)
}

// ringIfAsleep notes in w the agent of request slot s, just granted or just
// made the head of its queue: its bell is bumped, and its doorbell rung
// only if the request's goroutine sleeps (its park mark). One that spins
// sees its slot word change by itself: ringing it would cost a datagram and
// wake a thread of its process for nothing. (Skipping the bell bump too
// measured 20-30% fewer ops/s with 8 processes, one goroutine each, empty
// sections: docs/experiments.md.) For a grant no wake-up is lost: markHeld's atomic store of the slot word comes
// before this load of the mark, and the waiter stores its mark before it
// looks at its slot word, so one of the two sees the other. The wake-ahead
// is a hint: a missed one only means the request is woken by its grant.
func (t *Table) ringIfAsleep(s uint32, w *Wakes) {
	so := t.slotOff(s)
	agent := wordAgent(atomic.LoadUint64(t.u64(so + slWord)))
	if atomic.LoadUint32(t.u32(so+slPark)) == 0 {
		w.addAgent(agent, false, true)
	} else {
		w.addSleeper(agent, s)
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
		t.ringIfAsleep(s, w) // after markHeld's store: no lost wake-up (docs/design.md §4)
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

// SlotState reads slot s without the latch: its state and serial, and
// whether it belongs to agent a.
func (t *Table) SlotState(a *Agent, s uint32) (state uint8, serial uint32, mine bool) {
	if s >= t.l.slots {
		return 0, 0, false
	}
	sw := atomic.LoadUint64(t.u64(t.slotOff(s) + slWord))
	return wordState(sw), wordSerial(sw), wordAgent(sw) == a.Idx && wordState(sw) != SlotFree
}

// QueueSeq returns the place of request r in its name's queue: a sequence
// number taken when it was enqueued (wrapping; only differences between
// requests waiting on the same name are meaningful). Zero for a request
// granted without waiting.
func (t *Table) QueueSeq(r Ref) uint32 {
	if r.Slot >= uint32(t.l.MaxRequests) {
		return 0
	}
	return atomic.LoadUint32(t.u32(t.slotOff(r.Slot) + slSeq))
}

// IsHead reports, without the latch, whether waiting request r of agent a
// is first in its queue: the next to be granted. A hint for the waiter
// (whether to spin), read atomically but not under the latch.
func (t *Table) IsHead(a *Agent, r Ref) bool {
	if r.Slot >= uint32(t.l.MaxRequests) {
		return false
	}
	so := t.slotOff(r.Slot)
	if atomic.LoadUint64(t.u64(so+slWord)) != slotWord(r.Serial, a.Idx, SlotWaiting) {
		return false
	}
	e := atomic.LoadUint32(t.u32(so+slEntry)) - 1
	if e >= uint32(t.l.MaxResources) {
		return false
	}
	return atomic.LoadUint32(t.u32(t.entryOff(e)+enQHead)) == r.Slot+1
}

// Progress returns, without the latch, the token counter of the entry that
// waiting request r is queued on: it moves with every grant on the name. A
// hint for spinning waiters (is the queue moving?).
func (t *Table) Progress(r Ref) uint64 {
	if r.Slot >= uint32(t.l.MaxRequests) {
		return 0
	}
	e := atomic.LoadUint32(t.u32(t.slotOff(r.Slot)+slEntry)) - 1
	if e >= uint32(t.l.MaxResources) {
		return 0
	}
	return atomic.LoadUint64(t.u64(t.entryOff(e) + enToken))
}
