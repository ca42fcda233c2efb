package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/coalesce"
	"github.com/shmlocks/shmlocks/coalesce/coalescetest"
	"github.com/shmlocks/shmlocks/manager"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// BenchmarkEtcdWake measures, on one embedded single-member cluster in one
// run, side by side with etcd's concurrency.Mutex:
//
//   - Leader: a Coalesce flight nobody joins (the leader's whole Do) against
//     Mutex Lock+Unlock; trips/op counts the KV calls (round trips) of the
//     leader's client (countKV), ns/op is the time.
//   - Follower: a follower on another client waits for a leader's flight;
//     wake-us is the median time from the leader's fn returning to the
//     follower's Do returning, trips/wake the follower's KV calls in that
//     time, events/wake the watch events its client received of the record.
//     Against it, a Mutex waiter: from the holder's Unlock call to the
//     waiter's Lock returning.
//   - WaitUnlocked: from the holder's Release call to a WaitUnlocked of
//     another client returning, against the Mutex waiter's wake-up.
//
// The wake-ups run twice: the holder releasing at once when its waiter is
// queued (hold=0s), and after wakeHold.
//
//	go test -run '^$' -bench EtcdWake -benchtime 200x -count 3   (in etcd/)
func BenchmarkEtcdWake(b *testing.B) {
	c := startCluster(b, 1)
	ctx := context.Background()
	warmUp(b, c)
	fn := func(context.Context) ([]byte, error) { return []byte("result"), nil }

	b.Run("Leader/coalesce", func(b *testing.B) {
		cli := c.client(b)
		ck := newCountKV(cli)
		m, err := Open(ctx, cli, "/bench-co", nil)
		if err != nil {
			b.Fatal(err)
		}
		defer m.Close()
		g := coalesce.New(m)
		ck.reset()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, _, err := g.Do(ctx, "k", fn); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(ck.trips(""))/float64(b.N), "trips/op")
	})
	b.Run("Leader/etcdMutex", func(b *testing.B) {
		cli := c.client(b)
		ck := newCountKV(cli)
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		mu := concurrency.NewMutex(s, "/bench-mu/k")
		ck.reset()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := mu.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := mu.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(ck.trips(""))/float64(b.N), "trips/op")
	})

	for _, hold := range []time.Duration{0, wakeHold} {
		benchWake(b, c, hold)
	}
}

// benchWake runs the wake-up benchmarks with a holder that holds for hold
// after its waiter is queued.
func benchWake(b *testing.B, c *cluster, hold time.Duration) {
	ctx := context.Background()
	sub := func(what string) string { return fmt.Sprintf("%s/hold=%v", what, hold) }
	b.Run(sub("Follower/coalesce"), func(b *testing.B) {
		cliA, cliB := c.client(b), c.client(b)
		cb := newCountKV(cliB)
		ma, err := Open(ctx, cliA, "/bench-co", nil)
		if err != nil {
			b.Fatal(err)
		}
		defer ma.Close()
		mb, err := Open(ctx, cliB, "/bench-co", nil)
		if err != nil {
			b.Fatal(err)
		}
		defer mb.Close()
		var wakes []time.Duration
		var trips, events int
		for i := 0; i < b.N; i++ {
			key := fmt.Sprintf("f%d", i%8)
			started, gate := make(chan struct{}), make(chan struct{})
			var ret time.Time
			lead := coalescetest.DoAsync(ctx, ma, key, func(context.Context) ([]byte, error) {
				close(started)
				<-gate
				ret = time.Now()
				return []byte("result"), nil
			})
			<-started
			follow := coalescetest.DoAsync(ctx, mb, key, func(context.Context) ([]byte, error) { return nil, errors.New("follower ran") })
			waitQueued(b, cliA, "/bench-co/"+escapeName("-c:"+key)+"/", 2)
			time.Sleep(hold)
			cb.reset()
			close(gate)
			r := <-follow
			end := time.Now()
			if r.Err != nil || !r.Shared {
				b.Fatalf("follower: shared=%v err=%v", r.Shared, r.Err)
			}
			trips += cb.trips("")
			events += cb.eventsOn(storeDir)
			if lr := <-lead; lr.Err != nil {
				b.Fatal(lr.Err)
			}
			wakes = append(wakes, end.Sub(ret))
		}
		reportWakes(b, wakes)
		b.ReportMetric(float64(trips)/float64(b.N), "trips/wake")
		b.ReportMetric(float64(events)/float64(b.N), "events/wake")
	})
	b.Run(sub("Follower/etcdMutex"), func(b *testing.B) { benchMutexWake(b, c, "/bench-mu/f", hold) })

	b.Run(sub("WaitUnlocked/shmlocks"), func(b *testing.B) {
		cliA, cliB := c.client(b), c.client(b)
		ma, err := Open(ctx, cliA, "/bench-wu", nil)
		if err != nil {
			b.Fatal(err)
		}
		defer ma.Close()
		mb, err := Open(ctx, cliB, "/bench-wu", nil)
		if err != nil {
			b.Fatal(err)
		}
		defer mb.Close()
		var wakes []time.Duration
		for i := 0; i < b.N; i++ {
			l, err := ma.Acquire(ctx, "w", manager.RequestOptions{})
			if err != nil {
				b.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- mb.WaitUnlocked(ctx, "w", manager.Exclusive) }()
			waitQueued(b, cliA, "/bench-wu/w/w/", 1) // its watcher key: it waits
			time.Sleep(hold)
			start := time.Now()
			if err := l.Release(); err != nil {
				b.Fatal(err)
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			wakes = append(wakes, time.Since(start))
		}
		reportWakes(b, wakes)
	})
	b.Run(sub("WaitUnlocked/etcdMutex"), func(b *testing.B) { benchMutexWake(b, c, "/bench-mu/w", hold) })
}

// wakeHold is the longer of the two times a holder holds after its waiter
// is queued, before it releases (the other is 0: a hot hand-off): longer
// than etcd's resync period of watches that start at a past revision
// (100 ms; the Mutex's always does, ours when other writes came between
// the read and the watch), so that every waiter's watch is in etcd's
// synced group: the steady state of a lock held for a while.
const wakeHold = 150 * time.Millisecond

// benchMutexWake measures a concurrency.Mutex waiter's wake-up: from the
// holder's Unlock call to the waiter's Lock returning.
func benchMutexWake(b *testing.B, c *cluster, name string, hold time.Duration) {
	ctx := context.Background()
	cliA, cliB := c.client(b), c.client(b)
	sa, err := concurrency.NewSession(cliA, concurrency.WithTTL(5))
	if err != nil {
		b.Fatal(err)
	}
	defer sa.Close()
	sb, err := concurrency.NewSession(cliB, concurrency.WithTTL(5))
	if err != nil {
		b.Fatal(err)
	}
	defer sb.Close()
	ma, mb := concurrency.NewMutex(sa, name), concurrency.NewMutex(sb, name)
	var wakes []time.Duration
	for i := 0; i < b.N; i++ {
		if err := ma.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- mb.Lock(ctx) }()
		waitQueued(b, cliA, name+"/", 2)
		time.Sleep(hold)
		start := time.Now()
		if err := ma.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		wakes = append(wakes, time.Since(start))
		if err := mb.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
	reportWakes(b, wakes)
}

// waitQueued waits until prefix holds n keys (a waiter has made its key).
func waitQueued(b *testing.B, cli *clientv3.Client, prefix string, n int) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			b.Fatal(err)
		}
		if g.Count >= int64(n) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d keys under %q, want %d", g.Count, prefix, n)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// reportWakes reports the median wake-up in microseconds.
func reportWakes(b *testing.B, wakes []time.Duration) {
	slices.Sort(wakes)
	b.ReportMetric(float64(wakes[len(wakes)/2].Nanoseconds())/1e3, "wake-us")
}
