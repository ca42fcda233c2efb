package table

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkLocalHandoffTable: the table's share of one hand-off between
// two requests of one process, measured in one goroutine with nothing to
// schedule: the holder's next request fails the fast path, claims a slot,
// finds the name taken under the latch, queues under the latch, and the
// previous hold is released, which grants the queued request (two clock
// reads: the enqueue and grant times). What a hand-off costs above this is
// the waiting (park, poke, spin) and the scheduler (docs/experiments.md,
// issue 18).
func BenchmarkLocalHandoffTable(b *testing.B) {
	tb := newTestTable(b, Geometry{MaxResources: 64, MaxRequests: 256, MaxAgents: 32, MaxNameLen: 64})
	a, err := tb.Register(Self(), 1)
	require.NoError(b, err)
	const name = "n"
	h := Hash(name)
	var w Wakes
	prev, out, _, err := tb.Acquire(a, name, h, ModeExclusive, false, false, &w)
	require.NoError(b, err)
	require.Equal(b, Granted, out)
	b.ResetTimer()
	for range b.N {
		if _, _, out := tb.AcquireFast(a, name, h, &w); out == Granted {
			b.Fatal("the fast path granted a held name")
		}
		ref, err := tb.Claim(a, h)
		if err != nil {
			b.Fatal(err)
		}
		ref, out, _, err := tb.AcquireClaimed(a, ref, name, h, ModeExclusive, true, false, &w)
		if out != NotAvailable || err != nil {
			b.Fatal(out, err)
		}
		ref, out, _, err = tb.Acquire(a, name, h, ModeExclusive, false, false, &w)
		if out != Queued || err != nil {
			b.Fatal(out, err)
		}
		if err := tb.Release(a, prev, &w); err != nil {
			b.Fatal(err)
		}
		w = Wakes{}
		prev = ref
	}
	b.StopTimer()
	st, _, ok := tb.Status(a, prev)
	require.True(b, ok)
	require.EqualValues(b, SlotHeld, st)
	require.NoError(b, tb.Release(a, prev, &w))
	require.NoError(b, tb.Check(a))
	require.NoError(b, tb.Deregister(a, &w))
}
