package etcd

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

func openB(t *testing.T, c *cluster, ttl time.Duration) (*manager.Manager, *backend) {
	t.Helper()
	b, err := open(ctxT(t, 10*time.Second), c.client(t), "/faults", &Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	m := manager.NewBackendManager(b)
	t.Cleanup(func() { m.Close() })
	return m, b
}

func waitClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not closed in 10s", what)
	}
}

// TestLeaseLost: the lease of a client ends while it holds a lock and waits
// for another (revoked here, as etcd does when the client cannot keep it
// alive for its TTL): its Lost closes, its waiting request fails instead of
// waiting forever (etcd issue 19597), the next request is granted, and its
// late Release reports the loss and touches nothing. The Manager goes on
// with a new lease.
func TestLeaseLost(t *testing.T) {
	c := startCluster(t, 1)
	a, ab := openB(t, c, 2*time.Second)
	b, _ := openB(t, c, 2*time.Second)
	ctx := ctxT(t, 30*time.Second)
	held, err := a.Acquire(ctx, "held", manager.RequestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := b.Acquire(ctx, "other", manager.RequestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() {
		_, err := a.Acquire(ctx, "other", manager.RequestOptions{})
		waitErr <- err
	}()
	next := make(chan *manager.Lock, 1)
	go func() {
		l, err := b.Acquire(ctx, "held", manager.RequestOptions{})
		if err != nil {
			t.Error(err)
		}
		next <- l
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := b.Query(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Pending) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests not queued: %+v", s)
		}
		time.Sleep(time.Millisecond)
	}
	ab.mu.Lock()
	lease := ab.sess.Lease()
	ab.mu.Unlock()
	if _, err := c.client(t).Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, held.Lost(), "Lost of a lock whose lease ended")
	select {
	case err := <-waitErr:
		if !errors.Is(err, ErrSessionLost) {
			t.Fatalf("waiting request of a lost lease: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a waiter whose lease ended kept waiting")
	}
	var l *manager.Lock
	select {
	case l = <-next:
	case <-time.After(10 * time.Second):
		t.Fatal("the next request was not granted")
	}
	if l == nil {
		t.Fatal("no lock")
	}
	err = held.Release()
	if !errors.Is(err, manager.ErrStolen) {
		t.Fatalf("late Release: %v", err)
	}
	s, err := b.Query(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Held) != 2 || len(s.Pending) != 0 {
		t.Fatalf("a late Release touched the next holder: %+v", s)
	}
	for _, h := range s.Held {
		if h.ClientID != b.ClientID() {
			t.Fatalf("holder %+v is not b", h)
		}
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(); err != nil {
		t.Fatal(err)
	}
	// a carries on with a new lease.
	again, err := a.Acquire(ctx, "held", manager.RequestOptions{})
	if err != nil {
		t.Fatalf("Acquire after the lease was lost: %v", err)
	}
	if again.Token() <= l.Token() {
		t.Fatalf("token %d after %d", again.Token(), l.Token())
	}
	if err := again.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestLeaderKilled: on a 3-member cluster, the leader is stopped while a
// lock is held and three requests of two clients are queued behind it.
// After the election the queue is intact (same order), and every request
// is granted in turn, never two at once (an occupancy counter).
func TestLeaderKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("3-member cluster")
	}
	c := startCluster(t, 3)
	a, _ := openB(t, c, 3*time.Second)
	b, _ := openB(t, c, 3*time.Second)
	ctx := ctxT(t, 60*time.Second)
	h, err := a.Acquire(ctx, "n", manager.RequestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var inside atomic.Int32
	var grants atomic.Int32
	const k = 3
	done := make(chan error, k)
	var order []string
	for i := 0; i < k; i++ {
		m := []*manager.Manager{a, b}[i%2]
		order = append(order, m.ClientID())
		go func() {
			l, err := m.Acquire(ctx, "n", manager.RequestOptions{})
			if err != nil {
				done <- err
				return
			}
			if inside.Add(1) != 1 {
				done <- errors.New("granted twice")
				return
			}
			grants.Add(1)
			time.Sleep(20 * time.Millisecond) // hold for a moment: an overlap would be seen
			inside.Add(-1)
			for {
				if err := l.Release(); err == nil || errors.Is(err, manager.ErrReleased) {
					break
				} else if errors.Is(err, manager.ErrStolen) {
					done <- err
					return
				}
			}
			done <- nil
		}()
		deadline := time.Now().Add(10 * time.Second)
		for {
			s, err := b.Query(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Pending) == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("request %d not queued", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	old := c.waitLeader()
	c.stop(old)
	nl := c.waitLeader()
	if nl == old {
		t.Fatal("the stopped member is still the leader")
	}
	var s manager.Snapshot
	for {
		s, err = b.Query(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("query after the election: %v", err)
		}
	}
	if len(s.Held) != 1 || s.Held[0].ClientID != a.ClientID() || len(s.Pending) != k {
		t.Fatalf("after the election: %+v", s)
	}
	for i, p := range s.Pending {
		if p.ClientID != order[i] {
			t.Fatalf("queue order changed: %+v, want clients %v", s.Pending, order)
		}
	}
	for {
		err := h.Release()
		if err == nil {
			break
		}
		if errors.Is(err, manager.ErrStolen) || ctx.Err() != nil {
			t.Fatalf("release of the first holder: %v", err)
		}
	}
	for i := 0; i < k; i++ {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatalf("only %d of %d queued requests granted", grants.Load(), k)
		}
	}
}
