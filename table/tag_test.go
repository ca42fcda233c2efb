package table

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TagHolds moves a fast hold into its reserved slot and tags it; the
// snapshot reports the tag and serials; the graph links the hold to the
// waiting request it names; clearing removes the link; the checker rejects
// a tag on a waiting slot and a tag naming no request slot.
func TestTaskTags(t *testing.T) {
	tb := newTestTable(t, smallGeometry)
	a, err := tb.Register(Self(), 1)
	require.NoError(t, err)
	b, err := tb.Register(Self(), 2)
	require.NoError(t, err)
	var w Wakes
	hx, hy := Hash("x"), Hash("y")
	rx, out, _, err := tb.Acquire(a, "x", hx, ModeExclusive, false, false, &w)
	require.NoError(t, err)
	require.Equal(t, Granted, out)
	require.NoError(t, tb.Release(a, rx, &w)) // x's entry is idle now: the next hold is a fast one
	rx, out, _, err = tb.Acquire(a, "x", hx, ModeExclusive, false, false, &w)
	require.NoError(t, err)
	require.Equal(t, Granted, out)
	require.GreaterOrEqual(t, rx.Slot, uint32(smallGeometry.MaxRequests), "a fast hold")
	_, out, _, err = tb.Acquire(b, "y", hy, ModeExclusive, false, false, &w)
	require.NoError(t, err)
	require.Equal(t, Granted, out)
	wy, out, _, err := tb.Acquire(a, "y", hy, ModeExclusive, false, false, &w)
	require.NoError(t, err)
	require.Equal(t, Queued, out)

	n, err := tb.TagHolds(a, []Ref{rx, {Slot: 1 << 20}}, TaskTag(wy), &w)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the bogus ref is skipped")
	require.NoError(t, tb.Check(a))
	require.NoError(t, tb.check(true))
	held, pending, err := tb.Snapshot(a)
	require.NoError(t, err)
	x := -1
	for i := range held {
		if held[i].Name == "x" {
			x = i
			require.Equal(t, rx.Slot, held[i].Slot)
			require.Equal(t, rx.Serial, held[i].Serial)
			require.True(t, TagNames(held[i].Tag, wy.Slot, wy.Serial))
		}
	}
	require.GreaterOrEqual(t, x, 0)
	slot, ok := TagSlot(held[x].Tag)
	require.True(t, ok)
	require.Equal(t, wy.Slot, slot, "x's hold names a's request on y")
	waiting := false
	for _, p := range pending {
		waiting = waiting || p.Slot == wy.Slot && p.Serial == wy.Serial
	}
	require.True(t, waiting)

	_, err = tb.TagHolds(a, []Ref{rx}, 0, &w)
	require.NoError(t, err)
	held, pending, err = tb.Snapshot(a)
	require.NoError(t, err)
	for _, h := range held {
		require.Zero(t, h.Tag)
	}

	// Hostile tags: on a waiting slot, and naming a reserved slot.
	so := tb.slotOff(wy.Slot)
	tb.st32(so+slFlags, 1<<9)
	require.ErrorContains(t, tb.check(true), "waiting with flags")
	tb.st32(so+slFlags, 0)
	xo := tb.slotOff(rx.Slot)
	tb.st32(xo+slFlags, uint32(smallGeometry.MaxRequests+3)<<tagShift)
	require.ErrorContains(t, tb.check(true), "names no request slot")
	tb.st32(xo+slFlags, TaskTag(Ref{Slot: 7, Serial: 1}))
	require.ErrorContains(t, tb.check(true), "not a request of agent")
	tb.st32(xo+slFlags, 0)
	require.NoError(t, tb.check(true))
}
