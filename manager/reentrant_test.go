package manager_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

// heldCount is the number of held locks on name in the table.
func heldCount(t *testing.T, m *Manager, name string) int {
	t.Helper()
	s, err := m.Query(context.Background())
	require.NoError(t, err)
	n := 0
	for _, h := range s.Held {
		if h.Name == name {
			n++
		}
	}
	return n
}

// A request through WithLock on the held name is a child grant: same
// token, counted, nothing in the table; a request through a ctx that
// carries the child is a child of the child; once the outer grant is
// released, the ctx carries nothing.
func TestReentrantWithLock(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	outer, err := m.Acquire(ctx, "x", RequestOptions{})
	require.NoError(t, err)
	lctx := WithLock(ctx, outer)
	child, err := m.Acquire(lctx, "x", RequestOptions{IfAvailable: true})
	require.NoError(t, err, "a covered IfAvailable request with no other child held is available")
	require.Equal(t, outer.Token(), child.Token())
	require.Equal(t, "x", child.Name())
	require.Equal(t, 1, outer.Reentries())
	_, err = m.Acquire(lctx, "x", RequestOptions{Mode: Shared, IfAvailable: true})
	require.ErrorIs(t, err, ErrNotAvailable, "a sibling of an exclusive child waits for it")
	cctx := WithLock(ctx, child)
	shared, err := m.Acquire(cctx, "x", RequestOptions{Mode: Shared})
	require.NoError(t, err, "exclusive covers shared")
	require.Equal(t, Shared, shared.Mode())
	avail, err := m.Acquire(cctx, "x", RequestOptions{Mode: Shared, IfAvailable: true})
	require.NoError(t, err, "shared children together")
	require.Equal(t, 2, child.Reentries())
	require.Equal(t, 1, outer.Reentries(), "a child's children are the child's")
	require.Equal(t, 1, heldCount(t, m, "x"), "children hold nothing in the table")
	require.NoError(t, avail.Release())
	require.ErrorIs(t, avail.Release(), ErrReleased)
	require.NoError(t, shared.Release())
	require.Zero(t, child.Reentries())
	check(t, m)

	require.NoError(t, child.Release())
	require.NoError(t, outer.Release())
	require.ErrorIs(t, child.Release(), ErrReleased)
	l, err := m.Acquire(ctx, "x", RequestOptions{IfAvailable: true})
	require.NoError(t, err)
	// The old ctx carries a released grant: it changes nothing now.
	blocked := acquireAsync(WithLock(ctxT(t, quietPeriod), outer), m, "x", RequestOptions{})
	r := <-blocked
	require.ErrorIs(t, r.Err, ErrAborted, "a released carried grant is not re-entered")
	require.NoError(t, l.Release())
	check(t, m)
}

// Shared carried, exclusive asked: ErrWouldDeadlock at once (IfAvailable too).
func TestReentrantUpgrade(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	outer, err := m.Acquire(ctx, "x", RequestOptions{Mode: Shared})
	require.NoError(t, err)
	lctx := WithLock(ctx, outer)
	for _, o := range []RequestOptions{{}, {IfAvailable: true}} {
		_, err = m.Acquire(lctx, "x", o)
		require.ErrorIs(t, err, ErrWouldDeadlock)
		require.NotErrorIs(t, err, ErrAborted, "at once, not at the deadline")
		require.ErrorContains(t, err, `"x"`)
	}
	err = m.Request(lctx, "x", RequestOptions{}, func(context.Context, *Lock) error { panic("must not run") })
	require.ErrorIs(t, err, ErrWouldDeadlock)
	child, err := m.Acquire(lctx, "x", RequestOptions{Mode: Shared})
	require.NoError(t, err)
	require.NoError(t, child.Release())
	require.NoError(t, outer.Release())
	check(t, m)
}

// The ctx of Request's fn carries its lock: a helper called with it that
// requests the same lock does not deadlock; fn's ctx of a nested Request is
// cancelled when the outer grant is stolen, and Request reports ErrStolen.
func TestReentrantRequestCtx(t *testing.T) {
	path := tablePath(t)
	m, thief := openM(t, path, nil), openM(t, path, nil)
	ctx := ctxT(t, eventually)
	helper := func(ctx context.Context) (uint64, error) {
		l, err := m.Acquire(ctx, "x", RequestOptions{})
		if err != nil {
			return 0, err
		}
		defer l.Release()
		return l.Token(), nil
	}
	err := m.Request(ctx, "x", RequestOptions{}, func(ctx context.Context, l *Lock) error {
		tok, err := helper(ctx)
		require.NoError(t, err)
		require.Equal(t, l.Token(), tok)
		return m.Request(ctx, "x", RequestOptions{}, func(ctx2 context.Context, l2 *Lock) error {
			require.Equal(t, l.Token(), l2.Token())
			tok, err := helper(ctx2) // the nested ctx carries it too
			require.NoError(t, err)
			require.Equal(t, l.Token(), tok)
			stolen, err := thief.Acquire(ctx, "x", RequestOptions{Steal: true})
			require.NoError(t, err)
			defer stolen.Release()
			select {
			case <-ctx2.Done():
			case <-time.After(eventually):
				t.Fatal("the nested fn's ctx was not cancelled by the steal")
			}
			return nil
		})
	})
	require.ErrorIs(t, err, ErrStolen)
	check(t, m)
}

// Steal through a ctx that carries the grant steals from it.
func TestReentrantSteal(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	outer, err := m.Acquire(ctx, "x", RequestOptions{})
	require.NoError(t, err)
	lost := outer.Lost()
	s, err := m.Acquire(WithLock(ctx, outer), "x", RequestOptions{Steal: true})
	require.NoError(t, err)
	require.Greater(t, s.Token(), outer.Token())
	select {
	case <-lost:
	case <-time.After(eventually):
		t.Fatal("the carried grant was not stolen")
	}
	require.ErrorIs(t, outer.Release(), ErrStolen)
	require.NoError(t, s.Release())
	check(t, m)
}

// Another Manager's lock in ctx, or another name, changes nothing.
func TestReentrantOnlySameManagerAndName(t *testing.T) {
	path := tablePath(t)
	m, m2 := openM(t, path, nil), openM(t, path, nil)
	ctx := ctxT(t, eventually)
	outer, err := m.Acquire(ctx, "x", RequestOptions{})
	require.NoError(t, err)
	lctx := WithLock(ctx, outer)
	_, err = m2.Acquire(lctx, "x", RequestOptions{IfAvailable: true})
	require.ErrorIs(t, err, ErrNotAvailable, "m2 is another agent: no reentrancy")
	y, err := m.Acquire(lctx, "y", RequestOptions{})
	require.NoError(t, err)
	require.Zero(t, outer.Reentries())
	require.Equal(t, 1, heldCount(t, m, "y"))
	require.NoError(t, y.Release())
	require.NoError(t, outer.Release())
	require.Equal(t, WithLock(ctx, nil), ctx)
	check(t, m)
}

// A released child's Release after Close of its Manager reports ErrClosed.
func TestReentrantClose(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	outer, err := m.Acquire(ctx, "x", RequestOptions{})
	require.NoError(t, err)
	outer.Lost() // registered: Close marks it closed
	child, err := m.Acquire(WithLock(ctx, outer), "x", RequestOptions{})
	require.NoError(t, err)
	require.NoError(t, m.Close())
	require.True(t, errors.Is(child.Release(), ErrClosed))
}

// Processes: a helper in Q that re-requests its caller's lock does not
// deadlock, an upgrade fails at once, and once Q releases the outer grant P
// gets the lock at once: the children kept nothing.
//
//	Q: reenter x exclusive     -> outer, child, nested shared: one token; a
//	                              second exclusive child: not available
//	Q: reenter y shared        -> upgrade: ErrWouldDeadlock
//	P: acquire x               -> blocks
//	Q: releaseouter x          -> P granted
//	Q: releasechild x          -> ErrStolen (lost with the outer grant)
func TestReentrantProcesses(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	q := spawn(t, path, nil)
	q.Send("reenter x exclusive")
	f := parseFields(q.Expect("reentered x"))
	require.Equal(t, f["outer"], f["child"])
	require.Equal(t, f["outer"], f["nested"])
	require.Equal(t, "1", f["reentries"])
	require.Equal(t, "notavailable", f["upgrade"], "a second exclusive child while one is held")
	q.Send("reenter y shared")
	f = parseFields(q.Expect("reentered y"))
	require.Equal(t, "wouldDeadlock", f["upgrade"])
	s := q.query()
	require.Len(t, s.Held, 2, "one grant per name in the table: %+v", s.Held)
	ctx := ctxT(t, eventually)
	p := acquireAsync(ctx, m, "x", RequestOptions{})
	mustBlock(t, p, "P while Q holds x")
	q.Send("releaseouter x")
	require.Equal(t, "none", parseFields(q.Expect("outerreleased x"))["errkind"])
	l := mustGrant(t, p, "P after Q's outer release")
	q.Send("releasechild x")
	require.Equal(t, "stolen", parseFields(q.Expect("childreleased x"))["errkind"])
	require.NoError(t, l.Release())
	check(t, m)
}

func parseFields(line string) map[string]string {
	out := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			out[k] = v
		}
	}
	return out
}
