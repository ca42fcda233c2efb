package etcd

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// The benchmarks compare this backend with etcd's own recipe,
// concurrency.Mutex, on the same embedded single-member cluster in the same
// run: the uncontended Acquire+Release (Lock+Unlock) latency, and the
// contended throughput of workers that each have a client and a session
// of their own and take one name in turn (ns/op: per grant).
//
//	go test -run '^$' -bench . -benchtime 2s ./   (in etcd/)
func BenchmarkEtcd(b *testing.B) {
	c := startCluster(b, 1)
	ctx := context.Background()
	warmUp(b, c)
	b.Run("Uncontended/shmlocks", func(b *testing.B) {
		m, err := Open(ctx, c.client(b), "/bench-shm", nil)
		if err != nil {
			b.Fatal(err)
		}
		defer m.Close()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			l, err := m.Acquire(ctx, "u", manager.RequestOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Uncontended/etcdMutex", func(b *testing.B) {
		s, err := concurrency.NewSession(c.client(b), concurrency.WithTTL(5))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		mu := concurrency.NewMutex(s, "/bench-mu/u")
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := mu.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := mu.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, workers := range []int{4} {
		b.Run(fmt.Sprintf("Contended%d/shmlocks", workers), func(b *testing.B) {
			ms := make([]*manager.Manager, workers)
			for i := range ms {
				m, err := Open(ctx, c.client(b), "/bench-shm", nil)
				if err != nil {
					b.Fatal(err)
				}
				defer m.Close()
				ms[i] = m
			}
			contend(b, workers, func(i int) (func() error, func() error) {
				var l *manager.Lock
				return func() (err error) {
						l, err = ms[i].Acquire(ctx, "c", manager.RequestOptions{})
						return err
					}, func() error {
						return l.Release()
					}
			})
		})
		b.Run(fmt.Sprintf("Contended%d/etcdMutex", workers), func(b *testing.B) {
			mus := make([]*concurrency.Mutex, workers)
			for i := range mus {
				s, err := concurrency.NewSession(c.client(b), concurrency.WithTTL(5))
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				mus[i] = concurrency.NewMutex(s, "/bench-mu/c")
			}
			contend(b, workers, func(i int) (func() error, func() error) {
				return func() error { return mus[i].Lock(ctx) }, func() error { return mus[i].Unlock(ctx) }
			})
		})
	}
}

// contend runs b.N lock+unlock pairs spread over workers.
func contend(b *testing.B, workers int, mk func(i int) (lock, unlock func() error)) {
	var next sync.WaitGroup
	left := make(chan struct{}, b.N)
	for i := 0; i < b.N; i++ {
		left <- struct{}{}
	}
	close(left)
	errs := make(chan error, workers)
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < workers; w++ {
		lock, unlock := mk(w)
		next.Add(1)
		go func() {
			defer next.Done()
			for range left {
				if err := lock(); err != nil {
					errs <- err
					return
				}
				if err := unlock(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	next.Wait()
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "grants/s")
}

// warmUp writes to the new cluster c 200 times: its first writes are
// slower, and the first sub-benchmark must not be the one that pays.
func warmUp(b *testing.B, c *cluster) {
	warm := c.client(b)
	for i := 0; i < 200; i++ {
		if _, err := warm.Put(context.Background(), "/warm", "x"); err != nil {
			b.Fatal(err)
		}
	}
}
