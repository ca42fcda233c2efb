package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

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
			fn := func(context.Context, *manager.Lock) error { return nil }
			var left atomic.Int64
			left.Store(int64(b.N))
			var wg sync.WaitGroup
			b.ResetTimer()
			for range g {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for left.Add(-1) >= 0 {
						if err := m.Request(ctx, "n", manager.RequestOptions{}, fn); err != nil {
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
