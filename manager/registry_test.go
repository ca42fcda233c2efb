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
	const slots = 3*regChunkSize + 10 // the last chunk is partial
	r := newRegistry(slots)
	require.Len(t, r.chunks, 4)
	a, b, c := new(Lock), new(Lock), new(Lock)

	require.Nil(t, r.load(5))
	r.drop(5, a) // nothing registered: nothing happens, nothing allocated
	for i := range r.chunks {
		require.Nil(t, r.chunks[i].Load(), "a lookup allocates no chunk")
	}

	r.store(0, 1, a)
	r.store(regChunkSize, 2, b) // first slot of the second chunk
	r.store(slots-1, 3, c)      // last slot of the partial chunk
	require.Nil(t, r.at(slots, true), "a slot past the table is no cell")
	require.Nil(t, r.chunks[2].Load(), "no chunk where nothing was registered")
	require.Same(t, a, r.load(0))
	require.Same(t, b, r.load(regChunkSize))
	require.Same(t, c, r.load(slots-1))

	r.drop(0, b) // not the one registered there
	require.Same(t, a, r.load(0))
	r.restore(0, 7, b) // occupied: left alone
	require.Same(t, a, r.load(0))

	seen := map[uint32]*Lock{}
	serials := map[uint32]uint32{}
	r.each(func(s, serial uint32, l *Lock) { seen[s], serials[s] = l, serial })
	require.Equal(t, map[uint32]*Lock{0: a, regChunkSize: b, slots - 1: c}, seen)
	require.Equal(t, map[uint32]uint32{0: 1, regChunkSize: 2, slots - 1: 3}, serials, "each reports the serial stored with the Lock")

	r.drop(regChunkSize, b)
	r.restore(regChunkSize, 7, c)
	require.Same(t, c, r.load(regChunkSize))

	var taken []*Lock
	r.takeAll(func(l *Lock) { taken = append(taken, l) })
	require.ElementsMatch(t, []*Lock{a, c, c}, taken)
	r.each(func(s, serial uint32, l *Lock) { t.Fatalf("slot %d still registered after takeAll", s) })
}

// Goroutines registering in the same new chunk at once all land in it (the
// chunk is installed once, by CAS).
func TestRegistryConcurrentChunk(t *testing.T) {
	r := newRegistry(regChunkSize)
	locks := make([]*Lock, regChunkSize)
	var wg sync.WaitGroup
	for i := range locks {
		locks[i] = new(Lock)
		wg.Add(1)
		go func() { defer wg.Done(); r.store(uint32(i), uint32(i), locks[i]) }()
	}
	wg.Wait()
	n := 0
	r.each(func(s, serial uint32, l *Lock) { require.Same(t, locks[s], l); require.Equal(t, s, serial); n++ })
	require.Equal(t, regChunkSize, n)
}
