package manager_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

func TestStatsCountsRequests(t *testing.T) {
	path := tablePath(t)
	opts := *smallTable
	opts.Stats = true
	m := openM(t, path, &opts)
	other := openM(t, path, nil)
	ctx := ctxT(t, eventually)

	// Granted at once: exclusive (fast path) twice, shared once (Request).
	for range 2 {
		l, err := m.Acquire(ctx, "a", RequestOptions{})
		require.NoError(t, err)
		require.NoError(t, l.Release())
	}
	require.NoError(t, m.Request(ctx, "a", RequestOptions{Mode: Shared}, func(context.Context, *Lock) error { return nil }))

	// Not available, aborted and failed, on a name another agent holds.
	lo, err := other.Acquire(ctx, "b", RequestOptions{})
	require.NoError(t, err)
	_, err = m.Acquire(ctx, "b", RequestOptions{IfAvailable: true})
	require.ErrorIs(t, err, ErrNotAvailable)
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	_, err = m.Acquire(short, "b", RequestOptions{Mode: Shared})
	cancel()
	require.ErrorIs(t, err, ErrAborted)
	_, err = m.Acquire(ctx, "-b", RequestOptions{})
	require.ErrorIs(t, err, ErrNotSupported)

	// Granted after a wait of at least quietPeriod.
	ch := acquireAsync(ctx, m, "b", RequestOptions{})
	waitPending(t, other, "b", 1)
	start := time.Now()
	mustBlock(t, ch, "b while other holds it")
	require.NoError(t, lo.Release())
	l := mustGrant(t, ch, "b after other released it")
	waited := time.Since(start)
	require.NoError(t, l.Release())
	check(t, m)

	st, err := m.Stats()
	require.NoError(t, err)
	require.True(t, st.Enabled)
	want := [2][NumOutcomes]uint64{}
	want[Exclusive][OutcomeGranted] = 3
	want[Exclusive][OutcomeNotAvailable] = 1
	want[Exclusive][OutcomeFailed] = 1
	want[Shared][OutcomeGranted] = 1
	want[Shared][OutcomeAborted] = 1
	require.Equal(t, want, st.Requests)

	ex := st.Wait[Exclusive]
	require.Equal(t, uint64(3), ex.Count, "one wait per granted request")
	require.Equal(t, uint64(1), st.Wait[Shared].Count)
	// The long wait is in a bucket whose bound is at least quietPeriod.
	long := 0
	for i, n := range ex.Counts {
		if n > 0 && (i == len(WaitBounds) || WaitBounds[i] >= quietPeriod) {
			long += int(n)
		}
	}
	require.Equal(t, 1, long, "buckets %v", ex.Counts)
	require.GreaterOrEqual(t, ex.Sum, quietPeriod)
	require.Less(t, ex.Sum, waited+eventually)

	require.Equal(t, 2, st.Usage.Agents)
	require.Equal(t, smallTable.MaxRequests, st.Geometry.MaxRequests)
	require.Zero(t, st.Steals)
	require.Zero(t, st.LocksLost)
}

func TestStatsClosed(t *testing.T) {
	m, err := Open(tablePath(t), &OpenOptions{Stats: true})
	require.NoError(t, err)
	require.NoError(t, m.Close())
	_, err = m.Stats()
	require.ErrorIs(t, err, ErrClosed)
}
