package table

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A latch naming our own agent while nothing else of ours is in flight is
// garbage, but only once it has stayed so for selfTakeoverAfter: before that
// it may be a Release racing with Close (not counted in flight) whose
// goroutine was descheduled inside the latch.
func TestSelfOwnedLatchNotTakenOverEarly(t *testing.T) {
	old := LatchGiveUp
	LatchGiveUp = 400 * time.Millisecond // self takeover after 200 ms
	defer func() { LatchGiveUp = old }()
	tb := newTestTable(t, smallGeometry)
	a, err := tb.Register(Self(), 1)
	require.NoError(t, err)
	var inflight atomic.Int64
	a.InFlight = &inflight
	lw := tb.latchWord(3)
	atomic.StoreUint32(lw, a.Idx+1) // "held by a Release of ours"
	got := make(chan error, 1)
	go func() {
		inflight.Add(1)
		var w Wakes
		got <- tb.latch(a, 3, &w)
	}()
	select {
	case err := <-got:
		t.Fatalf("took over our own latch within the quiet period (err %v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	// The word stays: after selfTakeoverAfter it is garbage and taken over.
	select {
	case err := <-got:
		require.NoError(t, err)
		require.Equal(t, a.Idx+1, atomic.LoadUint32(lw)&latchOwner)
	case <-time.After(10 * time.Second):
		t.Fatal("a garbage latch naming ourselves was never taken over")
	}
	tb.unlatch(a, 3)
	require.NoError(t, tb.check(true))
}
