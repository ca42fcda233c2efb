package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/table"

	"github.com/shmlocks/shmlocks/manager"
)

// Scale benchmarks, one process (docs/benchmarks.md).

// scaleTable is big enough for 100,000 held names plus the benchmark's own.
var scaleTable = &manager.OpenOptions{MaxResources: 131072, MaxRequests: 131072, MaxAgents: 16, MaxNameLen: 32}

// BenchmarkScaleNames: uncontended Acquire+Release of one name while 1,
// 1,000 or 100,000 distinct names are live in the table (the others held by
// the same Manager), all on the same large geometry.
func BenchmarkScaleNames(b *testing.B) {
	ctx := context.Background()
	for _, live := range []int{1, 1000, 100_000} {
		path := filepath.Join(b.TempDir(), "scale.tbl")
		m, err := manager.Open(path, scaleTable)
		require.NoError(b, err)
		for i := 0; i < live-1; i++ {
			if _, err := m.Acquire(ctx, fmt.Sprintf("n%06d", i), manager.RequestOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("names=%d", live), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				l, err := m.Acquire(ctx, "bench", manager.RequestOptions{})
				if err != nil {
					b.Fatal(err)
				}
				l.Release()
			}
		})
		m.Close()
	}
}

// queueWaiters starts n goroutines on m waiting for names[i%len(names)] and
// waits until all of them are parked (past their spin phase: parked reads
// m's count, parkedOf). They return
// when ctx ends or they are granted (then they release at once).
func queueWaiters(b *testing.B, ctx context.Context, m *manager.Manager, parked func() uint32, names []string, n int) *sync.WaitGroup {
	b.Helper()
	var wg sync.WaitGroup
	before := parked()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(name string) {
			defer wg.Done()
			if l, err := m.Acquire(ctx, name, manager.RequestOptions{}); err == nil {
				l.Release()
			}
		}(names[i%len(names)])
	}
	deadline := time.Now().Add(eventually)
	for parked() < before+uint32(n) {
		if time.Now().After(deadline) {
			b.Fatalf("%d waiters did not park", n)
		}
		time.Sleep(20 * time.Microsecond)
	}
	return &wg
}

// BenchmarkQueuedOther: uncontended Acquire+Release (and the Request form)
// of one name while 1, 100 or 1,000 goroutines of the same Manager wait on
// other names (one each), held by a second Manager. The Acquire form
// allocates a handle per grant, so the garbage collector runs, and each of
// its cycles scans every waiting goroutine's stack: that cost grows with the
// waiters. The Request form allocates nothing, so it shows the lock's own
// cost alone.
func BenchmarkQueuedOther(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		path := filepath.Join(b.TempDir(), "other.tbl")
		m, err := manager.Open(path, nil)
		require.NoError(b, err)
		holder, err := manager.Open(path, nil)
		require.NoError(b, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("other%d", i)
			_, err := holder.Acquire(ctx, names[i], manager.RequestOptions{})
			require.NoError(b, err)
		}
		wg := queueWaiters(b, ctx, m, parkedOf(b, path, m), names, n)
		b.Run(fmt.Sprintf("waiters=%d/Acquire", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				l, err := m.Acquire(ctx, "bench", manager.RequestOptions{})
				if err != nil {
					b.Fatal(err)
				}
				l.Release()
			}
		})
		b.Run(fmt.Sprintf("waiters=%d/Request", n), func(b *testing.B) {
			b.ReportAllocs()
			fn := func(context.Context, *manager.Lock) error { return nil }
			for i := 0; i < b.N; i++ {
				if err := m.Request(ctx, "bench", manager.RequestOptions{}, fn); err != nil {
					b.Fatal(err)
				}
			}
		})
		cancel()
		wg.Wait()
		holder.Close()
		m.Close()
	}
}

// BenchmarkDrainSameName: n goroutines of one Manager queue on one name held
// by a second Manager and park; the holder releases and the queue drains,
// each waiter releasing as soon as it is granted. Reported: the drain time
// per request (ns/grant).
func BenchmarkDrainSameName(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "drain.tbl")
			m, err := manager.Open(path, nil)
			require.NoError(b, err)
			defer m.Close()
			holder, err := manager.Open(path, nil)
			require.NoError(b, err)
			defer holder.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			parked := parkedOf(b, path, m)
			var total time.Duration
			b.ResetTimer()
			// The timer keeps running through the set-up (so that the run
			// stays short: a waiter parks only after its spin phase); ns/op
			// is a whole cycle and ns/grant the drain alone.
			for i := 0; i < b.N; i++ {
				l, err := holder.Acquire(ctx, "q", manager.RequestOptions{})
				require.NoError(b, err)
				wg := queueWaiters(b, ctx, m, parked, []string{"q"}, n)
				t0 := time.Now()
				l.Release()
				wg.Wait()
				total += time.Since(t0)
			}
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N*n), "ns/grant")
		})
	}
}

// BenchmarkQuery10k: with 10,000 locks held (by another Manager), the cost
// of Query and of a read-only Snapshot (what `shmlocks dump` reads; the
// dump's rendering is measured in cmd/shmlocks, BenchmarkDump10k).
func BenchmarkQuery10k(b *testing.B) {
	const held = 10_000
	path := filepath.Join(b.TempDir(), "query.tbl")
	opts := &manager.OpenOptions{MaxResources: 16384, MaxRequests: 32768, MaxAgents: 16, MaxNameLen: 64}
	m, err := manager.Open(path, opts)
	require.NoError(b, err)
	defer m.Close()
	holder, err := manager.Open(path, opts)
	require.NoError(b, err)
	defer holder.Close()
	ctx := context.Background()
	for i := 0; i < held; i++ {
		_, err := holder.Acquire(ctx, fmt.Sprintf("held/%05d", i), manager.RequestOptions{Mode: manager.Mode(i % 2)})
		require.NoError(b, err)
	}
	b.Run("Query", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			s, err := m.Query(ctx)
			if err != nil || len(s.Held) != held {
				b.Fatalf("query: %d held, %v", len(s.Held), err)
			}
		}
	})
	ro, err := table.OpenReadOnly(path)
	require.NoError(b, err)
	defer ro.Close()
	b.Run("SnapshotReadOnly", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			h, _, err := ro.Snapshot(nil)
			if err != nil || len(h) != held {
				b.Fatalf("snapshot: %d held, %v", len(h), err)
			}
		}
	})
}
