package manager_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

// fn's ctx (fnctx.go): a context.Context like any other, done when its
// grant ends, carrying its grant to the requests made with it.

// fn's ctx obeys context.Context: not done during fn, done with a non-nil
// Err after Request returns (whether or not Done was asked for during fn),
// one Done channel, and contexts derived from it never panic.
func TestFnCtxObeysContext(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	parents := map[string]func() (context.Context, context.CancelFunc){
		"background":  func() (context.Context, context.CancelFunc) { return context.Background(), func() {} },
		"cancellable": func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
		"foreign":     newForeignCtx, // not a context package type: no shortcut

	}
	for name, mk := range parents {
		t.Run(name, func(t *testing.T) {
			for _, askDone := range []bool{false, true} {
				parent, cancel := mk()
				var kept context.Context
				var done <-chan struct{}
				require.NoError(t, m.Request(parent, "c", RequestOptions{}, func(c context.Context, l *Lock) error {
					kept = c
					require.NoError(t, c.Err())
					if askDone {
						done = c.Done()
						require.False(t, isClosed(done))
					}
					return nil
				}))
				if !askDone {
					done = kept.Done()
				}
				require.True(t, isClosed(done), "done after Request returned")
				require.Equal(t, done, kept.Done(), "one Done channel")
				require.ErrorIs(t, kept.Err(), context.Canceled)
				d, dcancel := context.WithTimeout(kept, time.Hour)
				select {
				case <-d.Done():
				case <-time.After(eventually):
					t.Fatal("a ctx derived from an ended fn ctx is not done")
				}
				require.ErrorIs(t, d.Err(), context.Canceled)
				dcancel()
				cancel()
			}
			// The parent's end reaches fn's ctx, with the parent's error.
			parent, cancel := mk()
			require.NoError(t, m.Request(parent, "c", RequestOptions{}, func(c context.Context, l *Lock) error {
				if parent.Done() == nil {
					return nil
				}
				cancel()
				select {
				case <-c.Done():
				case <-time.After(eventually):
					t.Fatal("fn's ctx not done after its parent was cancelled")
				}
				require.ErrorIs(t, c.Err(), context.Canceled)
				return nil
			}))
			cancel()
		})
	}
}

// foreignCtx is a cancellable context of a type the context package does
// not know.
type foreignCtx struct {
	context.Context
	done chan struct{}
	once sync.Once
	err  atomic.Pointer[error]
}

func newForeignCtx() (context.Context, context.CancelFunc) {
	f := &foreignCtx{Context: context.Background(), done: make(chan struct{})}
	return f, func() {
		f.once.Do(func() {
			err := context.Canceled
			f.err.Store(&err)
			close(f.done)
		})
	}
}

func (f *foreignCtx) Done() <-chan struct{} { return f.done }

func (f *foreignCtx) Err() error {
	if p := f.err.Load(); p != nil {
		return *p
	}
	return nil
}

// Contexts derived from fn's ctx, cancelled before or after Request returns,
// and fn's ctx watched by a goroutine as Request returns: Err is never nil
// once Done is closed (the context package panics with "missing cancel
// error" otherwise).
func TestFnCtxDerivedNeverPanics(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	var bad atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 2000; i++ {
		p := parent
		if i%2 == 1 {
			p = context.Background()
		}
		require.NoError(t, m.Request(p, "d", RequestOptions{}, func(c context.Context, l *Lock) error {
			d, dcancel := context.WithTimeout(c, time.Hour)
			if i%3 == 0 {
				dcancel()
			} else {
				wg.Add(1)
				go func() { // outlives fn: cancelled by the end of the grant
					defer wg.Done()
					<-d.Done()
					dcancel()
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-c.Done()
				if c.Err() == nil {
					bad.Add(1)
				}
			}()
			return nil
		}))
	}
	wg.Wait()
	require.Zero(t, bad.Load(), "fn's ctx was done with a nil Err")
}

// The documented nested Request (docs/coalesce.md): a request through fn's
// ctx is a child; through the child's fn ctx, a child of the child. With a
// Background and a cancellable parent.
func TestNestedRequestThroughFnCtx(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, parent := range []context.Context{context.Background(), cancellable} {
		for i := 0; i < 200; i++ {
			err := m.Request(parent, "n", RequestOptions{}, func(c1 context.Context, l1 *Lock) error {
				return m.Request(c1, "n", RequestOptions{}, func(c2 context.Context, l2 *Lock) error {
					require.Equal(t, l1.Token(), l2.Token())
					return m.Request(c2, "n", RequestOptions{Mode: Shared}, func(c3 context.Context, l3 *Lock) error {
						require.Equal(t, l1.Token(), l3.Token())
						require.Equal(t, 1, l1.Reentries())
						require.Equal(t, 1, l2.Reentries())
						if i == 0 {
							require.Equal(t, 1, heldCount(t, m, "n"), "children hold nothing in the table")
						}
						return nil
					})
				})
			})
			require.NoError(t, err)
		}
	}
	check(t, m)
}

// RequestAll's fn ctx carries its grants: a request on one of the names is
// a child; after RequestAll returns the ctx is done.
func TestRequestAllCtxCarriesItsGrants(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	var kept context.Context
	require.NoError(t, m.RequestAll(ctx, []string{"b", "a"}, RequestOptions{}, func(c context.Context, locks []*Lock) error {
		kept = c
		l, err := m.Acquire(c, "b", RequestOptions{IfAvailable: true})
		require.NoError(t, err)
		require.Equal(t, locks[1].Token(), l.Token())
		require.Equal(t, 1, locks[1].Reentries())
		return l.Release()
	}))
	require.Error(t, kept.Err())
	l, err := m.Acquire(context.WithoutCancel(kept), "b", RequestOptions{IfAvailable: true})
	require.NoError(t, err, "a grant of the table: the name is free")
	require.Zero(t, l.Reentries())
	require.NoError(t, l.Release())
}

// The Lock of Request's fn released by fn itself: the grant has ended, so
// fn's ctx is done and carries nothing from then on; Request returns fn's
// error.
func TestFnReleasesItsLock(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	boom := errors.New("boom")
	err := m.Request(ctx, "r", RequestOptions{}, func(c context.Context, l *Lock) error {
		done := c.Done()
		require.NoError(t, l.Release())
		require.True(t, isClosed(done), "fn's ctx is done once its grant ended")
		require.ErrorIs(t, c.Err(), context.Canceled)
		o, err := m.Acquire(context.WithoutCancel(c), "r", RequestOptions{IfAvailable: true})
		require.NoError(t, err)
		require.Greater(t, o.Token(), l.Token(), "a grant of the table, not a child of a released grant")
		require.NoError(t, o.Release())
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.NotErrorIs(t, err, ErrReleased)
}

// context.Cause of fn's ctx: the parent's cause when the parent ended it,
// else its own Err (never nil once done).
func TestFnCtxCause(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	boom := errors.New("boom")
	parent, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var kept context.Context
	require.NoError(t, m.Request(parent, "k", RequestOptions{}, func(c context.Context, l *Lock) error {
		kept = c
		require.NoError(t, context.Cause(c))
		return nil
	}))
	require.ErrorIs(t, context.Cause(kept), context.Canceled, "ended with its grant")
	require.NoError(t, m.Request(parent, "k", RequestOptions{}, func(c context.Context, l *Lock) error {
		cancel(boom)
		<-c.Done()
		require.ErrorIs(t, c.Err(), context.Canceled)
		require.ErrorIs(t, context.Cause(c), boom, "the parent's cause")
		return nil
	}))
}
