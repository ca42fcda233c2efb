//go:build linux

package manager

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestYieldPolicyInputs: the two inputs of the waiting policy (docs/waiting.md)
// A Manager yields at most once per yieldEvery and records the time it
// got its CPU back; a process confined to one CPU is recognised (waiters
// then yield to the OS), and one that is not, is not.
func TestYieldPolicyInputs(t *testing.T) {
	m := openM(t, tablePath(t), nil)

	// Not due (a yield recorded in the future keeps this independent of
	// how slowly the test runs).
	m.view.lastYield.Store(m.mono() + int64(time.Second))
	before := m.view.lastYield.Load()
	m.yieldIfDue()
	require.Equal(t, before, m.view.lastYield.Load())
	require.False(t, m.yieldDue())

	m.view.lastYield.Store(m.mono() - 2*int64(yieldEvery))
	require.True(t, m.yieldDue())
	start := m.mono()
	m.yieldIfDue()
	require.GreaterOrEqual(t, m.view.lastYield.Load(), start, "the time is taken when the CPU comes back")

	// Affinity is per thread on Linux: confine this goroutine's thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var orig unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &orig))
	defer unix.SchedSetaffinity(0, &orig)
	var one unix.CPUSet
	for c := 0; c < 1024; c++ {
		if orig.IsSet(c) {
			one.Set(c)
			break
		}
	}
	require.NoError(t, unix.SchedSetaffinity(0, &one))
	m.view.cpuAt.Store(0)
	m.refreshView(m.mono())
	require.True(t, m.onOneCPU())
	require.NoError(t, unix.SchedSetaffinity(0, &orig))
	m.view.cpuAt.Store(0)
	m.refreshView(m.mono())
	require.Equal(t, orig.Count() == 1, m.onOneCPU())
}

// TestSpinStep: the waiting policy's steps (docs/waiting.md). A waiter
// that may use several CPUs never stops by itself (its budget does that) and
// gives its CPU to the OS only when spinYields says so, then at every step;
// one confined to one CPU lets its own goroutines run, yields to the OS
// exactly once, and then parks, whatever spinYields says.
func TestSpinStep(t *testing.T) {
	for i := 0; i < 1000; i++ {
		require.Equal(t, spinGosched, spinStep(i, false, false), "step %d on several CPUs", i)
		require.Equal(t, spinOSYield, spinStep(i, false, true), "yielding step %d on several CPUs", i)
	}
	for _, yields := range []bool{false, true} {
		var steps []spinAction
		for i := 0; ; i++ {
			a := spinStep(i, true, yields)
			steps = append(steps, a)
			if a == spinPark {
				break
			}
			require.Less(t, i, 100, "a one-CPU waiter never parks")
		}
		require.Equal(t, []spinAction{spinGosched, spinOSYield, spinPark}, steps, "yields %v", yields)
	}
}
