package manager

import "sync/atomic"

// slotIndex maps a request slot to a *T without a lock: the parked waiters
// of this Manager by slot, so that a release that grants to (or makes the
// head) a sleeping request of its own Manager pokes it directly
// (table.DeliverLocal) instead of bumping the bell and scanning the
// waiters under the Manager's mutex; and, under registry, the watched
// Locks. It is made of chunks allocated on first use, so that the
// collector scans only the chunks near slots ever used, not a pointer per
// slot of the table.
type slotIndex[T any] struct {
	n      uint32
	chunks []atomic.Pointer[[slotChunk]atomic.Pointer[T]]
}

const slotChunk = 256 // slots per chunk: 2 KiB of pointers

func newSlotIndex[T any](slots int) slotIndex[T] {
	return slotIndex[T]{n: uint32(slots), chunks: make([]atomic.Pointer[[slotChunk]atomic.Pointer[T]], (slots+slotChunk-1)/slotChunk)}
}

// cell returns slot s's cell, allocating its chunk if alloc; nil if s is out
// of range or its chunk was never allocated.
func (x *slotIndex[T]) cell(s uint32, alloc bool) *atomic.Pointer[T] {
	if s >= x.n {
		return nil
	}
	i := s / slotChunk
	c := x.chunks[i].Load()
	if c == nil {
		if !alloc {
			return nil
		}
		x.chunks[i].CompareAndSwap(nil, new([slotChunk]atomic.Pointer[T]))
		c = x.chunks[i].Load()
	}
	return &c[s%slotChunk]
}

// cells calls f with every allocated cell and its slot.
func (x *slotIndex[T]) cells(f func(s uint32, p *atomic.Pointer[T])) {
	for i := range x.chunks {
		c := x.chunks[i].Load()
		if c == nil {
			continue
		}
		for j := range c {
			f(uint32(i*slotChunk+j), &c[j])
		}
	}
}

// load returns what is at slot s, or nil.
func (x *slotIndex[T]) load(s uint32) *T {
	if p := x.cell(s, false); p != nil {
		return p.Load()
	}
	return nil
}

// store puts v at slot s (s in range) unless it is there already: a load
// instead of a locked instruction when a waiter parks again at the slot it
// last parked at. Only a dropped waiter clears its cell (removeWaiter says
// why).
func (x *slotIndex[T]) store(s uint32, v *T) {
	if p := x.cell(s, true); p != nil && p.Load() != v {
		p.Store(v)
	}
}

// clear empties slot s if it still holds v.
func (x *slotIndex[T]) clear(s uint32, v *T) {
	if p := x.cell(s, false); p != nil {
		p.CompareAndSwap(v, nil)
	}
}
