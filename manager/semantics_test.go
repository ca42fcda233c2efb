package manager_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

func TestExclusiveBasic(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	l, err := m.Acquire(ctx, "a", RequestOptions{})
	require.NoError(t, err)
	require.Equal(t, "a", l.Name())
	require.Equal(t, Exclusive, l.Mode())
	check(t, m)
	ch := acquireAsync(ctx, m, "a", RequestOptions{})
	mustBlock(t, ch, "second exclusive")
	check(t, m)
	require.NoError(t, l.Release())
	l2 := mustGrant(t, ch, "second exclusive after release")
	require.Greater(t, l2.Token(), l.Token())
	check(t, m)
	require.NoError(t, l2.Release())
	require.ErrorIs(t, l2.Release(), ErrReleased)
	check(t, m)
	u := m.Table().Usage()
	require.Equal(t, 0, u.Entries, "a name whose last holder left frees its entry")
}

func TestSharedAfterQueuedExclusive(t *testing.T) {
	// Hard case 1: holders S, queue [X, S2]: S2 waits for X.
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	s1, err := m.Acquire(ctx, "r", RequestOptions{Mode: Shared})
	require.NoError(t, err)
	s1b, err := m.Acquire(ctx, "r", RequestOptions{Mode: Shared})
	require.NoError(t, err, "shared run granted together")
	x := acquireAsync(ctx, m, "r", RequestOptions{})
	waitPending(t, m, "r", 1)
	s2 := acquireAsync(ctx, m, "r", RequestOptions{Mode: Shared})
	waitPending(t, m, "r", 2)
	check(t, m)
	mustBlock(t, s2, "shared behind queued exclusive")
	require.NoError(t, s1.Release())
	mustBlock(t, x, "exclusive while a shared holder remains")
	require.NoError(t, s1b.Release())
	xl := mustGrant(t, x, "exclusive")
	mustBlock(t, s2, "shared while exclusive held")
	check(t, m)
	require.NoError(t, xl.Release())
	mustGrant(t, s2, "shared after exclusive").Release()
	check(t, m)
}

func TestAbortHeadLetsSharedIn(t *testing.T) {
	// Hard case 2: abort of the queue head behind shared holders lets the shared requests behind it in.
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	s1, err := m.Acquire(ctx, "r", RequestOptions{Mode: Shared})
	require.NoError(t, err)
	xctx, cancel := context.WithCancel(ctx)
	x := acquireAsync(xctx, m, "r", RequestOptions{})
	waitPending(t, m, "r", 1)
	s2 := acquireAsync(ctx, m, "r", RequestOptions{Mode: Shared})
	s3 := acquireAsync(ctx, m, "r", RequestOptions{Mode: Shared})
	waitPending(t, m, "r", 3)
	mustBlock(t, s2, "shared behind exclusive")
	cancel()
	r := <-x
	require.ErrorIs(t, r.Err, ErrAborted)
	require.ErrorIs(t, r.Err, context.Canceled)
	l2 := mustGrant(t, s2, "s2 after abort")
	l3 := mustGrant(t, s3, "s3 after abort")
	check(t, m)
	for _, l := range []*Lock{s1, l2, l3} {
		require.NoError(t, l.Release())
	}
	check(t, m)
}

func TestIfAvailableAndSteal(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	l, err := m.Acquire(ctx, "n", RequestOptions{})
	require.NoError(t, err)
	_, err = m.Acquire(ctx, "n", RequestOptions{IfAvailable: true})
	require.ErrorIs(t, err, ErrNotAvailable)
	ran := false
	require.NoError(t, m.Request(ctx, "n", RequestOptions{IfAvailable: true}, func(ctx context.Context, l *Lock) error {
		ran = true
		require.Nil(t, l)
		return nil
	}))
	require.True(t, ran)
	check(t, m)
	waiting := acquireAsync(ctx, m, "n", RequestOptions{})
	waitPending(t, m, "n", 1)
	st, err := m.Acquire(ctx, "n", RequestOptions{Steal: true})
	require.NoError(t, err)
	select {
	case <-l.Lost():
	case <-ctx.Done():
		t.Fatal("victim's Lost did not close")
	}
	require.ErrorIs(t, l.Release(), ErrStolen)
	require.Greater(t, st.Token(), l.Token())
	check(t, m)
	mustBlock(t, waiting, "queued request behind the stealer")
	require.NoError(t, st.Release())
	mustGrant(t, waiting, "queued after stealer").Release()
	check(t, m)
}

func TestValidation(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	_, err := m.Acquire(ctx, "-x", RequestOptions{})
	require.ErrorIs(t, err, ErrNotSupported)
	_, err = m.Acquire(ctx, string(make([]byte, 65)), RequestOptions{})
	require.ErrorIs(t, err, ErrNotSupported)
	l, err := m.Acquire(ctx, string(make([]byte, 64)), RequestOptions{})
	require.NoError(t, err)
	require.NoError(t, l.Release())
	_, err = m.Acquire(ctx, "x", RequestOptions{Steal: true, IfAvailable: true})
	require.ErrorIs(t, err, ErrNotSupported)
	_, err = m.Acquire(ctx, "x", RequestOptions{Steal: true, Mode: Shared})
	require.ErrorIs(t, err, ErrNotSupported)
	_, err = m.Acquire(ctx, "x", RequestOptions{Mode: 7})
	require.ErrorIs(t, err, ErrNotSupported)
	done, cancel := context.WithCancel(ctx)
	cancel()
	for _, o := range []RequestOptions{{}, {IfAvailable: true}, {Steal: true}, {Mode: Shared}} {
		_, err = m.Acquire(done, "free", o)
		require.ErrorIs(t, err, ErrAborted)
		require.True(t, errors.Is(err, context.Canceled))
	}
	require.NoError(t, m.Close())
	_, err = m.Acquire(ctx, "-x", RequestOptions{})
	require.ErrorIs(t, err, ErrClosed)
}
