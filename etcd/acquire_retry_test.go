package etcd

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestAcquireRetried: a call of Acquire gets no answer (failBefore: it did
// not reach etcd; failAfter: it took effect and the answer was lost). The
// request is retried, as it waits for the lock: it is granted with the key
// its first attempt created (one key, its place in the queue kept), or
// with the one its retry creates; never two keys, never an etcd error.
func TestAcquireRetried(t *testing.T) {
	c := startCluster(t, 1)
	admin := c.client(t)
	for _, tc := range []struct {
		name  string
		opts  manager.RequestOptions
		held  bool // someone else holds the name when the request comes (for Steal)
		first fault
	}{
		{"enqueue, answer lost", manager.RequestOptions{}, false, failAfter},
		{"enqueue, not applied", manager.RequestOptions{}, false, failBefore},
		{"if available, answer lost", manager.RequestOptions{IfAvailable: true}, false, failAfter},
		{"if available, not applied", manager.RequestOptions{IfAvailable: true}, false, failBefore},
		{"steal, answer lost", manager.RequestOptions{Steal: true}, true, failAfter},
		{"steal, not applied", manager.RequestOptions{Steal: true}, true, failBefore},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "/acq-" + strings.ReplaceAll(tc.name, " ", "-")
			prefix = strings.ReplaceAll(prefix, ",", "")
			ctx := ctxT(t, 30*time.Second)
			cli := c.client(t)
			fkv := newFaultKV(cli)
			a, _ := openOn(t, cli, prefix, &Options{TTL: 5 * time.Second, CallTimeout: time.Second})
			b, _ := openOn(t, c.client(t), prefix, nil)
			var h *manager.Lock
			if tc.held {
				h = mustAcquireWithin(t, b, "n", 10*time.Second)
			}
			var injected atomic.Int32
			fkv.setRule(func(tx *txnCall) fault {
				if tx.puts() > 0 && injected.Add(1) == 1 {
					return tc.first
				}
				return pass
			})
			l, err := a.Acquire(ctx, "n", tc.opts)
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if injected.Load() == 0 {
				t.Fatal("no fault injected")
			}
			keys := keysOf(t, ctx, admin, prefix, "n", a.ClientID())
			if len(keys) != 1 {
				t.Fatalf("a's keys %v, want one", keys)
			}
			g, err := admin.Get(ctx, keys[0])
			if err != nil || len(g.Kvs) != 1 || uint64(g.Kvs[0].ModRevision) != l.Token() {
				t.Fatalf("token %d, key %v: %v", l.Token(), g.Kvs, err)
			}
			if h != nil {
				if err := h.Release(); !errors.Is(err, manager.ErrStolen) {
					t.Fatalf("stolen holder's Release: %v", err)
				}
			}
			next := make(chan error, 1)
			go func() {
				l2, err := b.Acquire(ctx, "n", manager.RequestOptions{})
				if err == nil {
					err = l2.Release()
				}
				next <- err
			}()
			if err := l.Release(); err != nil {
				t.Fatal(err)
			}
			if err := <-next; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAcquireUnreachable: while etcd does not answer a's calls, a's
// request waits (no etcd error) until its ctx ends: ErrAborted, and no key
// is left once etcd answers again.
func TestAcquireUnreachable(t *testing.T) {
	c := startCluster(t, 1)
	admin := c.client(t)
	ctx := ctxT(t, 30*time.Second)
	cli := c.client(t)
	fkv := newFaultKV(cli)
	a, _ := openOn(t, cli, "/unreach", &Options{TTL: 5 * time.Second, CallTimeout: time.Second})
	var blocked atomic.Bool
	blocked.Store(true)
	fkv.setRule(func(tx *txnCall) fault {
		switch {
		case !blocked.Load():
			return pass
		case tx.puts() > 0:
			return failAfter // it takes effect: a key to withdraw
		}
		return failBefore // the withdrawal too, until etcd answers again

	})
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err := a.Acquire(actx, "n", manager.RequestOptions{})
	if !errors.Is(err, manager.ErrAborted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire while etcd does not answer: %v", err)
	}
	blocked.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for len(keysOf(t, ctx, admin, "/unreach", "n", a.ClientID())) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the key of the aborted request was left behind")
		}
		time.Sleep(10 * time.Millisecond)
	}
	g, err := admin.Get(ctx, "/unreach/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || g.Count != 1 { // a's agent key only
		t.Fatalf("keys under the prefix: %d, %v", g.Count, err)
	}
}
