package manager

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTurns: with HandOver, a release that grants a sleeping request of
// its own Manager yields the P (hand-over); while a goroutine of the
// Manager is in such a yield, every turnBatch-th release yields too
// (turn-taking); neither happens without HandOver, on a crowded table or
// with SpinLimit < 0 (turns.go).
func TestTurns(t *testing.T) {
	on := func(o OpenOptions) *OpenOptions {
		o.MaxResources, o.MaxRequests, o.MaxAgents, o.MaxNameLen = 64, 256, 32, 64
		o.HandOver = true
		return &o
	}
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()

	// handOver makes a sleeping request of m wait behind a hold of m, then
	// releases the hold, and returns how many yields the release made.
	handOver := func(t *testing.T, m *Manager) int32 {
		var yields atomic.Int32
		m.turn.yieldHook = func() { yields.Add(1) }
		m.view.lastYield.Store(m.mono() + int64(time.Hour)) // no due yield (a bounded table's gives the P too): only hand-overs count
		l, err := m.Acquire(ctx, "n", RequestOptions{})
		require.NoError(t, err)
		done := acquireReleased(ctx, m, "n")
		// Parked, not spinning: only a sleeper is poked.
		deadline := time.Now().Add(eventually)
		for atomic.LoadUint32(m.life.a.Parked()) == 0 {
			require.True(t, time.Now().Before(deadline), "the second request never parked")
			runtime.Gosched()
		}
		require.NoError(t, l.Release())
		got := yields.Load()
		mustDone(t, ctx, done, "the sibling's request")
		check(t, m)
		return got
	}

	t.Run("hand-over", func(t *testing.T) {
		m := openM(t, tablePath(t), on(OpenOptions{}))
		require.EqualValues(t, 1, handOver(t, m))
	})
	t.Run("off by default", func(t *testing.T) {
		m := openM(t, tablePath(t), nil)
		require.Zero(t, handOver(t, m))
		m.turn.yielding.Store(1) // as if a sibling sat in a hand-over yield
		var yields atomic.Int32
		m.turn.yieldHook = func() { yields.Add(1) }
		for range 2 * turnBatch {
			l, err := m.Acquire(ctx, "n", RequestOptions{})
			require.NoError(t, err)
			require.NoError(t, l.Release())
		}
		require.Zero(t, yields.Load())
	})
	t.Run("crowded", func(t *testing.T) {
		path := tablePath(t)
		m := openM(t, path, on(OpenOptions{}))
		for range int(m.view.usable.Load()) {
			openM(t, path, nil) // more agents than m's usable CPUs
		}
		m.view.cpuAt.Store(0)
		m.refreshView(m.mono())
		require.Greater(t, m.view.agents.Load(), m.view.usable.Load())
		require.Zero(t, handOver(t, m))
	})
	t.Run("crowded, bounded", func(t *testing.T) {
		path := tablePath(t)
		o := OpenOptions{Fairness: Bounded(time.Hour)}
		o.MaxResources, o.MaxRequests, o.MaxAgents, o.MaxNameLen = 64, 256, 32, 64
		m := openM(t, path, &o)
		for range int(m.view.usable.Load()) {
			openM(t, path, nil)
		}
		m.view.cpuAt.Store(0)
		m.refreshView(m.mono())
		require.Greater(t, m.view.agents.Load(), m.view.usable.Load())
		require.EqualValues(t, 1, handOver(t, m), "a bounded table hands over, crowded or not")
	})
	t.Run("bounded: on without the option", func(t *testing.T) {
		o := OpenOptions{Fairness: Bounded(time.Hour)}
		o.MaxResources, o.MaxRequests, o.MaxAgents, o.MaxNameLen = 64, 256, 32, 64
		m := openM(t, tablePath(t), &o)
		require.EqualValues(t, 1, handOver(t, m))
	})
	t.Run("spin off", func(t *testing.T) {
		m := openM(t, tablePath(t), on(OpenOptions{SpinLimit: -1}))
		require.Zero(t, handOver(t, m))
	})
	t.Run("turn-taking", func(t *testing.T) { turnTaking(t, openM(t, tablePath(t), on(OpenOptions{})), turnBatch) })
	t.Run("turn-taking, bounded", func(t *testing.T) {
		o := OpenOptions{Fairness: Bounded(time.Hour)}
		o.MaxResources, o.MaxRequests, o.MaxAgents, o.MaxNameLen = 64, 256, 32, 64
		turnTaking(t, openM(t, tablePath(t), &o), turnBatchBounded)
	})
}

// turnTaking checks that, while a sibling sits in a hand-over yield, every
// batch-th release of m yields, and that none does otherwise.
func turnTaking(t *testing.T, m *Manager, batch int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()
	var yields atomic.Int32
	m.turn.yieldHook = func() { yields.Add(1) }
	loop := func(n int) {
		for range n {
			l, err := m.Acquire(ctx, "n", RequestOptions{})
			require.NoError(t, err)
			require.NoError(t, l.Release())
		}
	}
	loop(3 * batch)
	require.Zero(t, yields.Load(), "no sibling in a yield: no turn-taking")
	m.turn.yielding.Store(1) // a sibling sits in a hand-over yield
	loop(2*batch - 1)
	require.EqualValues(t, 1, yields.Load(), "one yield every %d releases", batch)
	loop(1)
	require.EqualValues(t, 2, yields.Load(), "one yield every %d releases", batch)
	m.turn.yielding.Store(0)
	loop(2 * batch)
	require.EqualValues(t, 2, yields.Load())
	check(t, m)
}
