package manager_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

// A Manager's deadlock rounds run only while one of its requests is parked:
// they stop themselves once nothing is parked, and the next park starts them
// again (parkChecked). A request is checked DeadlockDelay after it parked at
// the earliest, also right after the rounds restart. Three cycles in a row
// between this process and a child; this process's request starts waiting
// last, so it is the victim each time, found by this Manager's rounds.
func TestDeadlockRoundsStopAndRestart(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, dlOpts(testDeadlockDelay))
	b := spawn(t, path, dlOpts(testDeadlockDelay))
	for round := 0; round < 3; round++ {
		requireRoundsStopped(t, m)
		epoch := RoundsEpoch(m)
		b.Drop()
		ctx := ctxT(t, eventually)
		holding, goOn, res := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		var elapsed time.Duration
		go func() {
			res <- m.Request(ctx, "x", RequestOptions{}, func(ctx context.Context, _ *Lock) error {
				close(holding)
				select {
				case <-goOn:
				case <-ctx.Done():
					return ctx.Err()
				}
				start := time.Now()
				l, err := m.Acquire(ctx, "y", RequestOptions{})
				elapsed = time.Since(start)
				if err != nil {
					return err
				}
				return l.Release()
			})
		}()
		select {
		case <-holding:
		case <-ctx.Done():
			t.Fatalf("round %d: x not granted: %v", round, ctx.Err())
		}
		b.Send("nest y x")
		b.Expect("acquired y")
		b.Send("gonest y")
		waitPending(t, m, "x", 1) // the child waits for x before we wait for y
		close(goOn)
		var err error
		select {
		case err = <-res:
		case <-ctx.Done():
			t.Fatalf("round %d: the cycle was not broken: %v", round, ctx.Err())
		}
		require.ErrorIs(t, err, ErrDeadlock, "round %d: the request that waited last is the victim", round)
		require.GreaterOrEqual(t, elapsed, testDeadlockDelay, "round %d: checked before DeadlockDelay", round)
		b.Expect("acquired x")
		b.Expect("done y")
		require.Empty(t, b.Lines("deadlock"), "round %d", round)
		require.Greater(t, RoundsEpoch(m), epoch, "round %d: rounds ran", round)
		t.Logf("round %d: victim after %v (delay %v)", round, elapsed, testDeadlockDelay)
		check(t, m)
	}
	requireRoundsStopped(t, m)
}

// requireRoundsStopped waits (bounded) until m has no parked request and no
// round scheduled.
func requireRoundsStopped(t *testing.T, m *Manager) {
	t.Helper()
	require.Eventually(t, func() bool { return RoundsStopped(m) }, eventually, time.Millisecond, "the rounds did not stop with nothing parked")
}
