package manager_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

// Close, cancellation and release racing with grants: nothing held is
// lost and no grant leaks, whichever side wins.

func TestCloseReleasesAndAborts(t *testing.T) {
	path := tablePath(t)
	m1 := openM(t, path, nil)
	m2 := openM(t, path, nil)
	ctx := ctxT(t, eventually)
	l, err := m1.Acquire(ctx, "c", RequestOptions{})
	require.NoError(t, err)
	other, err := m2.Acquire(ctx, "d", RequestOptions{})
	require.NoError(t, err)
	w1 := acquireAsync(ctx, m1, "d", RequestOptions{})
	w2 := acquireAsync(ctx, m2, "c", RequestOptions{})
	waitPending(t, m2, "c", 1)
	waitPending(t, m2, "d", 1)
	require.NoError(t, m1.Close())
	r := <-w1
	require.ErrorIs(t, r.Err, ErrClosed)
	select {
	case <-l.Lost():
	default:
		t.Fatal("Close did not close Lost")
	}
	require.Error(t, l.Release())
	mustGrant(t, w2, "waiter granted when the holder's Manager closed").Release()
	require.NoError(t, m1.Close(), "second Close")
	_, err = m1.Query(ctx)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, m1.Request(ctx, "x", RequestOptions{}, nil), ErrClosed)
	require.NoError(t, other.Release())
	snap, err := m2.Query(ctx)
	require.NoError(t, err)
	require.Empty(t, snap.Held)
	require.Empty(t, snap.Pending)
	check(t, m2)
}

// Close while goroutines of the same Manager take and give back idle names
// by the fast path, which claims no slot and is not counted in flight:
// whatever each acquire returns, when Close returns no hold of the closed
// agent is left in the table (every name is free for another Manager), and
// the table passes the checker, quiescent orphans included.
func TestCloseRacingFastAcquires(t *testing.T) {
	path := tablePath(t)
	other := openM(t, path, nil)
	ctx := ctxT(t, eventually)
	names := []string{"f0", "f1", "f2", "f3"}
	rounds := 40
	if testing.Short() || raceEnabled {
		rounds = 15
	}
	for round := 0; round < rounds; round++ {
		m, err := Open(path, smallTable)
		require.NoError(t, err)
		for _, n := range names { // make the names idle entries: the fast path applies
			l, err := m.Acquire(ctx, n, RequestOptions{})
			require.NoError(t, err)
			require.NoError(t, l.Release())
		}
		var wg sync.WaitGroup
		var granted atomic.Int64
		for g := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					l, err := m.Acquire(ctx, names[g], RequestOptions{})
					if err != nil {
						if !errors.Is(err, ErrClosed) {
							t.Errorf("Acquire: %v", err)
						}
						return
					}
					granted.Add(1)
					if err := l.Release(); err != nil && !errors.Is(err, ErrClosed) {
						t.Errorf("Release: %v", err)
						return
					}
				}
			}()
		}
		for granted.Load() < int64(10*(round%4+1)) {
			if ctx.Err() != nil {
				t.Fatalf("round %d: no progress before the deadline", round)
			}
			runtime.Gosched()
		}
		require.NoError(t, m.Close())
		wg.Wait()
		require.NoError(t, other.Table().Check(nil), "round %d", round)
		for _, n := range names {
			l, err := other.Acquire(ctx, n, RequestOptions{IfAvailable: true})
			require.NoError(t, err, "round %d: %s is left held after Close", round, n)
			require.NoError(t, l.Release())
		}
	}
}

// Hard case 11: a request cancelled at the moment it is granted is either
// granted (and released by the caller) or not, never both, never leaked.
func TestCancelRacingGrant(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	rounds := 300
	if testing.Short() {
		rounds = 100
	}
	granted, aborted := 0, 0
	for i := 0; i < rounds; i++ {
		h, err := m.Acquire(context.Background(), "race", RequestOptions{})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), eventually) // cancelled below; the deadline only bounds the test
		ch := acquireAsync(ctx, m, "race", RequestOptions{})
		waitWaiting(t, m, 1)
		var r result
		switch i % 3 {
		case 0: // the grant is seen before the cancellation: granted
			require.NoError(t, h.Release())
			r = <-ch
			require.NoError(t, r.Err)
			cancel()
		case 1: // the cancellation first, then the release: aborted (a racing grant is passed on)
			cancel()
			require.NoError(t, h.Release())
		default: // both at once
			start := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); <-start; h.Release() }()
			go func() { defer wg.Done(); <-start; cancel() }()
			close(start)
			wg.Wait()
		}
		if r.Lock == nil && r.Err == nil {
			r = <-ch
		}
		if i%3 == 1 {
			require.ErrorIs(t, r.Err, ErrAborted)
		}
		if r.Err == nil {
			granted++
			require.NoError(t, r.Lock.Release())
		} else {
			aborted++
			require.ErrorIs(t, r.Err, ErrAborted)
		}
		waitWaiting(t, m, 0)
		for m.Table().Usage().Held != 0 {
			runtime.Gosched()
		}
		check(t, m)
	}
	t.Logf("%d granted, %d aborted", granted, aborted)
	require.NotZero(t, granted)
	require.NotZero(t, aborted)
	require.Equal(t, 0, m.Table().Usage().Slots)
}

// waitWaiting waits (bounded) until the table shows n waiting requests.
func waitWaiting(t testing.TB, m *Manager, n int) {
	deadline := time.Now().Add(eventually)
	for m.Table().Usage().Waiting != n {
		require.True(t, time.Now().Before(deadline))
		runtime.Gosched()
	}
}

// Releases racing with Close: each returns nil or ErrClosed, none faults,
// and the table is consistent and empty afterwards (Close leaves the mapping
// in place until the Manager is garbage, so a racing Release reads valid
// memory and finds its slot already freed).
func TestReleaseRacingClose(t *testing.T) {
	path := tablePath(t)
	other := openM(t, path, nil)
	for round := 0; round < 20; round++ {
		m, err := Open(path, smallTable)
		require.NoError(t, err)
		var locks []*Lock
		for i := 0; i < 16; i++ {
			l, err := m.Acquire(context.Background(), fmt.Sprint("rc", i), RequestOptions{})
			require.NoError(t, err)
			locks = append(locks, l)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, l := range locks {
			wg.Add(1)
			go func(l *Lock) {
				defer wg.Done()
				<-start
				if err := l.Release(); err != nil {
					require.ErrorIs(t, err, ErrClosed)
				}
			}(l)
		}
		close(start)
		require.NoError(t, m.Close())
		wg.Wait()
		snap, err := other.Query(context.Background())
		require.NoError(t, err)
		require.Empty(t, snap.Held)
		check(t, other)
	}
}

// TestCloseLeavesNoParkedCount: Close waits for its parked requests to take
// themselves off its agent's parked count before it frees the agent record,
// even when they are slow to (a 20 ms pause in that path, closedParkHook).
// A decrement after that would land in the record of the next Manager to
// register there (here the next one opened by this process, which starts
// its search at the same record), whose count would then read one low: a
// grant to its parked request would skip the doorbell, and the request
// would wait for the periodic scan.
func TestCloseLeavesNoParkedCount(t *testing.T) {
	pause := func() { time.Sleep(20 * time.Millisecond) } // widens the race; Close must wait it out
	ClosedParkHook.Store(&pause)
	t.Cleanup(func() { ClosedParkHook.Store(nil) })
	path := tablePath(t)
	m0 := openM(t, path, nil)
	ctx := ctxT(t, eventually)
	held, err := m0.Acquire(ctx, "n", RequestOptions{})
	require.NoError(t, err)
	for round := range 3 {
		m1 := openM(t, path, nil)
		const n = 32
		res := make([]<-chan result, n)
		for i := range res {
			res[i] = acquireAsync(ctx, m1, "n", RequestOptions{})
		}
		require.Eventually(t, func() bool {
			parked, _ := ParkedCount(m1)
			return parked == n
		}, eventually, time.Millisecond, "round %d: every request parks", round)
		idx := m1.Agent().Idx
		require.NoError(t, m1.Close())
		m2 := openM(t, path, nil) // registers at m1's record if it is free
		for _, ch := range res {
			select {
			case r := <-ch:
				require.ErrorIs(t, r.Err, ErrClosed)
			case <-ctx.Done():
				t.Fatal("a parked request did not return after Close")
			}
		}
		if m2.Agent().Idx == idx {
			require.Zero(t, atomic.LoadUint32(m2.Agent().Parked()), "round %d: the new Manager's parked count", round)
		}
		require.NoError(t, m2.Close())
	}
	require.NoError(t, held.Release())
	check(t, m0)
}
