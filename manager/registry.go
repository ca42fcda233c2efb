package manager

import "sync/atomic"

// registry maps a request slot to the Lock registered there (a held lock
// whose loss someone watches: see Lock.watch) with the slot serial of its
// grant. The bell loop reads nothing of a Lock but its state word, and an
// entry's reserved slot serves one grant after another (fast.go), so the
// serial is kept here, with the pointer. Few Locks are ever registered,
// and a table may have a million slots, so the registry is made of chunks
// allocated on first use: the garbage collector scans the chunk pointers and
// the chunks in use, not a pointer per slot of the table (a flat slice of
// pointers, one per slot, was scanned on every collection: a large share of
// an uncontended Acquire+Release; docs/experiments.md).
// Every access is lock-free; a chunk, once allocated, stays (slotIndex).
type registry struct{ idx slotIndex[regEntry] }

// regEntry is one registration, replaced as a whole (registrations are rare:
// a Lost or a Request context's Done), so that the Lock and its serial are
// always read together.
type regEntry struct {
	l      *Lock
	serial uint32
}

func newRegistry(slots int) registry { return registry{newSlotIndex[regEntry](slots)} }

// at returns slot s's cell, allocating its chunk if alloc; nil if the chunk
// is not allocated (nothing was ever registered near s) or s is out of range.
func (r *registry) at(s uint32, alloc bool) *atomic.Pointer[regEntry] { return r.idx.cell(s, alloc) }

// load returns the registration at slot s, if any.
func (r *registry) load(s uint32) *regEntry {
	if p := r.at(s, false); p != nil {
		return p.Load()
	}
	return nil
}

// store registers l at slot s, for the grant of that serial.
func (r *registry) store(s, serial uint32, l *Lock) *regEntry {
	e := &regEntry{l, serial}
	r.at(s, true).Store(e)
	return e
}

// drop unregisters l from slot s if it is still the one registered there,
// and returns the registration it removed (for restore), if any. It does
// not retain l (Release must not make its receiver escape: see Acquire).
func (r *registry) drop(s uint32, l *Lock) *regEntry {
	if p := r.at(s, false); p != nil {
		if e := p.Load(); e != nil && e.l == l && p.CompareAndSwap(e, nil) {
			return e
		}
	}
	return nil
}

// dropEntry removes registration e from slot s if it is still there.
func (r *registry) dropEntry(s uint32, e *regEntry) {
	if p := r.at(s, false); p != nil {
		p.CompareAndSwap(e, nil)
	}
}

// restore puts back registration e, removed from slot s by drop, if nothing
// else was registered there meanwhile.
func (r *registry) restore(s uint32, e *regEntry) {
	if e != nil {
		r.at(s, true).CompareAndSwap(nil, e)
	}
}

// each calls f for every registration, with its slot.
func (r *registry) each(f func(s uint32, e *regEntry)) {
	r.idx.cells(func(s uint32, p *atomic.Pointer[regEntry]) {
		if e := p.Load(); e != nil {
			f(s, e)
		}
	})
}

// takeAll unregisters every Lock and calls f for each.
func (r *registry) takeAll(f func(l *Lock)) {
	r.idx.cells(func(_ uint32, p *atomic.Pointer[regEntry]) {
		if e := p.Swap(nil); e != nil {
			f(e.l)
		}
	})
}
