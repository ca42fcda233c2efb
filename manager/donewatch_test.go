package manager

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/table"
)

// TestDoneWatchWakesSharedContext: parked requests that share one context
// (registered with one watch, they receive on their poke channel only) all
// return ErrAborted when it is cancelled, and the watch is gone after.
func TestDoneWatchWakesSharedContext(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	tctx := ctxT(t, 10*time.Second)
	held, err := m.Acquire(tctx, "n", RequestOptions{})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(tctx)
	defer cancel()
	m.waits.mu.Lock()
	m.dw.lastDone = ctx.Done() // as if a park with ctx came before: every park below registers
	m.waits.mu.Unlock()
	const n = 4
	errs := make(chan error, n)
	for range n {
		go func() {
			errs <- m.Request(ctx, "n", RequestOptions{}, func(context.Context, *Lock) error {
				t.Error("granted while the lock is held")
				return nil
			})
		}()
	}
	require.Eventually(t, func() bool {
		parked, watched := ParkedCount(m)
		return parked == n && watched == n
	}, 5*time.Second, time.Millisecond, "every request parks registered")
	m.waits.mu.Lock()
	nd := len(m.dw.dones)
	m.waits.mu.Unlock()
	require.Equal(t, 1, nd, "one watch for the shared Done channel")

	cancel()
	timeout := time.After(5 * time.Second)
	for range n {
		select {
		case err := <-errs:
			require.ErrorIs(t, err, ErrAborted)
		case <-timeout:
			require.NoError(t, held.Release()) // let the parked requests go before the test ends
			t.Fatal("a parked request was not woken by its context")
		}
	}
	m.waits.mu.Lock()
	nd, ni := len(m.dw.dones), m.dw.nidle
	m.waits.mu.Unlock()
	require.Zero(t, nd, "the fired watch is dropped")
	require.Zero(t, ni)
	require.NoError(t, held.Release())
	check(t, m)
}

// TestDoneWatchIdleBound: registrations whose parks are over stay idle for
// the next park with the same Done channel, at most maxIdleDones of them
// (the oldest stopped first), and Close stops the rest: no context stays
// referenced by a watch that nobody stops.
func TestDoneWatchIdleBound(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	park := func(ctx context.Context, slot uint32) (*waiter, bool) {
		w := &waiter{ref: table.Ref{Slot: slot, Serial: 1}, name: "n", ch: make(chan struct{}, 1)}
		m.addWaiter(w)
		return w, m.watchDone(ctx, ctx.Done(), w)
	}
	leave := func(w *waiter) {
		m.removeWaiter(w)
		m.unwatchDone(w)
	}
	var ctxs []context.Context
	var watches []*doneWatch
	func() {
		m.waits.mu.Lock()
		defer m.waits.mu.Unlock() // also when an assertion fails: Close takes it
		for i := range 3 * maxIdleDones {
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			ctxs = append(ctxs, ctx)
			w, ok := park(ctx, uint32(2*i))
			require.False(t, ok, "a Done channel seen for the first time is selected on")
			leave(w)
			w, ok = park(ctx, uint32(2*i+1))
			require.True(t, ok, "seen twice in a row: registered")
			watches = append(watches, w.dw)
			leave(w)
			require.Nil(t, w.dw)
			require.LessOrEqual(t, m.dw.nidle, maxIdleDones)
			require.Len(t, m.dw.dones, m.dw.nidle, "every registration is idle")
		}
		require.Equal(t, maxIdleDones, m.dw.nidle)
		// The oldest idle ones were stopped: their contexts no longer fire them.
		for i, dw := range watches {
			_, kept := m.dw.dones[dw.done]
			require.Equal(t, i >= len(watches)-maxIdleDones, kept, "watch %d", i)
		}
		// An idle watch is reused by the next park with its channel.
		last := ctxs[len(ctxs)-1]
		w, ok := park(last, 100)
		require.True(t, ok)
		require.Same(t, watches[len(watches)-1], w.dw)
		require.Equal(t, maxIdleDones-1, m.dw.nidle)
		leave(w)
	}()

	require.NoError(t, m.Close())
	m.waits.mu.Lock()
	nd, ni := len(m.dw.dones), m.dw.nidle
	m.waits.mu.Unlock()
	require.Zero(t, nd, "Close stops every watch")
	require.Zero(t, ni)
	for _, dw := range watches {
		require.False(t, dw.stop(), "stopped already")
	}
}
