package bench

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/shmlocks/shmlocks/manager"
)

// BenchmarkUncontendedStats is BenchmarkUncontended/AcquireRelease with
// OpenOptions.Stats: what counting costs a request (atomic adds and two
// clock reads). Without Stats the path is BenchmarkUncontended's.
func BenchmarkUncontendedStats(b *testing.B) {
	m, err := manager.Open(filepath.Join(b.TempDir(), "bench.tbl"), &manager.OpenOptions{Stats: true})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		l, err := m.Acquire(ctx, "bench", manager.RequestOptions{})
		if err != nil {
			b.Fatal(err)
		}
		l.Release()
	}
}
