package manager

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestYieldGate: a Manager whose OS yields come back late (lateMax of a
// window of yieldWindow) gives its P to its own goroutines instead for
// offFor, doubling while its yields stay late, and yields to the OS again
// once a window is mostly on time (yieldgate.go).
func TestYieldGate(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	calls := 0
	late := func() { calls++; time.Sleep(lateYield + lateYield/4) } // a yield that took that long: the measured condition itself
	onTime := func() { calls++ }
	window := func(lateOnes int) {
		t.Helper()
		for i := range yieldWindow {
			m.gate.osYieldHook = onTime
			if i < lateOnes {
				m.gate.osYieldHook = late
			}
			m.osYield()
		}
	}

	window(lateMax - 1)
	require.False(t, m.yieldsSkipped(), "fewer than lateMax late yields: the gate stays open")
	require.Zero(t, m.gate.offFor.Load())
	require.Equal(t, yieldWindow, calls)

	window(lateMax)
	require.True(t, m.yieldsSkipped(), "lateMax late yields: the gate closes")
	require.EqualValues(t, offFirst, m.gate.offFor.Load())
	calls = 0
	m.gate.osYieldHook = onTime
	for range 5 {
		m.osYield()
	}
	require.Zero(t, calls, "a closed gate makes no OS yield")

	m.gate.offUntil.Store(0) // the period is over
	window(yieldWindow)
	require.True(t, m.yieldsSkipped())
	require.EqualValues(t, 2*offFirst, m.gate.offFor.Load(), "late again: closed twice as long")
	for range 8 {
		m.gate.offUntil.Store(0)
		window(yieldWindow)
	}
	require.EqualValues(t, offMax, m.gate.offFor.Load(), "at most offMax")

	m.gate.offUntil.Store(0)
	window(0)
	require.False(t, m.yieldsSkipped(), "on time again: open")
	require.Zero(t, m.gate.offFor.Load(), "and the next closing starts from offFirst")
	window(lateMax)
	require.EqualValues(t, offFirst, m.gate.offFor.Load())
	check(t, m)
}

// TestYieldGateParks: while the gate is closed, a request that waits on a
// crowded table (more agents than usable CPUs) parks at once instead of
// spinning (here SpinLimit would keep it spinning for a minute), and is
// granted at the release as any sleeper; on a table that is not crowded it
// spins as before.
func TestYieldGateParks(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 || cpusAllowed() < 2 {
		t.Skip("needs two CPUs: a waiter confined to one parks at once anyway")
	}
	for _, crowded := range []bool{false, true} {
		path := tablePath(t)
		h := openM(t, path, nil)
		opts := *smallTable
		opts.SpinLimit = time.Minute
		m := openM(t, path, &opts)
		if crowded {
			for range cpusAllowed() {
				openM(t, path, nil)
			}
		}
		m.view.cpuAt.Store(0)
		m.refreshView(m.mono())
		require.Equal(t, crowded, m.view.agents.Load() > m.view.usable.Load())
		ctx := ctxT(t, eventually)
		held, err := h.Acquire(ctx, "n", RequestOptions{})
		require.NoError(t, err)

		m.gate.offUntil.Store(m.mono() + int64(time.Hour)) // closed: our yields came back late
		got := acquireReleased(ctx, m, "n")
		if crowded {
			require.Eventually(t, func() bool { return atomic.LoadUint32(m.life.a.Parked()) == 1 }, eventually, time.Millisecond, "the request parks")
			require.Zero(t, m.view.spinners.Load(), "and does not spin")
		} else {
			require.Eventually(t, func() bool { return m.view.spinners.Load() == 1 }, eventually, time.Millisecond, "the request spins")
		}
		require.NoError(t, held.Release())
		mustDone(t, ctx, got, "the waiting request granted")
		check(t, m)
	}
}
