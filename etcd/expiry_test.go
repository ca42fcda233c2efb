package etcd

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// stallLease is a client's Lease whose keep-alives of one lease can be
// stopped without a Revoke: the keep-alive stream of that lease ends (no
// more keep-alives reach the server), while the channel the session reads
// stays open until learn is called, as if the client had not noticed yet.
// The rest of the client (KV, watches) keeps working. It records every
// Revoke, so a test can show that a lease ended by expiry.
type stallLease struct {
	clientv3.Lease
	mu      sync.Mutex
	stalls  map[clientv3.LeaseID]chan struct{} // closed: keep-alives stop
	learns  map[clientv3.LeaseID]chan struct{} // closed: the session learns
	revoked []clientv3.LeaseID
}

func newStallLease(l clientv3.Lease) *stallLease {
	return &stallLease{Lease: l, stalls: map[clientv3.LeaseID]chan struct{}{}, learns: map[clientv3.LeaseID]chan struct{}{}}
}

func (l *stallLease) chans(id clientv3.LeaseID) (stall, learn chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stalls[id] == nil {
		l.stalls[id], l.learns[id] = make(chan struct{}), make(chan struct{})
	}
	return l.stalls[id], l.learns[id]
}

// stall stops the keep-alives of id.
func (l *stallLease) stall(id clientv3.LeaseID) {
	s, _ := l.chans(id)
	close(s)
}

// learn closes the keep-alive channel of a stalled id (the session ends).
func (l *stallLease) learn(id clientv3.LeaseID) {
	_, c := l.chans(id)
	close(c)
}

func (l *stallLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	l.mu.Lock()
	l.revoked = append(l.revoked, id)
	l.mu.Unlock()
	return l.Lease.Revoke(ctx, id)
}

func (l *stallLease) wasRevoked(id clientv3.LeaseID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.revoked {
		if r == id {
			return true
		}
	}
	return false
}

func (l *stallLease) KeepAlive(ctx context.Context, id clientv3.LeaseID) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	kctx, cancel := context.WithCancel(ctx)
	in, err := l.Lease.KeepAlive(kctx, id)
	if err != nil {
		cancel()
		return nil, err
	}
	stall, learn := l.chans(id)
	out := make(chan *clientv3.LeaseKeepAliveResponse, 1)
	go func() {
		defer close(out)
		defer cancel()
		for {
			select {
			case resp, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- resp:
				default: // the session drains; a full channel drops, as clientv3 does
				}
			case <-stall:
				cancel() // no more keep-alives for id reach the server
				select {
				case <-learn:
				case <-ctx.Done():
				}
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// TestLeaseExpired: the keep-alives of a holder's lease stop (no Revoke)
// and its TTL passes on the server: the key it held is deleted by etcd, its
// Lost closes (its watch sees the deletion, before its own keep-alive
// channel says anything), the next request is granted with a higher token,
// and the late Release of a lock of the expired lease that nobody watched
// (so its Release goes to etcd) reports ErrStolen and leaves the new holder
// alone. When the client learns that its lease ended, the Manager carries on
// with a new one.
func TestLeaseExpired(t *testing.T) {
	c := startCluster(t, 1)
	cli := c.client(t)
	sl := newStallLease(cli.Lease)
	cli.Lease = sl
	ctx := ctxT(t, 30*time.Second)
	ab, err := open(ctx, cli, "/faults", &Options{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a := manager.NewBackendManager(ab)
	t.Cleanup(func() { a.Close() })
	b, _ := openB(t, c, 5*time.Second)

	watched, err := a.Acquire(ctx, "watched", manager.RequestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lost := watched.Lost() // starts the holder's watch of its key
	unwatched, err := a.Acquire(ctx, "unwatched", manager.RequestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	type grant struct {
		l   *manager.Lock
		err error
	}
	next := make(chan grant, 2)
	for _, name := range []string{"watched", "unwatched"} {
		go func() {
			l, err := b.Acquire(ctx, name, manager.RequestOptions{})
			next <- grant{l, err}
		}()
	}
	waitPending(t, ctx, b, 2)

	ab.mu.Lock()
	lease := ab.sess.Lease()
	ab.mu.Unlock()
	sl.stall(lease)
	select {
	case <-lost:
	case <-ctx.Done():
		t.Fatal("Lost of a lock whose lease expired did not close")
	}
	if sl.wasRevoked(lease) {
		t.Fatal("the lease was revoked, not expired")
	}
	tr, err := c.client(t).TimeToLive(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	if tr.TTL != -1 {
		t.Fatalf("lease %x still alive after Lost closed: TTL %d", lease, tr.TTL)
	}
	got := map[string]*manager.Lock{}
	for range 2 {
		select {
		case g := <-next:
			if g.err != nil {
				t.Fatal(g.err)
			}
			got[g.l.Name()] = g.l
		case <-ctx.Done():
			t.Fatal("the next requests were not granted after the lease expired")
		}
	}
	if got["watched"].Token() <= watched.Token() || got["unwatched"].Token() <= unwatched.Token() {
		t.Fatalf("tokens after expiry: %d after %d, %d after %d", got["watched"].Token(), watched.Token(),
			got["unwatched"].Token(), unwatched.Token())
	}
	// Late Releases: the watched lock knows it is lost; the unwatched one
	// does not (the session has not learned yet), so its Release asks etcd,
	// whose compare on the key's create revision fails.
	ab.mu.Lock()
	found := false
	for r := range ab.reqs {
		if r.name == "unwatched" {
			found = true
			if r.isLost() {
				t.Error("the unwatched lock already knows it is lost: its Release would not ask etcd")
			}
		}
	}
	ab.mu.Unlock()
	if !found {
		t.Fatal("the unwatched lock is not tracked by its backend")
	}
	for _, l := range []*manager.Lock{watched, unwatched} {
		if err := l.Release(); !errors.Is(err, manager.ErrStolen) {
			t.Fatalf("late Release of %q: %v", l.Name(), err)
		}
	}
	s, err := b.Query(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Held) != 2 || len(s.Pending) != 0 {
		t.Fatalf("a late Release touched the new holders: %+v", s)
	}
	for _, h := range s.Held {
		if h.ClientID != b.ClientID() || got[h.Name] == nil {
			t.Fatalf("holder %+v is not b's grant", h)
		}
	}
	// The client learns; the Manager carries on with a new lease.
	sl.learn(lease)
	for _, l := range got { // still b's keys, with b's create revisions
		if err := l.Release(); err != nil {
			t.Fatalf("Release by the new holder of %q: %v", l.Name(), err)
		}
	}
	again, err := a.Acquire(ctx, "watched", manager.RequestOptions{})
	if err != nil {
		t.Fatalf("Acquire after the lease expired: %v", err)
	}
	if again.Token() <= got["watched"].Token() {
		t.Fatalf("token %d after %d", again.Token(), got["watched"].Token())
	}
	if err := again.Release(); err != nil {
		t.Fatal(err)
	}
}

// waitPending waits (bounded by ctx) until m's Query shows n pending requests.
func waitPending(t *testing.T, ctx context.Context, m *manager.Manager, n int) {
	t.Helper()
	for {
		s, err := m.Query(ctx)
		if err != nil {
			t.Fatalf("waiting for %d pending requests: %v", n, err)
		}
		if len(s.Pending) == n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d pending requests, want %d", len(s.Pending), n)
		case <-time.After(time.Millisecond):
		}
	}
}
