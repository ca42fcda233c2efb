package waitgraph

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/table"
)

// The graph: hard and soft edges, task tags, the victim-only search and the
// two-read comparison, on synthetic snapshots.
func TestWaitForGraph(t *testing.T) {
	w := func(slot, serial uint32, name string, mode uint32, agent uint32, since int64) table.LockInfo {
		return table.LockInfo{Name: name, Mode: mode, Agent: agent, Slot: slot, Serial: serial, Since: since}
	}
	ex, sh := uint32(table.ModeExclusive), uint32(table.ModeShared)
	// Agent 1 holds x (tagged for its wait on y, slot 5); agent 2 holds y
	// (tagged for its wait on x, slot 6); a shared waiter (slot 7, agent 3)
	// queued behind agent 2's exclusive wait on x.
	hx := w(10, 1, "x", ex, 1, 0)
	hx.Tag = table.TaskTag(table.Ref{Slot: 5, Serial: 9})
	hy := w(11, 1, "y", sh, 2, 0)
	hy.Tag = table.TaskTag(table.Ref{Slot: 6, Serial: 3})
	held := []table.LockInfo{hx, hy}
	pending := []table.LockInfo{w(5, 9, "y", ex, 1, 100), w(6, 3, "x", ex, 2, 200), w(7, 1, "x", sh, 3, 300)}
	g := New(held, pending)
	require.Equal(t, [][]int{{2}, {3}, {1}, {0}, {0, 3}}, g.Out)
	require.Nil(t, g.CycleThrough(2, true), "slot 5 started first: not the victim")
	require.Equal(t, []int{3, 0, 2, 1}, g.CycleThrough(3, true), "slot 6 is the victim")
	require.Equal(t, []int{2, 1, 3, 0}, g.CycleThrough(2, false))
	require.Nil(t, g.CycleThrough(4, true), "the shared waiter is in no cycle")
	require.Equal(t, [][]int{{3, 0, 2, 1}}, g.Cycles())
	require.True(t, sameRequests(g, New(held, pending), []int{3, 0, 2, 1}))
	// A later request in slot 5 (another serial) is not the same request.
	p2 := append([]table.LockInfo{}, pending...)
	p2[0].Serial = 10
	require.False(t, sameRequests(g, New(held, p2), []int{3, 0, 2, 1}))
	// A tag with a stale serial links nothing.
	h2 := append([]table.LockInfo{}, held...)
	h2[0].Tag = table.TaskTag(table.Ref{Slot: 5, Serial: 8})
	require.Nil(t, New(h2, pending).CycleThrough(3, false))
	// Shared holders and a shared waiter do not wait for each other.
	g3 := New([]table.LockInfo{w(1, 1, "s", sh, 1, 0)}, []table.LockInfo{w(2, 1, "s", sh, 2, 5)})
	require.Empty(t, g3.Out[1])
	require.Contains(t, g.Describe([]int{3, 0, 2, 1}), `waiting for "x" (exclusive) -> `)
	require.Equal(t, []bool{true, true, true, true, false}, g.InCycle())

	// The soft edges of a queue e s s e s behind an exclusive holder: each
	// exclusive waiter points at the shared run before it and the exclusive
	// one before that; a shared one at the last exclusive one before it.
	q := []table.LockInfo{w(1, 1, "q", ex, 1, 1), w(2, 1, "q", sh, 2, 2), w(3, 1, "q", sh, 3, 3),
		w(4, 1, "q", ex, 4, 4), w(5, 1, "q", sh, 5, 5)}
	gq := New([]table.LockInfo{w(9, 1, "q", ex, 9, 0)}, q)
	require.Equal(t, [][]int{nil, {0}, {0, 1}, {0, 1}, {0, 2, 3, 1}, {0, 4}}, gq.Out)
	require.Equal(t, make([]bool, 6), gq.InCycle())
	require.Empty(t, gq.Cycles())
}

// Confirmed keeps a cycle only when the second read has it too.
func TestConfirmed(t *testing.T) {
	w := func(slot, serial uint32, name string, agent uint32, since int64) table.LockInfo {
		return table.LockInfo{Name: name, Mode: table.ModeExclusive, Agent: agent, Slot: slot, Serial: serial, Since: since}
	}
	hx, hy := w(10, 1, "x", 1, 0), w(11, 1, "y", 2, 0)
	hx.Tag = table.TaskTag(table.Ref{Slot: 5, Serial: 9})
	hy.Tag = table.TaskTag(table.Ref{Slot: 6, Serial: 3})
	held := []table.LockInfo{hx, hy}
	pending := []table.LockInfo{w(5, 9, "y", 1, 100), w(6, 3, "x", 2, 200)}
	later := append([]table.LockInfo{}, pending...)
	later[0].Serial = 10 // a later request in slot 5
	for _, tc := range []struct {
		second []table.LockInfo
		kept   int
	}{{pending, 1}, {later, 0}} {
		reads := 0
		read := func() ([]table.LockInfo, []table.LockInfo, error) {
			reads++
			if reads == 1 {
				return held, pending, nil
			}
			return held, tc.second, nil
		}
		g, cycles, err := Confirmed(read, (*Graph).Cycles)
		require.NoError(t, err)
		require.Equal(t, 2, reads)
		require.Len(t, cycles, tc.kept)
		require.Len(t, g.Nodes, 4)
	}
	reads := 0
	_, cycles, err := Confirmed(func() ([]table.LockInfo, []table.LockInfo, error) {
		reads++
		return []table.LockInfo{w(10, 1, "x", 1, 0)}, nil, nil
	}, (*Graph).Cycles)
	require.NoError(t, err)
	require.Empty(t, cycles)
	require.Equal(t, 1, reads, "no cycle: one read")
}
