package table

import (
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stampTime decodes a fast grant's stamp: only the grant whose counter it
// names, never after the reader's now, right across the 2^32 wrap of its
// low word, and any garbage gives a time no later than now.
func TestStampTime(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC).UnixNano()
	u := uint32(now / stampUnit)
	stamp := func(ctr uint32, units uint32) uint64 { return uint64(ctr)<<32 | uint64(units) }

	require.Equal(t, (now/stampUnit)*stampUnit, stampTime(stamp(7, u), 7, now), "granted now")
	require.Equal(t, (now/stampUnit-500)*stampUnit, stampTime(stamp(7, u-500), 7, now), "granted 5 s ago")
	require.Zero(t, stampTime(stamp(6, u), 7, now), "another grant's stamp: unknown")
	require.Zero(t, stampTime(stamp(7, u), 7, 0), "no now")
	require.Equal(t, (now/stampUnit)*stampUnit, stampTime(stamp(7, u+3), 7, now), "a stamp ahead of the reader's clock reads as now")

	// Across the wrap of the low word: a reader just past a multiple of
	// 2^32 units decodes a stamp taken just before it.
	wrapNow := (int64(1)<<36 + 5) * stampUnit // low word 5
	require.Equal(t, (int64(1)<<36-10)*stampUnit, stampTime(stamp(1, math.MaxUint32-9), 1, wrapNow))

	for _, garbage := range []uint64{0, math.MaxUint64, 1 << 63, 0xdeadbeefcafebabe} {
		ctr := uint32(garbage >> 32)
		got := stampTime(garbage, ctr, now)
		require.LessOrEqual(t, got, now, "garbage %#x", garbage)
		require.Greater(t, got, now-int64(250*24*time.Hour), "garbage %#x: within the readable range", garbage)
	}
}

// Every grant has its time: by the fast path (its stamp), moved into the
// held list (the stamp becomes the slot's grant time), made at once under
// the latch (the coarse clock) and from the queue (the clock).
func TestGrantTimes(t *testing.T) {
	f := newFastEnv(t)
	a, b := f.agent(101), f.agent(102)
	t.Cleanup(RefreshClock)
	sinceOf := func(name string) []int64 {
		t.Helper()
		held, _, err := f.tb.Snapshot(nil)
		require.NoError(t, err)
		var out []int64
		for _, li := range held {
			if li.Name == name {
				out = append(out, li.Since)
			}
		}
		return out
	}
	// The coarse clock as a process whose last refresh was 5 s ago sees it:
	// every grant made at once reads as 5 s old.
	setCoarse := func(at int64) {
		coarse.Store(at)
		coarseUnits.Store(uint32(at / stampUnit))
	}
	past := time.Now().Add(-5 * time.Second).UnixNano()
	near := func(want, got int64) {
		t.Helper()
		require.InDelta(t, float64(want), float64(got), float64(stampUnit), "want %v, got %v", time.Unix(0, want), time.Unix(0, got))
	}

	// Granted at once under the latch (a new name): the coarse clock.
	setCoarse(past)
	r, _, _ := f.acquire(a, "x", ModeExclusive, false)
	require.False(t, f.isFast(r))
	near(past, sinceOf("x")[0])
	require.NoError(t, f.release(a, r))

	// By the fast path: its stamp.
	r, _ = f.fastHold(a, "x")
	near(past, sinceOf("x")[0])

	// Moved into the held list when b queues: the same time, in the slot.
	setCoarse(time.Now().UnixNano())
	rb, out, _ := f.acquire(b, "x", ModeExclusive, false)
	require.Equal(t, Queued, out)
	require.Equal(t, uint8(SlotHeld), f.slotState(r))
	near(past, sinceOf("x")[0])

	// Granted from the queue: the clock, now.
	before := time.Now().UnixNano()
	require.NoError(t, f.release(a, r))
	got := sinceOf("x")
	require.Len(t, got, 1)
	require.GreaterOrEqual(t, got[0], before-int64(time.Millisecond))
	require.NoError(t, f.release(b, rb))

	// A stamp that is not the fast holder's grant: unknown (0), and a
	// holder moved into the held list meanwhile gets the time of the move.
	r, _ = f.fastHold(a, "x")
	e := r.Slot - uint32(f.tb.l.MaxRequests)
	sp := f.tb.u64(f.tb.entryOff(e) + enStamp)
	atomic.StoreUint64(sp, atomic.LoadUint64(sp)-1<<32)
	require.Equal(t, []int64{0}, sinceOf("x"))
	before = time.Now().UnixNano()
	rb, _, _ = f.acquire(b, "x", ModeExclusive, false)
	require.GreaterOrEqual(t, sinceOf("x")[0], before-int64(time.Millisecond))
	require.NoError(t, f.release(a, r))
	require.NoError(t, f.release(b, rb))
}
