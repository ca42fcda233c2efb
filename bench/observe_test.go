package bench

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

// BenchmarkWaitUnlockedWake: the time from a Release by one agent to the
// return of another agent's WaitUnlocked parked on the name (the watch
// rung through the doorbell, its gen compared, the condition re-checked
// under the latch). Two Managers of this process: the ring crosses a
// doorbell socket as between processes. Reports the median and p90.
func BenchmarkWaitUnlockedWake(b *testing.B) {
	path := tablePath(b)
	m1 := openM(b, path, smallTable)
	m2 := openM(b, path, smallTable)
	tb, parked := tableOf(b, path), parkedOf(b, path, m2)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l, err := m1.Acquire(ctx, "x", manager.RequestOptions{})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan time.Time, 1)
		go func() {
			if err := m2.WaitUnlocked(ctx, "x", manager.Exclusive); err != nil {
				b.Error(err)
			}
			done <- time.Now()
		}()
		for parked() == 0 || tb.Usage().Watching == 0 { // registered (parked) and linked
			time.Sleep(10 * time.Microsecond)
		}
		time.Sleep(200 * time.Microsecond) // past its first look: parked on its channel
		t0 := time.Now()
		if err := l.Release(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, (<-done).Sub(t0))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns/wake")
	b.ReportMetric(float64(lat[len(lat)*9/10].Nanoseconds()), "p90-ns/wake")
}
