package manager

import "sync/atomic"

// slotIndex maps a request slot to a *T without a lock: the parked waiters
// of this Manager by slot, so that a release that grants to (or makes the
// head) a sleeping request of its own Manager pokes it directly
// (table.DeliverLocal) instead of bumping the bell and scanning the
// waiters under the Manager's mutex. Like registry, it is made of chunks
// allocated on first use, so that the collector scans only the chunks
// near slots ever used, not a pointer per slot of the table.
type slotIndex[T any] struct {
	n      uint32
	chunks []atomic.Pointer[[regChunkSize]atomic.Pointer[T]]
}

func newSlotIndex[T any](slots int) slotIndex[T] {
	return slotIndex[T]{n: uint32(slots), chunks: make([]atomic.Pointer[[regChunkSize]atomic.Pointer[T]], (slots+regChunkSize-1)/regChunkSize)}
}

// cell returns slot s's cell, allocating its chunk if alloc; nil if s is out
// of range or its chunk was never allocated.
func (x *slotIndex[T]) cell(s uint32, alloc bool) *atomic.Pointer[T] {
	if s >= x.n {
		return nil
	}
	i := s / regChunkSize
	c := x.chunks[i].Load()
	if c == nil {
		if !alloc {
			return nil
		}
		x.chunks[i].CompareAndSwap(nil, new([regChunkSize]atomic.Pointer[T]))
		c = x.chunks[i].Load()
	}
	return &c[s%regChunkSize]
}

// load returns what is at slot s, or nil.
func (x *slotIndex[T]) load(s uint32) *T {
	if p := x.cell(s, false); p != nil {
		return p.Load()
	}
	return nil
}

// store puts v at slot s (s in range).
func (x *slotIndex[T]) store(s uint32, v *T) {
	if p := x.cell(s, true); p != nil {
		p.Store(v)
	}
}

// clear empties slot s if it still holds v.
func (x *slotIndex[T]) clear(s uint32, v *T) {
	if p := x.cell(s, false); p != nil {
		p.CompareAndSwap(v, nil)
	}
}
