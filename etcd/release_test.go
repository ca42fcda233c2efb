package etcd

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// openOn opens a backend Manager on cli under prefix.
func openOn(t *testing.T, cli *clientv3.Client, prefix string, o *Options) (*manager.Manager, *backend) {
	t.Helper()
	b, err := open(ctxT(t, 10*time.Second), cli, prefix, o)
	if err != nil {
		t.Fatal(err)
	}
	m := manager.NewBackendManager(b)
	t.Cleanup(func() { m.Close() })
	return m, b
}

// keysOf returns the request keys of client under prefix/name.
func keysOf(t *testing.T, ctx context.Context, cli *clientv3.Client, prefix, name, client string) []string {
	t.Helper()
	g, err := cli.Get(ctx, prefix+"/"+escapeName(name)+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range g.Kvs {
		if strings.Contains(string(kv.Key), "/"+client+"-") {
			out = append(out, string(kv.Key))
		}
	}
	return out
}

// leaseAlive reports whether b's current lease is alive on the cluster.
func leaseAlive(t *testing.T, ctx context.Context, admin *clientv3.Client, b *backend) bool {
	t.Helper()
	b.mu.Lock()
	s := b.sess
	b.mu.Unlock()
	if s == nil {
		return false
	}
	tr, err := admin.TimeToLive(ctx, s.Lease())
	if err != nil {
		t.Fatal(err)
	}
	return tr.TTL > 0
}

// mustAcquireWithin acquires name on m, failing the test after d.
func mustAcquireWithin(t *testing.T, m *manager.Manager, name string, d time.Duration) *manager.Lock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	l, err := m.Acquire(ctx, name, manager.RequestOptions{})
	if err != nil {
		t.Fatalf("%q not granted in %v: %v", name, d, err)
	}
	return l
}

// TestReleaseRetried: the first attempt of a release gets no answer
// (failBefore: it did not reach etcd; failAfter: it deleted the key and the
// answer was lost). The release is retried and says exactly what happened:
// success when the earlier attempt deleted the key (also when the key's
// history was compacted before the retry looked at it), ErrStolen when a
// steal took the lock in between, ErrStolen and ErrSessionLost when the
// lease ended in between. Request returns that, and never leaves the key.
func TestReleaseRetried(t *testing.T) {
	c := startCluster(t, 1)
	admin := c.client(t)
	for _, tc := range []struct {
		name    string
		first   fault
		between string // what happens after the first attempt: "", "steal", "revoke"
		compact bool   // compact past the delete before the retry looks
		want    error  // nil, ErrStolen or ErrSessionLost (which implies ErrStolen)
	}{
		{"answer lost", failAfter, "", false, nil},
		{"answer lost, history compacted", failAfter, "", true, nil},
		{"not applied", failBefore, "", false, nil},
		{"stolen meanwhile", failBefore, "steal", false, manager.ErrStolen},
		{"stolen meanwhile, history compacted", failBefore, "steal", true, manager.ErrStolen},
		{"lease ended meanwhile", failBefore, "revoke", false, ErrSessionLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "/rel-" + strings.ReplaceAll(tc.name, " ", "-")
			ctx := ctxT(t, 30*time.Second)
			cli := c.client(t)
			fkv := newFaultKV(cli)
			a, ab := openOn(t, cli, prefix, &Options{TTL: 5 * time.Second, CallTimeout: time.Second})
			b, _ := openOn(t, c.client(t), prefix, &Options{TTL: 5 * time.Second})
			var attempts atomic.Int32
			var between sync.Once
			fkv.setRule(func(tx *txnCall) fault {
				if _, ok := tx.release(); !ok {
					return pass
				}
				if attempts.Add(1) == 1 {
					return tc.first
				}
				return pass
			})
			testHookRelease.set(func(key string) {
				between.Do(func() {
					switch tc.between {
					case "steal":
						l, err := b.Acquire(ctx, "n", manager.RequestOptions{Steal: true})
						if err != nil {
							t.Error(err)
							return
						}
						t.Cleanup(func() { l.Release() })
					case "revoke":
						ab.mu.Lock()
						lease := ab.sess.Lease()
						ab.mu.Unlock()
						if _, err := admin.Revoke(ctx, lease); err != nil {
							t.Error(err)
						}
					}
					if tc.compact {
						if err := compactNow(ctx, admin); err != nil {
							t.Error(err)
						}
					}
				})
			})
			t.Cleanup(func() { testHookRelease.set(nil) })

			var lost <-chan struct{}
			err := a.Request(ctx, "n", manager.RequestOptions{}, func(ctx context.Context, l *manager.Lock) error {
				lost = l.Lost()
				return nil
			})
			if n := attempts.Load(); n < 2 {
				t.Fatalf("%d release attempts: the fault was not injected", n)
			}
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("Request: %v, want success (the release took effect)", err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("Request: %v, want %v", err, tc.want)
			case errors.Is(tc.want, manager.ErrStolen) && errors.Is(err, ErrSessionLost):
				t.Fatalf("Request: %v: a steal reported as a lost session", err)
			}
			select {
			case <-lost:
				if tc.want == nil {
					t.Fatal("Lost closed for a lock released by its own Release")
				}
			default:
			}
			if k := keysOf(t, ctx, admin, prefix, "n", a.ClientID()); len(k) != 0 {
				t.Fatalf("keys left behind: %v", k)
			}
			if tc.between == "" {
				if !leaseAlive(t, ctx, admin, ab) {
					t.Fatal("a's lease ended: the key may have gone with it, not with the release")
				}
				mustAcquireWithin(t, b, "n", 10*time.Second).Release()
			}
		})
	}
}

// compactNow compacts the cluster at its current revision.
func compactNow(ctx context.Context, cli *clientv3.Client) error {
	p, err := cli.Put(ctx, "/churn", "x")
	if err != nil {
		return err
	}
	_, err = cli.Compact(ctx, p.Header.Revision, clientv3.WithCompactPhysical())
	return err
}

// TestWithdrawRetried: the withdrawal of an aborted request gets no answer
// the first time: it is retried, so the queued key nobody waits for does
// not block the name for the life of the lease.
func TestWithdrawRetried(t *testing.T) {
	c := startCluster(t, 1)
	admin := c.client(t)
	ctx := ctxT(t, 30*time.Second)
	cli := c.client(t)
	fkv := newFaultKV(cli)
	a, ab := openOn(t, cli, "/withdraw", &Options{TTL: 5 * time.Second, CallTimeout: time.Second})
	b, _ := openOn(t, c.client(t), "/withdraw", nil)
	var failed atomic.Int32
	fkv.setRule(func(tx *txnCall) fault {
		if _, ok := tx.withdrawal(); ok && failed.Add(1) == 1 {
			return failBefore
		}
		return pass
	})
	h, err := b.Acquire(ctx, "n", manager.RequestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := a.Acquire(wctx, "n", manager.RequestOptions{}); done <- err }()
	waitPending(t, ctx, b, 1)
	cancel()
	if err := <-done; !errors.Is(err, manager.ErrAborted) {
		t.Fatalf("aborted request: %v", err)
	}
	if failed.Load() == 0 {
		t.Fatal("the withdrawal was not failed")
	}
	waitPending(t, ctx, b, 0) // the retry deleted the key
	if !leaseAlive(t, ctx, admin, ab) {
		t.Fatal("a's lease ended: the key went with it, not with the withdrawal")
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	mustAcquireWithin(t, b, "n", 10*time.Second).Release()
}

// TestRequestReleaseCutOff is the leak of issue 39: Request's own release
// cannot reach etcd (a's only path to the cluster is cut for a moment, well
// within its TTL). Request retries until the cut is restored, returns nil,
// the key is gone while a's lease lives on, and the next client is granted.
func TestRequestReleaseCutOff(t *testing.T) {
	c := startCluster(t, 1)
	admin := c.client(t)
	p := newProxy(t, c.endpoints()[0])
	ctx := ctxT(t, 40*time.Second)
	a, ab := openOn(t, clientOf(t, p.addr()), "/cut", &Options{TTL: 5 * time.Second, CallTimeout: 500 * time.Millisecond})
	b, _ := openOn(t, c.client(t), "/cut", nil)
	var retries atomic.Int32
	restored := make(chan struct{})
	testHookRelease.set(func(string) {
		if retries.Add(1) == 3 { // a few attempts failed: restore the path
			p.setCut(false)
			close(restored)
		}
	})
	t.Cleanup(func() { testHookRelease.set(nil) })
	err := a.Request(ctx, "r", manager.RequestOptions{}, func(ctx context.Context, l *manager.Lock) error {
		p.setCut(true) // Request's release cannot reach etcd
		return nil
	})
	select {
	case <-restored:
	default:
		t.Fatalf("the release was not retried (%d retries)", retries.Load())
	}
	if err != nil {
		t.Fatalf("Request: %v", err)
	}
	if k := keysOf(t, ctx, admin, "/cut", "r", a.ClientID()); len(k) != 0 {
		t.Fatalf("keys left behind: %v", k)
	}
	if !leaseAlive(t, ctx, admin, ab) {
		t.Fatal("a's lease ended: the key went with it, not with the release")
	}
	mustAcquireWithin(t, b, "r", 10*time.Second).Release()
}

// TestReleaseMemberStopped: a's client talks to the leader only (through
// a proxy), and the leader is killed just as a's Request releases: raft
// stops at once (HardStop) and its client connections drop (the proxy is
// cut, as a killed process's sockets are); the client then fails over to
// the other members (SetEndpoints, as a client given every endpoint does by
// itself) and the member restarts as a follower. Whether or not the first
// attempt took effect before the stop (round 0 stops the member before the
// call is sent, round 1 while it is sent), Request returns nil, the key is
// gone, a's lease lives (its TTL is long enough to outlive the failover)
// and the next client is granted.
func TestReleaseMemberStopped(t *testing.T) {
	if testing.Short() {
		t.Skip("3-member cluster")
	}
	c := startCluster(t, 3)
	eps := c.endpoints()
	ctx := ctxT(t, 60*time.Second)
	for round := range 2 {
		x := c.waitLeader()
		var others []string
		for i, ep := range eps {
			if i != x {
				others = append(others, ep)
			}
		}
		admin := clientOf(t, others...)
		p := newProxy(t, eps[x])
		cli := clientOf(t, p.addr())
		fkv := newFaultKV(cli)
		a, ab := openOn(t, cli, "/stopped", &Options{TTL: 30 * time.Second, CallTimeout: time.Second})
		bcli := clientOf(t, others...)
		b, _ := openOn(t, bcli, "/stopped", nil)
		var once sync.Once
		restarted := make(chan error, 1)
		fkv.setRule(func(tx *txnCall) fault {
			if _, ok := tx.release(); ok {
				once.Do(func() {
					stopped := make(chan struct{})
					go func() {
						e := c.take(x)
						e.Server.HardStop()
						p.setCut(true)
						close(stopped)
						cli.SetEndpoints(others...)
						e.Close()
						restarted <- c.start(x)
					}()
					if round == 0 {
						<-stopped
					}
				})
			}
			return pass
		})
		err := a.Request(ctx, "n", manager.RequestOptions{}, func(ctx context.Context, l *manager.Lock) error { return nil })
		if rerr := <-restarted; rerr != nil {
			t.Fatal(rerr)
		}
		if err != nil {
			t.Fatalf("round %d: Request: %v", round, err)
		}
		if k := keysOf(t, ctx, admin, "/stopped", "n", a.ClientID()); len(k) != 0 {
			t.Fatalf("round %d: keys left behind: %v", round, k)
		}
		if !leaseAlive(t, ctx, admin, ab) {
			t.Fatalf("round %d: a's lease ended: the key went with it, not with the release", round)
		}
		mustAcquireWithin(t, b, "n", 10*time.Second).Release()
		a.Close()
		b.Close()
		// No connection of this round is left to the next round's leader
		// (a member with live client streams stops slowly).
		for _, c := range []*clientv3.Client{admin, bcli, cli} {
			c.Close()
		}
	}
}

// TestReleaseRefused: a release that etcd refuses for good (permission
// denied) is not retried: Release returns that error (neither ErrStolen nor
// ErrClosed), the lock stays held and releasable, and a later Release
// releases it.
func TestReleaseRefused(t *testing.T) {
	c := startCluster(t, 1)
	admin := c.client(t)
	ctx := ctxT(t, 30*time.Second)
	cli := c.client(t)
	fkv := newFaultKV(cli)
	a, _ := openOn(t, cli, "/refused", nil)
	var refused atomic.Int32
	fkv.setRule(func(tx *txnCall) fault {
		if _, ok := tx.release(); ok && refused.Add(1) == 1 {
			return refuse
		}
		return pass
	})
	l := mustAcquireWithin(t, a, "n", 10*time.Second)
	err := l.Release()
	if err == nil || errors.Is(err, manager.ErrStolen) || errors.Is(err, manager.ErrClosed) {
		t.Fatalf("refused Release: %v", err)
	}
	if k := keysOf(t, ctx, admin, "/refused", "n", a.ClientID()); len(k) != 1 {
		t.Fatalf("keys after a refused release: %v", k)
	}
	select {
	case <-l.Lost():
		t.Fatal("Lost closed after a refused release")
	default:
	}
	if err := l.Release(); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	if k := keysOf(t, ctx, admin, "/refused", "n", a.ClientID()); len(k) != 0 {
		t.Fatalf("keys after the release: %v", k)
	}
}
