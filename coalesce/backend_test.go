package coalesce

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/seam"
	"github.com/shmlocks/shmlocks/manager"
)

// memBucket is a lock service in memory with a record store: what a
// backend (etcd) gives Do. Its locks are exclusive in every mode (the
// flight lock is exclusive), FIFO per name; its store publishes only while
// the writer's grant is the name's holder, checked and written under one
// mutex (as a backend does in one transaction).
type memBucket struct {
	mu      sync.Mutex
	token   uint64
	names   map[string]*memName
	records map[string][]byte
}

type memName struct {
	holder *memGrant
	queue  []*memGrant
}

type memGrant struct {
	c       *memClient
	name    string
	token   uint64
	granted chan struct{}
	lost    chan struct{}
}

func newMemBucket() *memBucket {
	return &memBucket{names: map[string]*memName{}, records: map[string][]byte{}}
}

// memClient is one client (Manager) of a memBucket: a manager.Backend.
type memClient struct {
	b       *memBucket
	id      string
	closing chan struct{}
	closed  bool // b.mu
}

func (b *memBucket) client(t *testing.T, id string) *manager.Manager {
	m := manager.NewBackendManager(&memClient{b: b, id: id, closing: make(chan struct{})})
	t.Cleanup(func() { m.Close() })
	return m
}

// grantNext grants name n to its first waiter if it is free (b.mu held).
func (b *memBucket) grantNext(n *memName) {
	if n.holder != nil || len(n.queue) == 0 {
		return
	}
	n.holder, n.queue = n.queue[0], n.queue[1:]
	b.token++
	n.holder.token = b.token
	close(n.holder.granted)
}

func (c *memClient) ClientID() string { return c.id }
func (c *memClient) MaxNameLen() int  { return smallTable.MaxNameLen }

func (c *memClient) Acquire(ctx context.Context, name string, opts manager.RequestOptions) (manager.BackendGrant, error) {
	b := c.b
	b.mu.Lock()
	if c.closed {
		b.mu.Unlock()
		return manager.BackendGrant{}, manager.ErrClosed
	}
	n := b.names[name]
	if n == nil {
		n = &memName{}
		b.names[name] = n
	}
	if opts.IfAvailable && (n.holder != nil || len(n.queue) > 0) {
		b.mu.Unlock()
		return manager.BackendGrant{}, manager.ErrNotAvailable
	}
	g := &memGrant{c: c, name: name, granted: make(chan struct{}), lost: make(chan struct{})}
	n.queue = append(n.queue, g)
	b.grantNext(n)
	b.mu.Unlock()
	var err error
	select {
	case <-g.granted:
		return manager.BackendGrant{Token: g.token, Lost: g.lost, Release: func() error { return b.release(g) }}, nil
	case <-ctx.Done():
		err = errors.Join(manager.ErrAborted, ctx.Err())
	case <-c.closing:
		err = manager.ErrClosed
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if n.holder == g {
		n.holder = nil
		b.grantNext(n)
	}
	if i := slices.Index(n.queue, g); i >= 0 {
		n.queue = slices.Delete(n.queue, i, i+1)
	}
	return manager.BackendGrant{}, err
}

func (b *memBucket) release(g *memGrant) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.names[g.name]
	if n.holder != g {
		if g.c.closed {
			return manager.ErrClosed
		}
		return manager.ErrStolen
	}
	n.holder = nil
	b.grantNext(n)
	return nil
}

func (c *memClient) Query(ctx context.Context) (manager.Snapshot, error) {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	s := manager.Snapshot{Held: []manager.LockInfo{}, Pending: []manager.LockInfo{}}
	for name, n := range c.b.names {
		if n.holder != nil {
			s.Held = append(s.Held, manager.LockInfo{Name: name, ClientID: n.holder.c.id, PID: 1})
		}
		for _, g := range n.queue {
			s.Pending = append(s.Pending, manager.LockInfo{Name: name, ClientID: g.c.id, PID: 1})
		}
	}
	return s, nil
}

func (c *memClient) Close() error {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	c.closed = true
	close(c.closing)
	for _, n := range c.b.names {
		if n.holder != nil && n.holder.c == c {
			close(n.holder.lost)
			n.holder = nil
			c.b.grantNext(n)
		}
	}
	return nil
}

// cut takes every grant of c away, as the end of a session does: their
// Lost channels close and the next waiters are granted; c stays usable.
func (c *memClient) cut() {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	for _, n := range c.b.names {
		if n.holder != nil && n.holder.c == c {
			close(n.holder.lost)
			n.holder = nil
			c.b.grantNext(n)
		}
	}
}

// Store makes memClient a seam.StoreProvider.
func (c *memClient) Store(feature string) (seam.Store, error) {
	return memStore{b: c.b, prefix: feature + "/"}, nil
}

type memStore struct {
	b      *memBucket
	prefix string
}

func (s memStore) Load(key string, max int) ([]byte, error) {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	rec, ok := s.b.records[s.prefix+key]
	if !ok {
		return nil, fmt.Errorf("record %q: %w", key, fs.ErrNotExist)
	}
	return slices.Clone(rec[:min(len(rec), max+1)]), nil
}

func (s memStore) Publish(g seam.Grant, key string, rec []byte) error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	n := s.b.names[g.Name()]
	if n == nil || n.holder == nil || n.holder.token != g.Token() || n.holder.c.closed {
		return fmt.Errorf("publish %q: %w", key, manager.ErrStolen)
	}
	s.b.records[s.prefix+key] = slices.Clone(rec)
	return nil
}

func (s memStore) Range(max int, fn func(key string, rec []byte) error) error {
	s.b.mu.Lock()
	recs := map[string][]byte{}
	for k, r := range s.b.records {
		recs[k] = r
	}
	s.b.mu.Unlock()
	var errs []error
	for k, r := range recs {
		if key, ok := strings.CutPrefix(k, s.prefix); ok {
			if err := fn(key, r[:min(len(r), max+1)]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// On a backend that keeps records, Do coalesces across its clients as
// across the processes of a table: 8 goroutines in each of two clients,
// one run; a leader's error reaches the other client as ErrLeaderFailed.
// On a backend without a store, Do is ErrNotSupported, ErrClosed once closed.
func TestCoalesceOnBackend(t *testing.T) {
	b := newMemBucket()
	ms := []*manager.Manager{b.client(t, "a"), b.client(t, "b")}
	ctx := ctxT(t, eventually)
	for _, tc := range []struct {
		key  string
		err  error
		want error // in the other client
	}{{"ok", nil, nil}, {"fails", errors.New("boom"), ErrLeaderFailed}} {
		var runs atomic.Int32
		started, gate := make(chan struct{}), make(chan struct{})
		fn := func(context.Context) ([]byte, error) {
			if runs.Add(1) == 1 {
				close(started)
			}
			<-gate
			return []byte("v"), tc.err
		}
		lead := coalesceAsync(ctx, ms[0], tc.key, fn)
		<-started
		var chs []<-chan coResult
		for _, m := range ms {
			for i := 0; i < 8; i++ {
				chs = append(chs, coalesceAsync(ctx, m, tc.key, fn))
			}
		}
		waitMembers(t, ms[0], tc.key, 8)
		waitMembers(t, ms[1], tc.key, 8)
		waitPending(t, ms[0], "-c:"+tc.key, 1) // the other client's pilot
		close(gate)
		r := recv(t, lead)
		require.False(t, r.shared)
		require.Equal(t, tc.err, r.err)
		for i, ch := range chs {
			r := recv(t, ch)
			require.True(t, r.shared, tc.key)
			switch {
			case tc.err == nil:
				require.NoError(t, r.err)
				require.Equal(t, "v", string(r.res))
			case i < 8:
				require.Same(t, tc.err, r.err, "the leader's client: its error value")
			default:
				require.ErrorIs(t, r.err, tc.want)
				require.ErrorContains(t, r.err, "boom")
			}
		}
		require.Equal(t, int32(1), runs.Load(), tc.key)
		require.NoError(t, New(ms[1]).Check())
	}

	m := manager.NewBackendManager(&noStore{&memClient{b: newMemBucket(), id: "c", closing: make(chan struct{})}})
	ok := func(context.Context) ([]byte, error) { return nil, nil }
	_, _, err := New(m).Do(ctx, "x", ok)
	require.ErrorIs(t, err, manager.ErrNotSupported)
	require.ErrorIs(t, New(m).Check(), manager.ErrNotSupported)
	require.NoError(t, m.Close())
	_, _, err = New(m).Do(ctx, "x", ok)
	require.ErrorIs(t, err, manager.ErrClosed)
}

// noStore is a backend without a record store.
type noStore struct{ c *memClient }

func (n *noStore) ClientID() string { return n.c.ClientID() }
func (n *noStore) MaxNameLen() int  { return n.c.MaxNameLen() }
func (n *noStore) Acquire(ctx context.Context, name string, o manager.RequestOptions) (manager.BackendGrant, error) {
	return n.c.Acquire(ctx, name, o)
}
func (n *noStore) Query(ctx context.Context) (manager.Snapshot, error) { return n.c.Query(ctx) }
func (n *noStore) Close() error                                        { return n.c.Close() }
