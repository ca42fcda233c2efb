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

// Child grants follow the lock's own rules (reentrant.go, fnctx.go).

// waitKids waits (bounded) until n child requests of p wait.
func waitKids(t testing.TB, p *Lock, n int) {
	t.Helper()
	for deadline := time.Now().Add(eventually); KidsWaiting(p) != n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d child requests waiting, want %d", KidsWaiting(p), n)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// A ctx (and a Lock) kept after its grant ended carries nothing: the next
// grant of the name, by the same goroutine, is a different object, and a
// request made with the kept ctx is a request like any other.
func TestChildStaleCtxCarriesNothing(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	var kept context.Context
	var keptL *Lock
	require.NoError(t, m.Request(ctx, "a", RequestOptions{}, func(c context.Context, l *Lock) error {
		kept, keptL = c, l
		return nil
	}))
	live := context.WithoutCancel(kept) // the kept ctx, without its cancellation
	for round := 0; round < 20; round++ {
		var tok uint64
		require.NoError(t, m.Request(ctx, "a", RequestOptions{}, func(c context.Context, l *Lock) error {
			tok = l.Token()
			require.NotSame(t, keptL, l, "a Lock serves one grant")
			_, err := m.Acquire(kept, "a", RequestOptions{IfAvailable: true})
			require.ErrorIs(t, err, ErrAborted, "the kept fn ctx is done")
			_, err = m.Acquire(live, "a", RequestOptions{IfAvailable: true})
			require.ErrorIs(t, err, ErrNotAvailable, "round %d: the kept ctx must not be a child of this grant", round)
			require.Empty(t, CarriedRefs(live), "no deadlock tag from an ended grant")
			require.Zero(t, l.Reentries())
			return nil
		}))
		require.Greater(t, tok, keptL.Token())
	}
	// It queues like any other request: behind a holder, granted after it.
	h, err := m.Acquire(ctx, "a", RequestOptions{})
	require.NoError(t, err)
	waitCtx, cancel := context.WithTimeout(live, eventually)
	defer cancel()
	q := acquireAsync(waitCtx, m, "a", RequestOptions{})
	mustBlock(t, q, "a request with a kept ctx while another grant holds the name")
	require.ErrorIs(t, keptL.Release(), ErrReleased, "the kept Lock touches nothing")
	require.Equal(t, 1, heldCount(t, m, "a"))
	require.NoError(t, h.Release())
	l := mustGrant(t, q, "the kept ctx's request after the holder released")
	require.Greater(t, l.Token(), h.Token(), "a grant of the table, not a child")
	require.NoError(t, l.Release())
	check(t, m)
}

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

// fn's ctx shared by goroutines (errgroup style): their exclusive child
// requests take the name one at a time, in arrival order.
func TestChildrenFanOutExclusive(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	require.NoError(t, m.Request(ctx, "x", RequestOptions{}, func(c context.Context, l *Lock) error {
		first, err := m.Acquire(c, "x", RequestOptions{})
		require.NoError(t, err)
		var inside atomic.Int32
		entered := make(chan int, 4)
		var gates [4]chan struct{}
		errs := make(chan error, 4)
		for i := range gates {
			gates[i] = make(chan struct{})
			go func() {
				errs <- m.Request(c, "x", RequestOptions{}, func(context.Context, *Lock) error {
					inside.Add(1)
					entered <- i
					<-gates[i]
					inside.Add(-1)
					return nil
				})
			}()
			waitKids(t, l, i+1) // they arrive in the order of i
		}
		require.Equal(t, 1, l.Reentries(), "the four wait for the held child")
		require.NoError(t, first.Release())
		for want := range gates {
			select {
			case i := <-entered:
				require.Equal(t, want, i, "children granted out of arrival order")
			case <-time.After(eventually):
				t.Fatalf("child %d not granted", want)
			}
			require.Equal(t, int32(1), inside.Load(), "two exclusive children at once")
			require.Equal(t, len(gates)-1-want, KidsWaiting(l))
			close(gates[want])
			require.NoError(t, <-errs)
		}
		return nil
	}))
	check(t, m)
}

// Exclusive and shared children of one exclusive grant: arrival order, a
// shared child never overtaking a waiting exclusive one, shared children
// together, IfAvailable only at once, an aborted waiter leaving the queue
// as if it had never come.
func TestChildrenModesAndOrder(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	g, err := m.Acquire(ctx, "y", RequestOptions{})
	require.NoError(t, err)
	gctx := WithLock(ctx, g)

	s1, err := m.Acquire(gctx, "y", RequestOptions{Mode: Shared})
	require.NoError(t, err)
	s2, err := m.Acquire(gctx, "y", RequestOptions{Mode: Shared, IfAvailable: true})
	require.NoError(t, err, "shared children together")
	_, err = m.Acquire(gctx, "y", RequestOptions{IfAvailable: true})
	require.ErrorIs(t, err, ErrNotAvailable, "exclusive while shared children are held")

	ex := acquireAsync(gctx, m, "y", RequestOptions{})
	waitKids(t, g, 1)
	_, err = m.Acquire(gctx, "y", RequestOptions{Mode: Shared, IfAvailable: true})
	require.ErrorIs(t, err, ErrNotAvailable, "a shared child must not overtake a waiting exclusive one")
	// An aborted exclusive waiter: the shared one behind it is granted at once.
	abortCtx, abort := context.WithCancel(gctx)
	ab := acquireAsync(abortCtx, m, "y", RequestOptions{})
	waitKids(t, g, 2)
	sh := acquireAsync(gctx, m, "y", RequestOptions{Mode: Shared})
	waitKids(t, g, 3)
	mustBlock(t, sh, "shared child behind a waiting exclusive one")

	require.NoError(t, s1.Release())
	require.NoError(t, s2.Release())
	e := mustGrant(t, ex, "exclusive child once the shared ones left")
	require.Equal(t, g.Token(), e.Token())
	mustBlock(t, sh, "shared child while an exclusive child is held")
	abort()
	r := <-ab
	require.ErrorIs(t, r.Err, ErrAborted)
	require.ErrorIs(t, r.Err, context.Canceled)
	mustBlock(t, sh, "shared child while an exclusive child is held")
	require.NoError(t, e.Release())
	s3 := mustGrant(t, sh, "shared child once the exclusive one left")
	require.Equal(t, 1, g.Reentries())
	require.Zero(t, KidsWaiting(g))

	// A shared waiter behind an exclusive waiter that aborts, while a
	// shared child is held: granted when the exclusive one leaves the queue.
	abortCtx, abort = context.WithCancel(gctx)
	ab = acquireAsync(abortCtx, m, "y", RequestOptions{})
	waitKids(t, g, 1)
	sh = acquireAsync(gctx, m, "y", RequestOptions{Mode: Shared})
	waitKids(t, g, 2)
	mustBlock(t, sh, "shared child behind a waiting exclusive one")
	abort()
	require.ErrorIs(t, (<-ab).Err, ErrAborted)
	s4 := mustGrant(t, sh, "shared child once the exclusive waiter aborted")
	require.Equal(t, 2, g.Reentries())
	require.NoError(t, s3.Release())
	require.NoError(t, s4.Release())
	require.NoError(t, g.Release())
	check(t, m)
}

// Releasing the parent first ends every child as a loss before the name can
// be granted to anyone else: the child's fn ctx is cancelled, its Lost and
// its own children's close, their Release reports ErrStolen; a child still
// waiting goes on as a request of the table.
func TestChildEndsBeforeParentRelease(t *testing.T) {
	path := tablePath(t)
	m, other := openM(t, path, nil), openM(t, path, nil)
	ctx := ctxT(t, eventually)
	outer, err := m.Acquire(ctx, "p", RequestOptions{})
	require.NoError(t, err)
	octx := WithLock(ctx, outer)

	type inside struct {
		ctx   context.Context
		l     *Lock
		grand *Lock
	}
	in := make(chan inside, 1)
	childRes := make(chan error, 1)
	go func() {
		childRes <- m.Request(octx, "p", RequestOptions{}, func(c context.Context, l *Lock) error {
			grand, err := m.Acquire(c, "p", RequestOptions{Mode: Shared})
			require.NoError(t, err)
			in <- inside{c, l, grand}
			<-c.Done()
			return nil
		})
	}()
	kid := <-in
	waiting := acquireAsync(octx, m, "p", RequestOptions{})
	waitKids(t, outer, 1)

	// Another agent waits for the name; when it is granted, the child must
	// already know it lost.
	knew := make(chan bool, 1)
	var ol *Lock
	go func() {
		l, err := other.Acquire(ctx, "p", RequestOptions{})
		if err != nil {
			knew <- false
			return
		}
		ol = l
		knew <- isClosed(kid.ctx.Done()) && isClosed(kid.l.Lost()) && isClosed(kid.grand.Lost())
	}()
	waitPending(t, m, "p", 1)

	require.NoError(t, outer.Release())
	// Release has returned: the children knew before it gave the name up.
	require.True(t, isClosed(kid.ctx.Done()), "the child's fn ctx is cancelled")
	require.ErrorIs(t, kid.ctx.Err(), context.Canceled)
	require.True(t, isClosed(kid.l.Lost()), "the child's Lost is closed")
	require.True(t, isClosed(kid.grand.Lost()), "the grandchild's Lost is closed")
	require.Zero(t, outer.Reentries())
	select {
	case ok := <-knew:
		require.True(t, ok, "another agent was granted the name before the child knew it was lost")
	case <-time.After(eventually):
		t.Fatal("the other agent was not granted")
	}
	require.ErrorIs(t, <-childRes, ErrStolen, "the child's Request reports the loss")
	require.ErrorIs(t, kid.grand.Release(), ErrStolen)
	// The waiting child went on as a request of the table: behind the other agent.
	mustBlock(t, waiting, "the waiting child, now a request of the table, while another agent holds the name")
	require.NoError(t, ol.Release())
	w := mustGrant(t, waiting, "the waiting child after the other agent released")
	require.Greater(t, w.Token(), ol.Token(), "its own grant of the table")
	require.NoError(t, w.Release())
	check(t, m)
}

// A child handle (Acquire through WithLock) of a grant that is stolen or
// closed: its Lost closes, its Release reports the loss.
func TestChildEndsWithParentLoss(t *testing.T) {
	path := tablePath(t)
	m, thief := openM(t, path, nil), openM(t, path, nil)
	ctx := ctxT(t, eventually)
	outer, err := m.Acquire(ctx, "s", RequestOptions{})
	require.NoError(t, err)
	kid, err := m.Acquire(WithLock(ctx, outer), "s", RequestOptions{})
	require.NoError(t, err)
	st, err := thief.Acquire(ctx, "s", RequestOptions{Steal: true})
	require.NoError(t, err)
	select {
	case <-kid.Lost():
	case <-time.After(eventually):
		t.Fatal("a child of a stolen grant is not lost")
	}
	require.ErrorIs(t, kid.Release(), ErrStolen)
	require.ErrorIs(t, outer.Release(), ErrStolen)
	require.NoError(t, st.Release())

	// Close ends the children first, with ErrClosed (no Lost asked for).
	outer, err = m.Acquire(ctx, "s", RequestOptions{})
	require.NoError(t, err)
	kid, err = m.Acquire(WithLock(ctx, outer), "s", RequestOptions{})
	require.NoError(t, err)
	require.NoError(t, m.Close())
	require.True(t, isClosed(kid.Lost()))
	require.ErrorIs(t, kid.Release(), ErrClosed)
}

// A ctx whose grant ended tags no hold for the deadlock detector: the
// stale ctx of a finished Request, its cancellation removed, waits for a
// name while the same goroutine's next grant (of another name) is held by
// a task that waits for nothing: no cycle, no ErrDeadlock.
func TestDeadlockNoTagFromEndedGrant(t *testing.T) {
	path := tablePath(t)
	m1, m2 := openM(t, path, dlOpts(testDeadlockDelay)), openM(t, path, dlOpts(testDeadlockDelay))
	ctx := ctxT(t, eventually)
	var kept context.Context
	require.NoError(t, m1.Request(ctx, "a", RequestOptions{}, func(c context.Context, l *Lock) error {
		kept = context.WithoutCancel(c)
		return nil
	}))
	cIn, cRes := make(chan struct{}), make(chan error, 1)
	staleRes := make(chan error, 1)
	require.NoError(t, m1.Request(ctx, "b", RequestOptions{}, func(context.Context, *Lock) error {
		// m2: a task that holds "c" and waits for "b".
		go func() {
			cRes <- m2.Request(ctx, "c", RequestOptions{}, func(c context.Context, l *Lock) error {
				close(cIn)
				l2, err := m2.Acquire(c, "b", RequestOptions{})
				if err == nil {
					err = l2.Release()
				}
				return err
			})
		}()
		<-cIn
		waitPending(t, m1, "b", 1)
		// The stale ctx waits for "c" for 20 deadlock delays.
		go func() {
			wctx, cancel := context.WithTimeout(kept, 20*testDeadlockDelay)
			defer cancel()
			l, err := m1.Acquire(wctx, "c", RequestOptions{})
			if err == nil {
				err = l.Release()
			}
			staleRes <- err
		}()
		err := <-staleRes
		require.ErrorIs(t, err, ErrAborted, "the stale ctx's request times out, it is no cycle's victim")
		require.NotErrorIs(t, err, ErrDeadlock)
		return nil
	}))
	require.NoError(t, <-cRes)
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
