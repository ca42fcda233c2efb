package manager

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/table"
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
	m := openM(b, filepath.Join(b.TempDir(), "local.tbl"), nil)
	const name = "n"
	h := table.Hash(name)
	var w table.Wakes
	prev, out, _, err := m.t.Acquire(m.a, name, h, uint32(Exclusive), false, false, &w)
	require.NoError(b, err)
	require.Equal(b, table.Granted, out)
	b.ResetTimer()
	for range b.N {
		if _, _, out := m.t.AcquireFast(m.a, name, h, &w); out == table.Granted {
			b.Fatal("the fast path granted a held name")
		}
		ref, err := m.t.Claim(m.a, h)
		if err != nil {
			b.Fatal(err)
		}
		ref, out, _, err := m.t.AcquireClaimed(m.a, ref, name, h, uint32(Exclusive), true, false, &w)
		if out != table.NotAvailable || err != nil {
			b.Fatal(out, err)
		}
		ref, out, _, err = m.t.Acquire(m.a, name, h, uint32(Exclusive), false, false, &w)
		if out != table.Queued || err != nil {
			b.Fatal(out, err)
		}
		if err := m.t.Release(m.a, prev, &w); err != nil {
			b.Fatal(err)
		}
		w = table.Wakes{}
		prev = ref
	}
	b.StopTimer()
	st, _, ok := m.t.Status(m.a, prev)
	require.True(b, ok)
	require.EqualValues(b, table.SlotHeld, st)
	require.NoError(b, m.t.Release(m.a, prev, &w))
	require.NoError(b, m.Check())
}

// BenchmarkGoroutinesInProcess: G goroutines of one process loop Request
// with an empty callback on one name for the benchmark's iterations (b.N
// grants in all): BenchmarkGoroutines' 1 x G row without the child
// process, for profiles (-cpuprofile) and for GOMAXPROCS comparisons.
func BenchmarkGoroutinesInProcess(b *testing.B) {
	for _, g := range []int{4, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
			m := openM(b, filepath.Join(b.TempDir(), "inproc.tbl"), nil)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			fn := func(context.Context, *Lock) error { return nil }
			var left atomic.Int64
			left.Store(int64(b.N))
			var wg sync.WaitGroup
			b.ResetTimer()
			for range g {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for left.Add(-1) >= 0 {
						if err := m.Request(ctx, "n", RequestOptions{}, fn); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}
