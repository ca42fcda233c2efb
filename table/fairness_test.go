package table

import (
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// slotEntry is the entry of a waiting or held request slot s.
func (t *Table) slotEntry(s uint32) uint32 { return t.ld32(t.slotOff(s)+slEntry) - 1 }

func newBoundedTable(t *testing.T, bound time.Duration) *Table {
	t.Helper()
	tb, created, err := OpenFair(filepath.Join(t.TempDir(), "t.tbl"), Geometry{MaxResources: 8, MaxRequests: 16, MaxAgents: 4, MaxNameLen: 16}, 0, bound)
	require.NoError(t, err)
	require.True(t, created)
	t.Cleanup(func() { tb.Close() })
	return tb
}

// oneName drives exclusive requests on the name "n" of a table in a test,
// checking that every grant it sees has a fencing token above the last.
type oneName struct {
	t    *testing.T
	tb   *Table
	last uint64
}

// acquire makes an exclusive request of ag on "n" and checks its outcome.
func (n *oneName) acquire(ag *Agent, want Outcome) Ref {
	n.t.Helper()
	var w Wakes
	ref, out, tok, err := n.tb.Acquire(ag, "n", Hash("n"), ModeExclusive, false, false, &w)
	require.NoError(n.t, err)
	require.Equal(n.t, want, out)
	if out == Granted {
		n.granted(tok)
	}
	return ref
}

// granted checks a grant's token against the last one seen.
func (n *oneName) granted(tok uint64) {
	n.t.Helper()
	require.Greater(n.t, tok, n.last)
	n.last = tok
}

// state returns r's slot state (a grant's token checked).
func (n *oneName) state(ag *Agent, r Ref) uint8 {
	n.t.Helper()
	st, tok, ok := n.tb.Status(ag, r)
	require.True(n.t, ok)
	if st == SlotHeld {
		n.granted(tok)
	}
	return st
}

// held reports whether r is held (a grant's token checked).
func (n *oneName) held(ag *Agent, r Ref) bool { return n.state(ag, r) == SlotHeld }

// age makes queued request r look d old.
func (n *oneName) age(r Ref, d time.Duration) {
	*n.tb.u64(n.tb.slotOff(r.Slot) + slEnqueue) = uint64(nowNano() - int64(d))
}

// TestStarvedGrantRingsARungHead: a head rung to take its turn (mark
// markRung) that has not run when it is granted by a starved hand-off is
// rung again at that grant: its wake-up does not rest on the first ring
// alone (with the mark cleared to 0 instead, the grant rang nobody, and in
// BenchmarkGoroutines such a head was at times found only by its Manager's
// 100 ms safety scan while every request on the name waited behind it).
func TestStarvedGrantRingsARungHead(t *testing.T) {
	tb := newBoundedTable(t, time.Hour)
	holder, head, other := registerPID(t, tb, 211), registerPID(t, tb, 212), registerPID(t, tb, 213)
	h := Hash("n")
	var w Wakes
	noted := func() []uint32 {
		var got []uint32
		tb.DeliverLocal(&w, noAgent, nil, func(agent uint32, _ uint64) { got = append(got, agent) })
		return got
	}
	atomic.StoreUint32(head.Parked(), 1)
	held, out, _, err := tb.Acquire(holder, "n", h, ModeExclusive, false, false, &w)
	require.NoError(t, err)
	require.Equal(t, Granted, out)
	waiting, out, _, err := tb.Acquire(head, "n", h, ModeExclusive, false, false, &w)
	require.NoError(t, err)
	require.Equal(t, Queued, out)
	tb.MarkParked(waiting, true)
	require.Empty(t, noted())

	require.NoError(t, tb.Release(holder, held, &w))
	require.Equal(t, []uint32{head.Idx}, noted(), "rung to take its turn")
	// It has not run, and now it has waited the bound: a new request finds
	// it starved and hands it the name.
	*tb.u64(tb.slotOff(waiting.Slot) + slEnqueue) = uint64(nowNano() - int64(2*time.Hour))
	_, out, _, err = tb.Acquire(other, "n", h, ModeExclusive, false, false, &w)
	require.NoError(t, err)
	require.Equal(t, Queued, out, "nobody barges past a starved head")
	st, _, ok := tb.Status(head, waiting)
	require.True(t, ok)
	require.EqualValues(t, SlotHeld, st, "the starved head is granted")
	require.Contains(t, noted(), head.Idx, "its grant rings it again")
	require.NoError(t, tb.Check(holder))
}

// TestBoundedLeavesTheNameToItsHead: on a bounded table a release that
// could grant the head of the queue, which has waited less than the bound,
// leaves the name free and wakes the head once (its park mark markRung); a
// new request takes the name first (exclusive, shared and IfAvailable
// alike), and its release does not ring the head again; the head then takes
// its turn; a head aged past the bound is granted by the release, and then
// nobody takes the name ahead of it. Tokens increase throughout, and the
// checker passes at every step.
func TestBoundedLeavesTheNameToItsHead(t *testing.T) {
	tb := newBoundedTable(t, time.Hour)
	holder, head, other := registerPID(t, tb, 201), registerPID(t, tb, 202), registerPID(t, tb, 203)
	h := Hash("n")
	var w Wakes
	var last uint64
	acquire := func(a *Agent, mode uint32, ifAvailable bool, want Outcome) Ref {
		t.Helper()
		ref, out, tok, err := tb.Acquire(a, "n", h, mode, ifAvailable, false, &w)
		require.NoError(t, err)
		require.Equal(t, want, out)
		if out == Granted {
			require.Greater(t, tok, last)
			last = tok
		}
		require.NoError(t, tb.Check(holder))
		return ref
	}
	noted := func() []uint32 {
		t.Helper()
		var got []uint32
		tb.DeliverLocal(&w, noAgent, nil, func(agent uint32, _ uint64) { got = append(got, agent) })
		return got
	}
	atomic.StoreUint32(head.Parked(), 1) // its goroutine sleeps: rings are sent

	held := acquire(holder, ModeExclusive, false, Granted)
	waiting := acquire(head, ModeExclusive, false, Queued)
	tb.MarkParked(waiting, true)
	require.Empty(t, noted())

	require.NoError(t, tb.Release(holder, held, &w))
	st, _, ok := tb.Status(head, waiting)
	require.True(t, ok)
	require.EqualValues(t, SlotWaiting, st, "left the name, not granted")
	require.Equal(t, []uint32{head.Idx}, noted(), "the sleeping head is woken once")
	require.EqualValues(t, markRung, atomic.LoadUint32(tb.u32(tb.slotOff(waiting.Slot)+slPark)), "its mark says rung")
	require.NoError(t, tb.Check(holder), "a free name left to its head passes the checker")
	ready, err := tb.Ready(other, "n", h, ModeExclusive)
	require.NoError(t, err)
	require.True(t, ready, "WaitUnlocked: a request would be granted at once")

	// Barges: each mode, and IfAvailable; no ring for the head meanwhile.
	for _, c := range []struct {
		mode        uint32
		ifAvailable bool
	}{{ModeExclusive, false}, {ModeShared, false}, {ModeExclusive, true}} {
		b := acquire(other, c.mode, c.ifAvailable, Granted)
		if c.mode == ModeShared {
			// Held shared: not free, so another request queues (no barge past
			// a queued exclusive), and IfAvailable is refused.
			acquire(holder, ModeShared, true, NotAvailable)
		}
		require.NoError(t, tb.Release(other, b, &w))
		require.Empty(t, noted(), "the head was woken already")
	}

	// The head takes its turn.
	ok, err = tb.TakeTurn(head, waiting, &w)
	require.NoError(t, err)
	require.True(t, ok)
	st, tok, ok := tb.Status(head, waiting)
	require.True(t, ok)
	require.EqualValues(t, SlotHeld, st)
	require.Greater(t, tok, last)
	last = tok
	require.Empty(t, noted(), "the head is awake: its own grant rings nobody")
	require.NoError(t, tb.Check(holder))

	// Starved: the other queues, its enqueue time is moved back past the
	// bound; the release hands the name to it and nobody barges.
	second := acquire(other, ModeExclusive, false, Queued)
	*tb.u64(tb.slotOff(second.Slot) + slEnqueue) = uint64(nowNano() - int64(2*time.Hour))
	third := acquire(holder, ModeExclusive, false, Queued)
	require.NoError(t, tb.Release(head, waiting, &w))
	st, tok, ok = tb.Status(other, second)
	require.True(t, ok)
	require.EqualValues(t, SlotHeld, st, "a head that has waited the bound is granted by the release")
	require.Greater(t, tok, last)
	last = tok
	require.NoError(t, tb.Release(other, second, &w))
	st, _, _ = tb.Status(holder, third)
	require.EqualValues(t, SlotWaiting, st, "a fresh head is left the name")
	// The name left free is on the fast path: a request takes it there.
	require.Equal(t, uint32(fastIdle), uint32(atomic.LoadUint64(tb.u64(tb.entryOff(tb.slotEntry(third.Slot))+enFast))))
	fast := acquire(other, ModeExclusive, false, Granted)
	require.GreaterOrEqual(t, fast.Slot, uint32(tb.l.MaxRequests), "a fast hold (the entry's reserved slot)")
	snapHeld, pend, err := tb.Snapshot(nil)
	require.NoError(t, err)
	require.Len(t, snapHeld, 1, "Query shows the fast holder")
	require.Len(t, pend, 1, "and the queue behind it")
	require.NoError(t, tb.Check(holder), "a fast hold with a queue passes the checker")
	require.NoError(t, tb.Release(other, fast, &w))
	// A head whose enqueue time is ahead of our clock counts as starved: an
	// arrival (IfAvailable, refused) serves it on its way.
	*tb.u64(tb.slotOff(third.Slot) + slEnqueue) = uint64(nowNano() + int64(time.Minute))
	acquire(other, ModeExclusive, true, NotAvailable)
	st, tok, _ = tb.Status(holder, third)
	require.EqualValues(t, SlotHeld, st, "the starved head is served by the next arrival")
	require.Greater(t, tok, last)
	require.NoError(t, tb.Release(holder, third, &w))
	noted()
	require.NoError(t, tb.Check(holder))
}

// TestBoundedTakeTurnOnlyTheHead: TakeTurn grants only the first request of
// the queue, and only when it is compatible with the holders; a shared head
// takes the shared requests behind it along.
func TestBoundedTakeTurnOnlyTheHead(t *testing.T) {
	tb := newBoundedTable(t, time.Hour)
	a, b, c := registerPID(t, tb, 301), registerPID(t, tb, 302), registerPID(t, tb, 303)
	h := Hash("n")
	var w Wakes
	held, out, _, err := tb.Acquire(a, "n", h, ModeExclusive, false, false, &w)
	require.NoError(t, err)
	require.Equal(t, Granted, out)
	s1, out, _, _ := tb.Acquire(b, "n", h, ModeShared, false, false, &w)
	require.Equal(t, Queued, out)
	s2, out, _, _ := tb.Acquire(c, "n", h, ModeShared, false, false, &w)
	require.Equal(t, Queued, out)
	x, out, _, _ := tb.Acquire(a, "n", h, ModeExclusive, false, false, &w)
	require.Equal(t, Queued, out)
	ok, err := tb.TakeTurn(b, s1, &w)
	require.NoError(t, err)
	require.False(t, ok, "held exclusively: not compatible")
	_, open := tb.TurnOpen(b, s1)
	require.False(t, open)
	require.NoError(t, tb.Release(a, held, &w))
	mark, open := tb.TurnOpen(b, s1)
	require.True(t, open)
	_, open = tb.TurnOpen(c, s2)
	require.False(t, open, "not the head")
	again, open := tb.TurnOpen(b, s1)
	require.True(t, open)
	require.Equal(t, mark, again, "nobody took the name")
	d := registerPID(t, tb, 304)
	for i := 0; i < 2; i++ { // two barges, each moving the mark
		queue, all := tb.Progress(s1, false), tb.Progress(s1, true)
		bar, out, _, err := tb.Acquire(d, "n", h, ModeExclusive, false, false, &w)
		require.NoError(t, err)
		require.Equal(t, Granted, out, "a barge: the head has waited less than the bound")
		_, open = tb.TurnOpen(b, s1)
		require.False(t, open, "held by the barger")
		require.NoError(t, tb.Release(d, bar, &w))
		again, open = tb.TurnOpen(b, s1)
		require.True(t, open)
		require.NotEqual(t, mark, again, "taken and given back in between: the mark moved")
		mark = again
		require.Equal(t, queue, tb.Progress(s1, false), "a barge on the fast path does not move the queue")
		require.NotEqual(t, all, tb.Progress(s1, true), "it is a grant on the name")
	}
	ok, err = tb.TakeTurn(c, s2, &w)
	require.NoError(t, err)
	require.False(t, ok, "not the head")
	ok, err = tb.TakeTurn(b, s1, &w)
	require.NoError(t, err)
	require.True(t, ok)
	for _, r := range []struct {
		a   *Agent
		ref Ref
	}{{b, s1}, {c, s2}} {
		st, _, _ := tb.Status(r.a, r.ref)
		require.EqualValues(t, SlotHeld, st, "the shared run is granted together")
	}
	st, _, _ := tb.Status(a, x)
	require.EqualValues(t, SlotWaiting, st)
	require.NoError(t, tb.Check(a))
	w = Wakes{}
}

// TestBoundedAgingServesTheReleasersOwnFirst: on a bounded table whose
// head has waited half the bound, a release grants the releasing agent's
// oldest queued request ahead of older ones of other agents if it has
// waited half the bound too (a batch per process), else the head; requests
// younger than half the bound are not batched; the queue stays in arrival
// order and the checker passes throughout.
func TestBoundedAgingServesTheReleasersOwnFirst(t *testing.T) {
	tb := newBoundedTable(t, time.Hour)
	a, b := registerPID(t, tb, 221), registerPID(t, tb, 222)
	var w Wakes
	n := &oneName{t: t, tb: tb}
	acquire, age, granted := n.acquire, n.age, n.held
	held := acquire(a, Granted)
	b1 := acquire(b, Queued)
	a1 := acquire(a, Queued)
	a2 := acquire(a, Queued)
	age(b1, 40*time.Minute)
	age(a1, 35*time.Minute)
	age(a2, 10*time.Minute) // young: not in a's batch
	require.NoError(t, tb.Check(a))

	require.NoError(t, tb.Release(a, held, &w))
	require.True(t, granted(a, a1), "a's aging request goes ahead of b's older one")
	require.False(t, granted(b, b1))
	require.Equal(t, b1.Slot+1, tb.ld32(tb.entryOff(tb.slotEntry(b1.Slot))+enQHead), "the queue keeps its order")
	require.NoError(t, tb.Check(a))

	require.NoError(t, tb.Release(a, a1, &w))
	require.True(t, granted(b, b1), "a has no aging request left: the oldest is granted")
	require.False(t, granted(a, a2))
	require.NoError(t, tb.Check(a))

	// A release by a waiter's agent (b) with a young head now: the name is
	// left free to the head (a2), as before half the bound.
	require.NoError(t, tb.Release(b, b1, &w))
	require.False(t, granted(a, a2), "a young head takes its turn itself")
	ok, err := tb.TakeTurn(a, a2, &w)
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, granted(a, a2))
	require.NoError(t, tb.Check(a))
}

// TestBoundedAgingWakesASleepingHead: on a bounded table whose head has
// waited half the bound, a release does not grant the head while it sleeps
// (its park mark set): it rings it once (mark markRung) and leaves the name
// free, so a running request still takes it; once the head is awake (mark
// 0), the next release grants it. Past the bound a sleeping head is granted
// (and rung) at once: the starved hand-off. Tokens increase throughout and
// the checker passes.
func TestBoundedAgingWakesASleepingHead(t *testing.T) {
	tb := newBoundedTable(t, time.Hour)
	a, b, c := registerPID(t, tb, 231), registerPID(t, tb, 232), registerPID(t, tb, 233)
	n := &oneName{t: t, tb: tb}
	acquire, status := n.acquire, n.state
	release := func(ag *Agent, r Ref) Wakes {
		t.Helper()
		var w Wakes
		require.NoError(t, tb.Release(ag, r, &w))
		require.NoError(t, tb.Check(ag))
		return w
	}
	rung := func(w Wakes, ag *Agent) bool {
		for i := uint8(0); i < w.nsleep; i++ {
			if w.sleepers[i].agent == ag.Idx {
				return true
			}
		}
		return false
	}
	park := func(r Ref) uint32 { return atomic.LoadUint32(tb.u32(tb.slotOff(r.Slot) + slPark)) }

	held := acquire(a, Granted)
	b1 := acquire(b, Queued)
	*tb.u64(tb.slotOff(b1.Slot) + slEnqueue) = uint64(nowNano() - int64(40*time.Minute)) // aging
	tb.MarkParked(b1, true)

	w := release(a, held)
	require.EqualValues(t, SlotWaiting, status(b, b1), "a sleeping head is not granted while it ages")
	require.True(t, rung(w, b), "it is rung")
	require.EqualValues(t, markRung, park(b1))
	barge := acquire(c, Granted) // the name was left free: a running request takes it

	tb.MarkParked(b1, false) // b's goroutine runs (it spins)
	release(c, barge)        // a barge's release, on the fast path: the head takes its turn
	var w2 Wakes
	ok, err := tb.TakeTurn(b, b1, &w2)
	require.NoError(t, err)
	require.True(t, ok)
	require.EqualValues(t, SlotHeld, status(b, b1))

	// An aging head that is awake is granted by the release (b1's hold is
	// under the latch: TakeTurn).
	c1 := acquire(c, Queued)
	*tb.u64(tb.slotOff(c1.Slot) + slEnqueue) = uint64(nowNano() - int64(40*time.Minute))
	release(b, b1)
	require.EqualValues(t, SlotHeld, status(c, c1), "awake, the aging head is granted at once")

	// Past the bound a sleeping head is granted at once, and rung.
	b2 := acquire(b, Queued)
	*tb.u64(tb.slotOff(b2.Slot) + slEnqueue) = uint64(nowNano() - int64(2*time.Hour))
	tb.MarkParked(b2, true)
	w = release(c, c1)
	require.EqualValues(t, SlotHeld, status(b, b2), "starved: granted asleep")
	require.True(t, rung(w, b))
	release(b, b2)
}

// TestBoundedReleaseTurn: on a bounded table, ReleaseTurn grants the
// releasing agent's oldest queued request ahead of older requests of other
// agents, from a fast hold or a latched one; it grants the head when the
// agent has none queued, and when the head has waited the bound; the queue
// keeps its order, tokens increase and the checker passes. On a FIFO table
// it is Release.
func TestBoundedReleaseTurn(t *testing.T) {
	tb := newBoundedTable(t, time.Hour)
	a, b := registerPID(t, tb, 241), registerPID(t, tb, 242)
	h := Hash("n")
	n := &oneName{t: t, tb: tb}
	acquire, held := n.acquire, n.held
	turn := func(ag *Agent, r Ref) {
		t.Helper()
		var w Wakes
		require.NoError(t, tb.ReleaseTurn(ag, r, &w))
		require.NoError(t, tb.Check(ag))
	}

	var w Wakes
	first := acquire(a, Granted)
	b1 := acquire(b, Queued)
	require.NoError(t, tb.Release(a, first, &w)) // left free to b1, on the fast path with its queue
	fast, tok, out := tb.AcquireFast(a, "n", h, &w)
	require.Equal(t, Granted, out, "a barge by the fast path")
	require.GreaterOrEqual(t, fast.Slot, uint32(tb.l.MaxRequests), "a fast hold")
	n.granted(tok)
	a1 := acquire(a, Queued)
	turn(a, fast)
	require.True(t, held(a, a1), "a's own request goes ahead of b's older one")
	require.False(t, held(b, b1))
	require.Equal(t, b1.Slot+1, tb.ld32(tb.entryOff(tb.slotEntry(b1.Slot))+enQHead), "the queue keeps its order")

	a2 := acquire(a, Queued)
	turn(a, a1) // a latched hold
	require.True(t, held(a, a2))
	turn(a, a2) // none of a's left: as Release, the name is left to the head
	require.False(t, held(b, b1))
	ok, err := tb.TakeTurn(b, b1, &w)
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, held(b, b1))

	a3 := acquire(a, Queued)
	b2 := acquire(b, Queued)
	*tb.u64(tb.slotOff(a3.Slot) + slEnqueue) = uint64(nowNano() - int64(2*time.Hour)) // starved
	turn(b, b1)
	require.True(t, held(a, a3), "a head that has waited the bound goes first")
	require.False(t, held(b, b2))
	require.NoError(t, tb.Release(a, a3, &w))
	require.NoError(t, tb.Check(a))

	// FIFO: ReleaseTurn is Release (the head is granted).
	ft, _, err := OpenFair(filepath.Join(t.TempDir(), "f.tbl"), Geometry{MaxResources: 8, MaxRequests: 16, MaxAgents: 4, MaxNameLen: 16}, 0, 0)
	require.NoError(t, err)
	t.Cleanup(func() { ft.Close() })
	require.Zero(t, ft.Bound())
	c, d := registerPID(t, ft, 243), registerPID(t, ft, 244)
	hc, _, _, err := ft.Acquire(c, "n", h, ModeExclusive, false, false, &w)
	require.NoError(t, err)
	d1, out, _, _ := ft.Acquire(d, "n", h, ModeExclusive, false, false, &w)
	require.Equal(t, Queued, out)
	c1, out, _, _ := ft.Acquire(c, "n", h, ModeExclusive, false, false, &w)
	require.Equal(t, Queued, out)
	require.NoError(t, ft.ReleaseTurn(c, hc, &w))
	st, _, _ := ft.Status(d, d1)
	require.EqualValues(t, SlotHeld, st, "FIFO: the head")
	st, _, _ = ft.Status(c, c1)
	require.EqualValues(t, SlotWaiting, st)
	require.NoError(t, ft.Check(c))
}
