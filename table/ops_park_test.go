package table

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGrantRingsOnlySleepingRequests: a grant (and the wake-ahead of the
// new head of the queue) rings the agent of a waiting request only while
// the request's park mark is set; a request that spins sees its slot word
// change by itself, and ringing it would wake a thread of its process for
// nothing.
func TestGrantRingsOnlySleepingRequests(t *testing.T) {
	tb := newTestTable(t, Geometry{MaxResources: 8, MaxRequests: 16, MaxAgents: 4, MaxNameLen: 16})
	reg := func(pid int) *Agent {
		a, err := tb.Register(Identity{PID: pid, Start: 7, Boot: selfIdentity.Boot}, uint64(pid))
		require.NoError(t, err)
		return a
	}
	holder, waiter := reg(101), reg(102)
	h := Hash("n")
	for _, parked := range []bool{false, true} {
		var w Wakes
		held, out, _, err := tb.Acquire(holder, "n", h, ModeExclusive, false, false, &w)
		require.NoError(t, err)
		require.Equal(t, Granted, out)
		first, out, _, err := tb.Acquire(waiter, "n", h, ModeExclusive, false, false, &w)
		require.NoError(t, err)
		require.Equal(t, Queued, out)
		second, out, _, err := tb.Acquire(waiter, "n", h, ModeExclusive, false, false, &w)
		require.NoError(t, err)
		require.Equal(t, Queued, out)
		require.True(t, w.Empty(), "queueing rings nobody")
		tb.MarkParked(first, parked)
		tb.MarkParked(second, parked)

		// The release grants first and makes second the head.
		require.NoError(t, tb.Release(holder, held, &w))
		st, _, ok := tb.Status(waiter, first)
		require.True(t, ok)
		require.EqualValues(t, SlotHeld, st)
		require.Equal(t, !parked, w.Empty(), "parked %v: wakes %+v", parked, w)
		if parked {
			require.Equal(t, 1, w.n, "one agent, rung once for the grant and the wake-ahead")
			require.Equal(t, waiter.Idx, w.agents[0])
		}
		w = Wakes{}
		require.NoError(t, tb.Release(waiter, first, &w))
		require.Equal(t, !parked, w.Empty(), "parked %v: the grant of second", parked)
		w = Wakes{}
		require.NoError(t, tb.Release(waiter, second, &w))
		require.True(t, w.Empty())
		require.NoError(t, tb.Check(holder))
	}
}
