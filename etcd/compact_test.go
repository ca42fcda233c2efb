package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestWatchCompacted: every waiter's first watch starts from a revision
// that is compacted away (the test churns other keys and compacts the
// cluster between the waiter's read of the queue and the start of its
// watch). Each waiter re-reads the queue and watches again instead of being
// stuck or granted; when the holder releases, the waiters are granted one
// at a time, in the order they queued.
func TestWatchCompacted(t *testing.T) {
	c := startCluster(t, 1)
	admin := c.client(t)
	ctx := ctxT(t, 30*time.Second)
	holder, _ := openB(t, c, 5*time.Second)
	b, _ := openB(t, c, 5*time.Second)
	d, _ := openB(t, c, 5*time.Second)

	var mu, cmu sync.Mutex
	starts := map[string]int{} // watch starts per watched key
	startc := make(chan struct{}, 16)
	compacted := atomic.Int32{}
	testHookWatch.set(func(key string, rev int64) {
		mu.Lock()
		starts[key]++
		first := starts[key] == 1
		mu.Unlock()
		defer func() { startc <- struct{}{} }()
		if !first {
			return
		}
		cmu.Lock() // waiters' hooks may overlap: compactions go in revision order
		err := compactPast(ctx, admin, key, rev)
		cmu.Unlock()
		if err != nil {
			t.Error(err)
			return
		}
		compacted.Add(1)
	})
	t.Cleanup(func() { testHookWatch.set(nil) })

	h, err := holder.Acquire(ctx, "n", manager.RequestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waiters := []*manager.Manager{b, d, holder} // the holder's Manager queues too
	type grant struct {
		i int
		l *manager.Lock
	}
	grants := make(chan grant, len(waiters))
	var inside atomic.Int32
	inside.Store(1) // h
	for i, m := range waiters {
		go func() {
			l, err := m.Acquire(ctx, "n", manager.RequestOptions{})
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			if n := inside.Add(1); n != 1 {
				t.Errorf("waiter %d granted while %d others hold", i, n-1)
			}
			grants <- grant{i, l}
		}()
		waitPending(t, ctx, holder, i+1)
	}
	// Each waiter's watch started from a compacted revision, then it read
	// the queue again and started a second watch, still not granted.
	for {
		mu.Lock()
		again := 0
		for _, n := range starts {
			if n >= 2 {
				again++
			}
		}
		mu.Unlock()
		if again == len(waiters) {
			break
		}
		select {
		case g := <-grants:
			t.Fatalf("waiter %d granted while the holder holds", g.i)
		case <-startc:
		case <-ctx.Done():
			t.Fatalf("waiters did not watch again after a compacted start: %v", starts)
		}
	}
	if n := compacted.Load(); n != int32(len(waiters)) {
		t.Fatalf("%d compacted watch starts, want %d", n, len(waiters))
	}
	select {
	case g := <-grants:
		t.Fatalf("waiter %d granted while the holder holds", g.i)
	default:
	}
	if err := holder.Check(); err != nil {
		t.Fatal(err)
	}
	inside.Add(-1)
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	var last uint64 = h.Token()
	for want := range waiters {
		select {
		case g := <-grants:
			if g.i != want {
				t.Fatalf("waiter %d granted, want %d (FIFO)", g.i, want)
			}
			if g.l.Token() <= last {
				t.Fatalf("waiter %d: token %d after %d", g.i, g.l.Token(), last)
			}
			last = g.l.Token()
			inside.Add(-1)
			if err := g.l.Release(); err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatalf("waiter %d stuck after the release", want)
		}
	}
}

// compactPast writes other keys and compacts the cluster so that a watch of
// key from rev+1 is refused as compacted; it checks that this is so.
func compactPast(ctx context.Context, cli *clientv3.Client, key string, rev int64) error {
	var cur int64
	for i := range 3 {
		p, err := cli.Put(ctx, "/churn", fmt.Sprint(i))
		if err != nil {
			return err
		}
		cur = p.Header.Revision
	}
	if _, err := cli.Compact(ctx, cur, clientv3.WithCompactPhysical()); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	wr, ok := <-cli.Watch(wctx, key, clientv3.WithRev(rev+1))
	if !ok || wr.CompactRevision == 0 || !errors.Is(wr.Err(), rpctypes.ErrCompacted) {
		return fmt.Errorf("watch of %s from %d after compacting at %d: not refused as compacted (ok %v, %v)", key, rev+1, cur, ok, wr.Err())
	}
	return nil
}
