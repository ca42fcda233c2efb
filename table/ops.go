package table

import (
	"sync/atomic"

	"github.com/shmlocks/shmlocks/internal/testhooks"
)

// Ref names one request of this process: its slot, the slot's serial at
// claim time (so a reused slot is never mistaken for ours) and the bucket of
// its name.
type Ref struct {
	Slot   uint32
	Serial uint32
	Bucket uint32
}

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
	if testhooks.BreakExclusion.Load() {
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
	if t.l.bound != 0 && !steal {
		t.serveStarved(e, w) // fairness.go
	}
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
		token = t.grant(s, e, mode, coarseNano()) // uncontended: no clock read (stamp.go)
		if t.l.bound != 0 && t.ld32(eo+enQHead) != 0 {
			crash("barge.granted") // ahead of the queue (fairness.go)
		}
	case ifAvailable:
		out = NotAvailable
	default:
		t.st64(so+slEnqueue, uint64(nowNano())) // the caller's park reads it back (EnqueuedMono)
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
func (t *Table) Release(a *Agent, r Ref, w *Wakes) error { return t.release(a, r, w, false) }

// ReleaseTurn is Release on a bounded table that hands the name to a's own
// oldest request queued on it, if one fits the holders, ahead of older
// requests of other agents (a turn inside the releasing process: the
// goroutines of a process take turns at a name that its running requests
// would otherwise keep), unless the head of the queue has waited the bound
// (then the head is granted, as Release does). A fast hold is moved into
// the held list first (own), so that its release comes to passOn. On a
// FIFO table it is Release.
func (t *Table) ReleaseTurn(a *Agent, r Ref, w *Wakes) error {
	return t.release(a, r, w, t.l.bound != 0)
}

func (t *Table) release(a *Agent, r Ref, w *Wakes, turn bool) error {
	if r.Slot >= t.l.slots || r.Bucket >= t.l.buckets {
		return ErrNotHeld
	}
	fast := r.Slot >= uint32(t.l.MaxRequests)
	// Granted by the fast path: one CAS gives it back, unless a latch
	// holder moved it into the held list meanwhile.
	if fast && !turn && t.fastRelease(a, r) {
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
	if fast && turn {
		// A turn passes the name on under the latch: make the fast hold a
		// held-list hold first (as TakeTurn does), if its entry is live in
		// this bucket (else the checks below report it).
		if e := r.Slot - uint32(t.l.MaxRequests); e < uint32(t.l.MaxResources) &&
			atomic.LoadUint32(t.u32(t.entryOff(e)+enState)) == r.Bucket+1 {
			t.own(e)
		}
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
	t.removeSlot(r.Slot, sw, e, r.Bucket, w, turn)
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
	t.removeSlot(r.Slot, sw, e, r.Bucket, w, false)
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
	_, _, ok := t.headOf(a, r)
	return ok
}

// headOf is IsHead with the offsets of r's slot and entry when it is true.
func (t *Table) headOf(a *Agent, r Ref) (so, eo uint64, ok bool) {
	if r.Slot >= uint32(t.l.MaxRequests) {
		return 0, 0, false
	}
	so = t.slotOff(r.Slot)
	if atomic.LoadUint64(t.u64(so+slWord)) != slotWord(r.Serial, a.Idx, SlotWaiting) {
		return 0, 0, false
	}
	e := atomic.LoadUint32(t.u32(so+slEntry)) - 1
	if e >= uint32(t.l.MaxResources) {
		return 0, 0, false
	}
	eo = t.entryOff(e)
	return so, eo, atomic.LoadUint32(t.u32(eo+enQHead)) == r.Slot+1
}

// Progress returns, without the latch, a reading of the entry that waiting
// request r is queued on that moves with every grant on the name: its
// token counter, which every grant under the latch moves, and with barges
// (a bounded table's fast path, which counts its grants in the fast word)
// also the fast word's counter. A hint for spinning waiters (is the queue
// moving? is the name in use?); the sum of two counters may repeat across
// grants, which only ends a spin sooner.
func (t *Table) Progress(r Ref, barges bool) uint64 {
	if r.Slot >= uint32(t.l.MaxRequests) {
		return 0
	}
	e := atomic.LoadUint32(t.u32(t.slotOff(r.Slot)+slEntry)) - 1
	if e >= uint32(t.l.MaxResources) {
		return 0
	}
	eo := t.entryOff(e)
	p := atomic.LoadUint64(t.u64(eo + enToken))
	if barges {
		p += atomic.LoadUint64(t.u64(eo+enFast)) >> 32
	}
	return p
}
