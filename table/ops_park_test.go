package table

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// registerPID registers an agent of a live-looking identity with PID pid.
func registerPID(t *testing.T, tb *Table, pid int) *Agent {
	t.Helper()
	a, err := tb.Register(Identity{PID: pid, Start: 7, Boot: selfIdentity.Boot}, uint64(pid))
	require.NoError(t, err)
	return a
}

// TestGrantRingsOnlySleepingRequests: a grant (and the wake-ahead of the
// new head of the queue) rings the doorbell of a waiting request's agent
// only while the request's park mark is set; a request that spins sees its
// slot word change by itself, and ringing it would wake a thread of its
// process for nothing. Its bell word is not bumped either (a locked add
// on a line the agent's spinners read).
func TestGrantRingsOnlySleepingRequests(t *testing.T) {
	tb := newTestTable(t, Geometry{MaxResources: 8, MaxRequests: 16, MaxAgents: 4, MaxNameLen: 16})
	reg := func(pid int) *Agent { return registerPID(t, tb, pid) }
	holder, waiter := reg(101), reg(102)
	// The waiter's agent has a goroutine asleep somewhere (another name):
	// only the park mark of the request in question decides.
	atomic.StoreUint32(waiter.Parked(), 1)
	h := Hash("n")
	for _, parked := range []bool{false, true} {
		var rings []uint32
		ring := func(agent uint32, _ uint64) { rings = append(rings, agent) }
		deliver := func(w *Wakes) (rung []uint32, bell uint32) {
			rings = nil
			before := atomic.LoadUint32(waiter.Bell())
			tb.Deliver(w, ring)
			return rings, atomic.LoadUint32(waiter.Bell()) - before
		}
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
		require.Equal(t, !parked, w.Empty(), "a request that spins is not noted in Wakes, one that sleeps is")
		rung, bell := deliver(&w)
		if parked {
			require.Equal(t, uint32(1), bell, "the bell is bumped once for the grant and the wake-ahead")
			require.Equal(t, []uint32{waiter.Idx}, rung, "one ring for the grant and the wake-ahead")
		} else {
			require.Zero(t, bell, "no bell bump for requests that spin")
			require.Empty(t, rung, "a spinning request's doorbell is not rung")
		}
		require.NoError(t, tb.Release(waiter, first, &w))
		rung, _ = deliver(&w)
		require.Equal(t, parked, len(rung) == 1, "parked %v: the grant of second", parked)
		require.NoError(t, tb.Release(waiter, second, &w))
		require.True(t, w.Empty())
		require.NoError(t, tb.Check(holder))
	}
}

// TestLiveAgents: the waiting policy's count of live agents counts
// registered records only, stops at its bound, and drops a deregistered
// agent.
func TestLiveAgents(t *testing.T) {
	tb := newTestTable(t, Geometry{MaxResources: 8, MaxRequests: 16, MaxAgents: 8, MaxNameLen: 16})
	require.Zero(t, tb.LiveAgents(0))
	var as []*Agent
	for pid := 201; pid < 204; pid++ {
		as = append(as, registerPID(t, tb, pid))
	}
	require.Equal(t, 3, tb.LiveAgents(0))
	require.Equal(t, 3, tb.LiveAgents(5))
	require.Equal(t, 2, tb.LiveAgents(2), "stops at its bound")
	var w Wakes
	require.NoError(t, tb.Deregister(as[1], &w))
	require.Equal(t, 2, tb.LiveAgents(0))
}

// TestDeliverLocal: a release by an agent that grants to (or makes the
// head) sleeping requests of its own agent pokes them by slot, in the
// order granted, with neither a bell bump nor a ring; a request of another
// agent in the same Wakes is rung as by Deliver; a steal, or more sleepers
// than Wakes keeps, falls back to the bell and the ring. A sleeping head
// whose agent is the holder's is not woken ahead (wakeAhead).
func TestDeliverLocal(t *testing.T) {
	tb := newTestTable(t, Geometry{MaxResources: 8, MaxRequests: 16, MaxAgents: 4, MaxNameLen: 16})
	reg := func(pid int) *Agent { return registerPID(t, tb, pid) }
	self, other := reg(301), reg(302)
	atomic.StoreUint32(self.Parked(), 1)
	atomic.StoreUint32(other.Parked(), 1)
	h := Hash("n")
	var w Wakes
	acquire := func(a *Agent, mode uint32, want Outcome) Ref {
		r, out, _, err := tb.Acquire(a, "n", h, mode, false, false, &w)
		require.NoError(t, err)
		require.Equal(t, want, out)
		if out == Queued {
			tb.MarkParked(r, true)
		}
		return r
	}
	var pokes, rings []uint32
	deliver := func() (selfBell, otherBell uint32) {
		pokes, rings = nil, nil
		sb, ob := atomic.LoadUint32(self.Bell()), atomic.LoadUint32(other.Bell())
		n := tb.DeliverLocal(&w, self.Idx, func(s uint32) { pokes = append(pokes, s) },
			func(agent uint32, _ uint64) { rings = append(rings, agent) })
		require.True(t, w.Empty(), "w is reset")
		require.Equal(t, len(pokes), n, "DeliverLocal counts its pokes")
		return atomic.LoadUint32(self.Bell()) - sb, atomic.LoadUint32(other.Bell()) - ob
	}

	// Own requests only: the grant of a, asleep, poked. b, asleep behind a,
	// is not woken ahead: a's release will grant it from this agent.
	held := acquire(self, ModeExclusive, Granted)
	a, b := acquire(self, ModeExclusive, Queued), acquire(self, ModeExclusive, Queued)
	require.NoError(t, tb.Release(self, held, &w))
	sb, _ := deliver()
	require.Equal(t, []uint32{a.Slot}, pokes)
	require.Empty(t, rings)
	require.Zero(t, sb, "a local hand-off does not bump the bell")

	// The next head is another agent's sleeping request: rung as by
	// Deliver (woken ahead: b's release is not its agent's).
	c := acquire(other, ModeExclusive, Queued)
	require.NoError(t, tb.Release(self, a, &w)) // grants b (ours), c becomes the head
	sb, ob := deliver()
	require.Equal(t, []uint32{b.Slot}, pokes)
	require.Equal(t, []uint32{other.Idx}, rings)
	require.Zero(t, sb)
	require.Equal(t, uint32(1), ob)

	// Our sleeping request behind another agent's holder is woken ahead,
	// by a poke.
	d := acquire(self, ModeExclusive, Queued)
	require.NoError(t, tb.Release(self, b, &w)) // grants c (other's), d becomes the head
	sb, ob = deliver()
	require.Equal(t, []uint32{d.Slot}, pokes)
	require.Equal(t, []uint32{other.Idx}, rings)
	require.Zero(t, sb)
	require.Equal(t, uint32(1), ob)

	// A spinning request of ours (park mark clear) needs no poke at all.
	tb.MarkParked(d, false)
	require.NoError(t, tb.Release(other, c, &w)) // grants d, spinning
	sb, _ = deliver()
	require.Empty(t, pokes)
	require.Empty(t, rings)
	require.Zero(t, sb)

	// Two sleeping shared requests of ours granted at once: both poked.
	s1, s2 := acquire(self, ModeShared, Queued), acquire(self, ModeShared, Queued)
	require.NoError(t, tb.Release(self, d, &w))
	sb, _ = deliver()
	require.Equal(t, []uint32{s1.Slot, s2.Slot}, pokes)
	require.Empty(t, rings)
	require.Zero(t, sb)
	x := acquire(self, ModeExclusive, Queued)
	for _, r := range []Ref{s1, s2} {
		require.NoError(t, tb.Release(self, r, &w))
	}
	deliver()
	d = x

	// Three sleeping shared requests of ours granted at once: more than
	// Wakes keeps, so the bell and the ring (the Manager's scan) take over.
	var shared []Ref
	for range 3 {
		shared = append(shared, acquire(self, ModeShared, Queued))
	}
	require.NoError(t, tb.Release(self, d, &w))
	sb, _ = deliver()
	require.Empty(t, pokes)
	require.Equal(t, []uint32{self.Idx}, rings)
	require.Equal(t, uint32(1), sb)

	// A steal from us is never delivered as a poke.
	for _, r := range shared {
		require.NoError(t, tb.Release(self, r, &w))
	}
	deliver()
	e := acquire(self, ModeExclusive, Granted)
	_, out, _, err := tb.Acquire(other, "n", h, ModeExclusive, false, true, &w)
	require.NoError(t, err)
	require.Equal(t, Granted, out)
	sb, _ = deliver()
	require.Empty(t, pokes)
	require.Equal(t, []uint32{self.Idx}, rings)
	require.Equal(t, uint32(1), sb)
	require.Equal(t, uint32(1), atomic.LoadUint32(self.StealSeq()))
	st, _, ok := tb.Status(self, e)
	require.True(t, ok)
	require.EqualValues(t, SlotStolen, st)
	require.NoError(t, tb.Check(self))
}

// TestNowNano: the table's clock follows the wall clock (within what the
// two reads around it allow) and never runs backwards across its rebase.
func TestNowNano(t *testing.T) {
	prev := int64(0)
	for i := 0; i < 1000; i++ {
		before := time.Now().UnixNano()
		got := nowNano()
		after := time.Now().UnixNano()
		require.GreaterOrEqual(t, got, before-int64(time.Millisecond), "read %d", i)
		require.LessOrEqual(t, got, after+int64(time.Millisecond), "read %d", i)
		require.GreaterOrEqual(t, got, prev, "read %d ran backwards", i)
		prev = got
	}
	clockBase.Store(&wallBase{mono: MonoNow() - 2*int64(time.Second), wall: 1}) // a base too old: rebased
	got := nowNano()
	require.InDelta(t, float64(time.Now().UnixNano()), float64(got), float64(time.Second))
	clockBase.Store(&wallBase{mono: MonoNow() + 2*int64(time.Second), wall: 1}) // a base from the future: rebased too
	got = nowNano()
	require.InDelta(t, float64(time.Now().UnixNano()), float64(got), float64(time.Second))
	// A reading taken before a rebase converts by the new base.
	mono := MonoNow()
	clockBase.Store(nil)
	require.InDelta(t, float64(time.Now().UnixNano()), float64(wallAt(mono)), float64(time.Millisecond))
}

// TestEnqueuedMono: a queued request's enqueue stamp reads back as the
// clock reading of its enqueue; a stamp that is garbage reads as now.
func TestEnqueuedMono(t *testing.T) {
	tb := newTestTable(t, smallGeometry)
	a, b := registerPID(t, tb, 101), registerPID(t, tb, 102)
	h := Hash("n")
	var w Wakes
	_, out, _, err := tb.Acquire(a, "n", h, ModeExclusive, false, false, &w)
	require.NoError(t, err)
	require.Equal(t, Granted, out)
	before := MonoNow()
	r, out, _, err := tb.Acquire(b, "n", h, ModeExclusive, false, false, &w)
	require.NoError(t, err)
	require.Equal(t, Queued, out)
	after := MonoNow()
	got := tb.EnqueuedMono(r)
	const slack = int64(time.Millisecond) // a new base in between moves the scale by its drift
	require.GreaterOrEqual(t, got, before-slack)
	require.LessOrEqual(t, got, after+slack)
	tb.st64(tb.slotOff(r.Slot)+slEnqueue, 1) // hostile: 1970
	now := MonoNow()
	require.GreaterOrEqual(t, tb.EnqueuedMono(r), now, "garbage reads as now")
	require.GreaterOrEqual(t, tb.EnqueuedMono(Ref{Slot: 1 << 30}), now, "so does a slot out of range")
	tb.st64(tb.slotOff(r.Slot)+slEnqueue, uint64(wallAt(MonoNow())))
	require.NoError(t, tb.Check(a))
}
