//go:build unix

package bench

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/shmlocks/shmlocks/manager"
)

// Uncontended cost, one process: our Acquire+Release and Request against the
// baselines measured in the same run (see docs/benchmarks.md).

// benchKeptLock makes the handles of AcquireReleaseKept escape.
var benchKeptLock *manager.Lock

func BenchmarkUncontended(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench.tbl")
	m, err := manager.Open(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	// Keep the name's entry live (another shared holder) so the name "exists".
	keep, err := m.Acquire(ctx, "bench", manager.RequestOptions{Mode: manager.Shared})
	if err != nil {
		b.Fatal(err)
	}
	keep.Release()
	// A path-like name, as users name their locks, to show what the name's
	// length costs (hashing and comparing it).
	const longName = "orders/2026/11/21/customer-000123"
	keep, err = m.Acquire(ctx, longName, manager.RequestOptions{Mode: manager.Shared})
	if err != nil {
		b.Fatal(err)
	}
	keep.Release()

	b.Run("AcquireRelease", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			l, err := m.Acquire(ctx, "bench", manager.RequestOptions{})
			if err != nil {
				b.Fatal(err)
			}
			l.Release()
		}
	})
	b.Run("AcquireReleaseKept", func(b *testing.B) {
		// The caller keeps each handle (here in a package variable), so the
		// compiler cannot put the Lock on the caller's stack: one 64-byte
		// heap object per grant, for the collector.
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			l, err := m.Acquire(ctx, "bench", manager.RequestOptions{})
			if err != nil {
				b.Fatal(err)
			}
			benchKeptLock = l
			l.Release()
		}
	})
	b.Run("Request", func(b *testing.B) {
		b.ReportAllocs()
		fn := func(context.Context, *manager.Lock) error { return nil }
		for i := 0; i < b.N; i++ {
			if err := m.Request(ctx, "bench", manager.RequestOptions{}, fn); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("RequestLongName", func(b *testing.B) {
		b.ReportAllocs()
		fn := func(context.Context, *manager.Lock) error { return nil }
		for i := 0; i < b.N; i++ {
			if err := m.Request(ctx, longName, manager.RequestOptions{}, fn); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("FlockPair", func(b *testing.B) {
		f, err := os.Create(filepath.Join(b.TempDir(), "flock"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		fd := int(f.Fd())
		for i := 0; i < b.N; i++ {
			syscall.Flock(fd, syscall.LOCK_EX)
			syscall.Flock(fd, syscall.LOCK_UN)
		}
	})
	b.Run("OpenFlockClose", func(b *testing.B) {
		p := filepath.Join(b.TempDir(), "flock")
		for i := 0; i < b.N; i++ {
			f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
			if err != nil {
				b.Fatal(err)
			}
			syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
			syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
			f.Close()
		}
	})
	b.Run("CASFloor", func(b *testing.B) {
		word := (*uint32)(tableOf(b, path).SpareWord())
		for i := 0; i < b.N; i++ {
			for !atomic.CompareAndSwapUint32(word, 0, 1) {
			}
			atomic.StoreUint32(word, 0)
		}
	})
	b.Run("SyncMutex", func(b *testing.B) {
		var mu sync.Mutex
		for i := 0; i < b.N; i++ {
			mu.Lock()
			mu.Unlock()
		}
	})
}
