package manager

import "sync/atomic"

// registry maps a request slot to the Lock registered there (a held lock
// whose loss someone watches: see Lock.watch). Few Locks are ever registered,
// and a table may have a million slots, so the registry is made of chunks
// allocated on first use: the garbage collector scans the chunk pointers and
// the chunks in use, not a pointer per slot of the table. (A flat slice of
// 32,768 pointers, the default MaxRequests, was scanned on every collection:
// 17% of the profile of an uncontended Acquire+Release, which allocates;
// 134 -> 118 ns side by side without it.)
// Every access is lock-free; a chunk, once allocated, stays.
type registry struct {
	n      uint32 // slots
	chunks []atomic.Pointer[regChunk]
}

const regChunkSize = 256 // slots per chunk: 2 KiB of pointers

type regChunk [regChunkSize]atomic.Pointer[Lock]

func newRegistry(slots int) registry {
	return registry{n: uint32(slots), chunks: make([]atomic.Pointer[regChunk], (slots+regChunkSize-1)/regChunkSize)}
}

// at returns slot s's cell, allocating its chunk if alloc; nil if the chunk
// is not allocated (nothing was ever registered near s) or s is out of range.
func (r *registry) at(s uint32, alloc bool) *atomic.Pointer[Lock] {
	if s >= r.n {
		return nil
	}
	i := s / regChunkSize
	c := r.chunks[i].Load()
	if c == nil {
		if !alloc {
			return nil
		}
		r.chunks[i].CompareAndSwap(nil, new(regChunk))
		c = r.chunks[i].Load()
	}
	return &c[s%regChunkSize]
}

// load returns the Lock registered at slot s, if any.
func (r *registry) load(s uint32) *Lock {
	if p := r.at(s, false); p != nil {
		return p.Load()
	}
	return nil
}

// store registers l at slot s.
func (r *registry) store(s uint32, l *Lock) { r.at(s, true).Store(l) }

// drop unregisters l from slot s if it is still the one registered there.
func (r *registry) drop(s uint32, l *Lock) {
	if p := r.at(s, false); p != nil {
		p.CompareAndSwap(l, nil)
	}
}

// restore registers l at slot s again if nothing else was registered meanwhile.
func (r *registry) restore(s uint32, l *Lock) { r.at(s, true).CompareAndSwap(nil, l) }

// each calls f for every registered Lock, with its slot.
func (r *registry) each(f func(s uint32, l *Lock)) {
	for i := range r.chunks {
		c := r.chunks[i].Load()
		if c == nil {
			continue
		}
		for j := range c {
			if l := c[j].Load(); l != nil {
				f(uint32(i*regChunkSize+j), l)
			}
		}
	}
}

// takeAll unregisters every Lock and calls f for each.
func (r *registry) takeAll(f func(l *Lock)) {
	for i := range r.chunks {
		c := r.chunks[i].Load()
		if c == nil {
			continue
		}
		for j := range c {
			if l := c[j].Swap(nil); l != nil {
				f(l)
			}
		}
	}
}
