package manager

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The registry of watched Locks: chunks appear only where something was
// registered, every registered Lock is visited once, and out-of-range slots
// are ignored.
func TestRegistry(t *testing.T) {
	const slots = 3*slotChunk + 10 // the last chunk is partial
	r := newRegistry(slots)
	require.Len(t, r.idx.chunks, 4)
	a, b, c := new(Lock), new(Lock), new(Lock)

	require.Nil(t, r.load(5))
	r.drop(5, a) // nothing registered: nothing happens, nothing allocated
	for i := range r.idx.chunks {
		require.Nil(t, r.idx.chunks[i].Load(), "a lookup allocates no chunk")
	}

	r.store(0, 1, a)
	r.store(slotChunk, 2, b) // first slot of the second chunk
	r.store(slots-1, 3, c)   // last slot of the partial chunk
	require.Nil(t, r.at(slots, true), "a slot past the table is no cell")
	require.Nil(t, r.idx.chunks[2].Load(), "no chunk where nothing was registered")
	require.Same(t, a, r.load(0).l)
	require.Same(t, b, r.load(slotChunk).l)
	require.Same(t, c, r.load(slots-1).l)

	require.Nil(t, r.drop(0, b), "not the one registered there")
	require.Same(t, a, r.load(0).l)
	r.restore(0, &regEntry{b, 7}) // occupied: left alone
	require.Same(t, a, r.load(0).l)
	r.restore(0, nil) // nothing was dropped: nothing to put back
	require.Same(t, a, r.load(0).l)

	seen := map[uint32]*Lock{}
	serials := map[uint32]uint32{}
	r.each(func(s uint32, e *regEntry) { seen[s], serials[s] = e.l, e.serial })
	require.Equal(t, map[uint32]*Lock{0: a, slotChunk: b, slots - 1: c}, seen)
	require.Equal(t, map[uint32]uint32{0: 1, slotChunk: 2, slots - 1: 3}, serials, "each reports the serial stored with the Lock")

	e := r.drop(slotChunk, b)
	require.Same(t, b, e.l, "drop returns what it removed")
	require.Nil(t, r.load(slotChunk))
	r.restore(slotChunk, e) // a failed release puts it back
	require.Same(t, e, r.load(slotChunk))
	require.Nil(t, r.drop(slotChunk, c))
	require.Same(t, r.drop(slotChunk, b), e)
	r.store(slotChunk, 2, c)
	r.restore(slotChunk, e) // registered anew meanwhile: left alone
	require.Same(t, c, r.load(slotChunk).l)

	var taken []*Lock
	r.takeAll(func(l *Lock) { taken = append(taken, l) })
	require.ElementsMatch(t, []*Lock{a, c, c}, taken)
	r.each(func(s uint32, e *regEntry) { t.Fatalf("slot %d still registered after takeAll", s) })
}

// A registration is replaced as a whole: whoever holds an earlier one (the
// bell loop, from an earlier look) can tell that the Lock was registered
// anew at the same slot, for another grant with another serial, and
// dropEntry never removes the newer one.
func TestRegistryEntryIdentity(t *testing.T) {
	r := newRegistry(slotChunk)
	l := new(Lock)
	old := r.store(3, 10, l)
	cur := r.store(3, 11, l) // the same Lock, its next grant at the same (reserved) slot
	require.NotSame(t, old, cur)
	require.Same(t, cur, r.load(3))
	require.Equal(t, uint32(11), r.load(3).serial)
	r.dropEntry(3, old) // a stale look: nothing happens
	require.Same(t, cur, r.load(3))
	r.dropEntry(3, cur)
	require.Nil(t, r.load(3))
}

// Goroutines registering in the same new chunk at once all land in it (the
// chunk is installed once, by CAS).
func TestRegistryConcurrentChunk(t *testing.T) {
	r := newRegistry(slotChunk)
	locks := make([]*Lock, slotChunk)
	var wg sync.WaitGroup
	for i := range locks {
		locks[i] = new(Lock)
		wg.Add(1)
		go func() { defer wg.Done(); r.store(uint32(i), uint32(i), locks[i]) }()
	}
	wg.Wait()
	n := 0
	r.each(func(s uint32, e *regEntry) { require.Same(t, locks[s], e.l); require.Equal(t, s, e.serial); n++ })
	require.Equal(t, slotChunk, n)
}
