package manager_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

// fakeBackend grants every request at once (no queue): enough to drive
// every path of the seam (the semantics are the conformance suite's, run on
// a real backend by the etcd module).
type fakeBackend struct {
	mu      sync.Mutex
	token   uint64
	grants  map[uint64]chan struct{} // live grants by token
	failRel error                    // the next Release fails with it
	closed  bool
}

func newFake() *fakeBackend { return &fakeBackend{grants: map[uint64]chan struct{}{}} }

func (f *fakeBackend) ClientID() string { return "fake" }
func (f *fakeBackend) MaxNameLen() int  { return 8 }

func (f *fakeBackend) Acquire(ctx context.Context, name string, opts RequestOptions) (BackendGrant, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if opts.IfAvailable && len(f.grants) > 0 {
		return BackendGrant{}, ErrNotAvailable
	}
	f.token++
	tok, lost := f.token, make(chan struct{})
	f.grants[tok] = lost
	return BackendGrant{Token: tok, Lost: lost, Release: func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if err := f.failRel; err != nil {
			f.failRel = nil
			return err
		}
		if _, ok := f.grants[tok]; !ok {
			return ErrStolen
		}
		delete(f.grants, tok)
		return nil
	}}, nil
}

// steal takes grant tok away, as a backend does when another client steals it.
func (f *fakeBackend) steal(tok uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.grants[tok])
	delete(f.grants, tok)
}

func (f *fakeBackend) Query(ctx context.Context) (Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := Snapshot{}
	for range f.grants {
		s.Held = append(s.Held, LockInfo{Name: "n", ClientID: "fake", PID: 1})
	}
	return s, nil
}

func (f *fakeBackend) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for tok, c := range f.grants {
		close(c)
		delete(f.grants, tok)
	}
	return nil
}

func TestBackendSeam(t *testing.T) {
	f := newFake()
	m := NewBackendManager(f)
	ctx := ctxT(t, eventually)
	require.Equal(t, "fake", m.ClientID())

	// Validation is the Manager's, with the backend's MaxNameLen.
	_, err := m.Acquire(ctx, "123456789", RequestOptions{})
	require.ErrorIs(t, err, ErrNotSupported)
	_, err = m.Acquire(ctx, "-x", RequestOptions{})
	require.ErrorIs(t, err, ErrNotSupported)

	// Release, then a second Release.
	l, err := m.Acquire(ctx, "a", RequestOptions{})
	require.NoError(t, err)
	require.Equal(t, uint64(1), l.Token())
	require.Equal(t, "a", l.Name())
	_, err = m.Acquire(ctx, "a", RequestOptions{IfAvailable: true})
	require.ErrorIs(t, err, ErrNotAvailable)
	require.NoError(t, l.Release())
	require.ErrorIs(t, l.Release(), ErrReleased)

	// A failed Release keeps the lock releasable.
	l, err = m.Acquire(ctx, "a", RequestOptions{})
	require.NoError(t, err)
	f.failRel = errors.New("unreachable")
	require.Error(t, l.Release())
	require.NoError(t, l.Release())

	// A stolen lock: Lost closes, Release says ErrStolen, then ErrStolen again.
	l, err = m.Acquire(ctx, "a", RequestOptions{})
	require.NoError(t, err)
	lost := l.Lost()
	f.steal(l.Token())
	<-lost
	require.ErrorIs(t, l.Release(), ErrStolen)
	require.ErrorIs(t, l.Release(), ErrStolen)

	// Request: fn's ctx is cancelled by the loss; Request reports ErrStolen.
	err = m.Request(ctx, "a", RequestOptions{}, func(fctx context.Context, l *Lock) error {
		require.NoError(t, fctx.Err())
		f.steal(l.Token())
		<-fctx.Done()
		require.ErrorIs(t, fctx.Err(), context.Canceled)
		return nil
	})
	require.ErrorIs(t, err, ErrStolen)
	ran := false
	held, err := m.Acquire(ctx, "a", RequestOptions{})
	require.NoError(t, err)
	require.NoError(t, m.Request(ctx, "a", RequestOptions{IfAvailable: true}, func(_ context.Context, l *Lock) error {
		ran = true
		require.Nil(t, l)
		return nil
	}))
	require.True(t, ran)

	s, err := m.Query(ctx)
	require.NoError(t, err)
	require.Len(t, s.Held, 1)
	require.NotNil(t, s.Pending, "never nil")
	require.NoError(t, m.Check())

	// Close: the backend closes Lost; Release says ErrClosed.
	lost = held.Lost()
	require.NoError(t, m.Close())
	require.True(t, f.closed)
	<-lost
	require.ErrorIs(t, held.Release(), ErrClosed)
	require.NoError(t, m.Close())
	_, err = m.Acquire(ctx, "a", RequestOptions{})
	require.ErrorIs(t, err, ErrClosed)
	_, err = m.Query(ctx)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, m.Check(), ErrClosed)
}

// The table-only capabilities say ErrNotSupported on a backend (they must
// not reach the nil table), ErrClosed once closed; AcquireAll and Locker
// are built on Acquire and work.
func TestBackendTableOnly(t *testing.T) {
	m := NewBackendManager(newFake())
	ctx := ctxT(t, eventually)
	calls := map[string]func() error{
		"WaitGraph":    func() error { _, err := m.WaitGraph(ctx); return err },
		"State":        func() error { _, err := m.State(ctx, "a"); return err },
		"WaitUnlocked": func() error { return m.WaitUnlocked(ctx, "a", Exclusive) },
		"Watch":        func() error { _, err := m.Watch(ctx, "a"); return err },
		"Stats":        func() error { _, err := m.Stats(); return err },
	}
	for op, call := range calls {
		err := call()
		require.ErrorIs(t, err, ErrNotSupported, op)
		require.ErrorContains(t, err, op, op)
	}
	locks, err := m.AcquireAll(ctx, []string{"b", "a"}, RequestOptions{})
	require.NoError(t, err)
	require.Equal(t, "a", locks[0].Name())
	require.NoError(t, ReleaseAll(locks))
	mu := m.Locker("a")
	mu.Lock()
	mu.Unlock()
	require.NoError(t, m.Close())
	for op, call := range calls {
		require.ErrorIs(t, call(), ErrClosed, op)
	}
}

// CarriedHolds gives a backend the grants of its own that a request's ctx
// carries (Request's fn ctx, AcquireAll's earlier names, WithLock), still
// held, and nothing of another backend; a request through fn's ctx on the
// same name is a child grant that never reaches the backend.
func TestBackendCarriedHolds(t *testing.T) {
	f, g := newFake(), newFake()
	m, other := NewBackendManager(f), NewBackendManager(g)
	ctx := ctxT(t, eventually)
	require.Empty(t, CarriedHolds(ctx, f))
	ol, err := other.Acquire(ctx, "o", RequestOptions{})
	require.NoError(t, err)
	err = m.Request(WithLock(ctx, ol), "a", RequestOptions{}, func(fctx context.Context, l *Lock) error {
		require.Equal(t, []BackendHold{{Name: "a", Token: l.Token()}}, CarriedHolds(fctx, f))
		require.Equal(t, []BackendHold{{Name: "o", Token: ol.Token()}}, CarriedHolds(fctx, g), "g's own grant only")
		before := f.token
		c, err := m.Acquire(fctx, "a", RequestOptions{Mode: Shared})
		require.NoError(t, err)
		require.Equal(t, l.Token(), c.Token())
		require.Equal(t, before, f.token, "a child grant reached the backend")
		require.NoError(t, c.Release())
		h, err := m.Acquire(ctx, "b", RequestOptions{})
		require.NoError(t, err)
		both := WithLock(fctx, h)
		require.ElementsMatch(t, []BackendHold{{Name: "a", Token: l.Token()}, {Name: "b", Token: h.Token()}}, CarriedHolds(both, f))
		require.NoError(t, h.Release())
		require.Equal(t, []BackendHold{{Name: "a", Token: l.Token()}}, CarriedHolds(both, f), "a released grant is not carried")
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, ol.Release())
}

// On a backend, as on the table, a child grant never outlives its parent:
// the parent's loss (the backend closes its Lost channel) ends the held
// child (its Lost closes, its Release says stolen), and so does the
// parent's Release; siblings exclude each other meanwhile.
func TestBackendChildEndsWithParent(t *testing.T) {
	f := newFake()
	m := NewBackendManager(f)
	ctx := ctxT(t, eventually)

	p, err := m.Acquire(ctx, "a", RequestOptions{})
	require.NoError(t, err)
	pctx := WithLock(ctx, p)
	kid, err := m.Acquire(pctx, "a", RequestOptions{})
	require.NoError(t, err)
	require.Equal(t, p.Token(), kid.Token(), "a child, not a backend grant")
	_, err = m.Acquire(pctx, "a", RequestOptions{IfAvailable: true})
	require.ErrorIs(t, err, ErrNotAvailable, "an exclusive sibling while a child holds")

	f.steal(p.Token())
	select {
	case <-kid.Lost():
	case <-ctx.Done():
		t.Fatal("the parent's loss did not end its child")
	}
	require.ErrorIs(t, kid.Release(), ErrStolen)
	require.ErrorIs(t, p.Release(), ErrStolen)

	// A Release of the parent ends a held child first.
	p, err = m.Acquire(ctx, "a", RequestOptions{})
	require.NoError(t, err)
	kid, err = m.Acquire(WithLock(ctx, p), "a", RequestOptions{})
	require.NoError(t, err)
	require.NoError(t, p.Release())
	select {
	case <-kid.Lost():
	default:
		t.Fatal("the parent's Release returned with its child still held")
	}
	require.ErrorIs(t, kid.Release(), ErrStolen)
	require.NoError(t, m.Close())
}
