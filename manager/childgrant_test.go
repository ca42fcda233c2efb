package manager_test

import (
	"context"
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
