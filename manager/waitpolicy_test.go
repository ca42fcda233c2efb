package manager

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/testhooks"
)

// TestArrivalSpins: a request that joins a queue may spin while fewer than
// spinWindow requests of its Manager wait, asleep or spinning, and sleeps
// at once from then on; on a table with more agents than CPUs, while at
// most one waits.
func TestArrivalSpins(t *testing.T) {
	for _, c := range []struct {
		parked   uint32
		spinners int32
		crowded  bool
		want     bool
	}{
		{0, 0, false, true},
		{1, 0, false, true}, // a sibling asleep after a stall: the arrival still spins
		{0, 3, false, true},
		{1, 2, false, true},
		{2, 2, false, false},
		{0, spinWindow, false, false},
		{60, 0, false, false}, // 64 goroutines of one process: far behind its siblings
		{1 << 31, 1 << 30, false, false},
		{0, 0, true, true},
		{1, 0, true, true}, // 8 x 2: the one sibling waits
		{0, 1, true, true},
		{1, 1, true, false}, // 4 x 4: two of ours ahead
		{0, 2, true, false},
		{60, 0, true, false},
	} {
		require.Equal(t, c.want, arrivalSpins(c.parked, c.spinners, c.crowded), "%+v", c)
	}
}

// TestRelaysAndSpinYields: both rules hold only on a crowded table with a
// request of the Manager asleep. A grant readies the next sleeping request
// while at least as many of its Manager's requests wait as it has Ps (4 x
// 3, 4 x 4 on 2 Ps); a spinner yields to the OS only while more wait than
// it has Ps. Neither holds for 8 x 2 (the one sibling, one per P), 4 x 2,
// nobody asleep, or an uncrowded table (2 x 4, 1 x 64).
func TestRelaysAndSpinYields(t *testing.T) {
	for _, c := range []struct {
		crowded      bool
		parked       uint32
		spinners     int32
		procs        int32
		relay, yield bool
	}{
		{true, 1, 1, 2, true, false},  // 4 x 3: one asleep, one spinning; 8 x 2: both wait, one per P
		{true, 2, 0, 2, true, false},  // 4 x 3, both asleep
		{true, 1, 2, 2, true, true},   // 4 x 4: one asleep, two spinning
		{true, 2, 1, 2, true, true},   // 4 x 3
		{true, 14, 1, 2, true, true},  // 4 x 16
		{true, 1, 0, 2, false, false}, // 8 x 2: the one sibling
		{true, 0, 3, 2, false, false}, // nobody asleep
		{true, 0, 1, 2, false, false}, // 4 x 2
		{true, 3, 0, 4, false, false},
		{true, 3, 1, 4, true, false},
		{true, 4, 1, 4, true, true},
		{false, 60, 0, 2, false, false}, // 1 x 64, 2 x 4: not crowded
		{false, 60, 1, 2, false, false},
		{true, 1 << 31, 1 << 30, 1 << 30, true, true}, // no overflow
	} {
		require.Equal(t, c.relay, relays(c.crowded, c.parked, c.spinners, c.procs), "relays %+v", c)
		require.Equal(t, c.yield, spinYields(c.crowded, c.parked, c.spinners, c.procs), "spinYields %+v", c)
	}
}

// TestYieldOutsideQueue: a Manager due to give its CPU away does so
// while the table has more agents than this process has CPUs, or while
// none of its requests waits; not when both its requests wait and the
// lockers fit on the CPUs. The agent count is read again after 100 ms
// (here: forced) as agents come and go.
func TestYieldOutsideQueue(t *testing.T) {
	require.False(t, yieldsOutsideQueue(2, 2, true))
	require.True(t, yieldsOutsideQueue(2, 2, false))
	require.True(t, yieldsOutsideQueue(3, 2, true))
	require.True(t, yieldsOutsideQueue(3, 2, false))
	require.False(t, yieldsOutsideQueue(1, 64, true))

	cpus := min(cpusAllowed(), runtime.GOMAXPROCS(0))
	path := tablePath(t)
	m := openM(t, path, nil)
	refresh := func() int32 { m.view.cpuAt.Store(0); m.refreshView(m.mono()); return m.view.agents.Load() }
	require.Equal(t, int32(1), refresh())
	require.Equal(t, int32(cpus), m.view.usable.Load())

	// yielded reports whether the Manager gives the CPU away, with it
	// due and waiting (a request of it queued) or not.
	yielded := func(waiting bool) bool {
		if waiting {
			m.view.spinners.Add(1) // as a spinning request of ours does
			defer m.view.spinners.Add(-1)
		}
		m.view.lastYield.Store(m.mono() - 2*int64(yieldEvery)) // due
		before := m.view.lastYield.Load()
		if m.shouldYield() {
			m.yieldIfDue()
		}
		return m.view.lastYield.Load() != before
	}
	require.True(t, yielded(false), "nothing of ours waits: yield")
	require.Equal(t, 1 > cpus, yielded(true), "one agent, %d CPUs, a request of ours waits", cpus)

	// One agent more than CPUs: yield even with a request of ours waiting.
	others := make([]*Manager, 0, cpus)
	for range cpus {
		others = append(others, openM(t, path, nil))
	}
	require.Equal(t, int32(cpus+1), refresh())
	require.True(t, yielded(true), "%d agents, %d CPUs", cpus+1, cpus)

	// The request path: a contended request of a due Manager yields before
	// it queues (lastYield moves) on this crowded table.
	h, err := others[0].Acquire(ctxT(t, eventually), "n", RequestOptions{})
	require.NoError(t, err)
	m.view.lastYield.Store(m.mono() - 2*int64(yieldEvery))
	before := m.view.lastYield.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	_, err = m.Acquire(ctx, "n", RequestOptions{})
	cancel()
	require.True(t, errors.Is(err, ErrAborted), "%v", err)
	require.NotEqual(t, before, m.view.lastYield.Load(), "crowded: the request yields before it queues")
	require.NoError(t, h.Release())

	for _, o := range others {
		require.NoError(t, o.Close())
	}
	require.Equal(t, int32(1), refresh(), "closed agents are not counted")
}

// TestSpinChoiceBounded: on a crowded table of bounded fairness every
// spinner gives its CPU to the OS between two looks, in the cases where a
// FIFO table's spinner keeps it (looks only, or Gosched): 8 x 1 and 8 x 2
// on 2 Ps, with a sibling asleep or not. An uncrowded bounded table (2 x 4,
// 1 x 64) spins as a FIFO one does.
func TestSpinChoiceBounded(t *testing.T) {
	for _, c := range []struct {
		spinners int32
		parked   uint32
	}{{1, 0}, {1, 1}, {2, 0}, {2, 3}, {1, 14}} {
		for _, gaveP := range []int32{0, 1} {
			look, yields, own := spinChoice(false, true, true, c.spinners, 2, c.parked, gaveP)
			require.False(t, look, "bounded, crowded %+v", c)
			require.True(t, yields, "bounded, crowded %+v", c)
			require.Equal(t, c.parked > 0 || gaveP > 0, own,
				"bounded, crowded %+v, gaveP %d: our own goroutines first while one of ours sleeps or waits for a P", c, gaveP)
			for _, crowded := range []bool{false, true} {
				flook, fyields, fown := spinChoice(false, false, crowded, c.spinners, 2, c.parked, gaveP)
				require.False(t, fown, "FIFO %v %+v", crowded, c)
				require.Equal(t, spinLooksOnly(false, c.spinners, 2, c.parked), flook, "FIFO %v %+v", crowded, c)
				require.Equal(t, spinYields(crowded, c.parked, c.spinners, 2), fyields, "FIFO %v %+v", crowded, c)
			}
			blook, byields, bown := spinChoice(false, true, false, c.spinners, 2, c.parked, gaveP)
			require.False(t, bown, "bounded, uncrowded %+v", c)
			require.Equal(t, spinLooksOnly(false, c.spinners, 2, c.parked), blook, "bounded, uncrowded %+v", c)
			require.Equal(t, spinYields(false, c.parked, c.spinners, 2), byields, "bounded, uncrowded %+v", c)
		}
	}
	// The cases this rule changes: a FIFO table's lone spinner (8 x 1) only
	// looks, and 8 x 2's spinner beside one sleeping sibling uses Gosched.
	look, _, _ := spinChoice(false, false, true, 1, 2, 0, 0)
	require.True(t, look)
	_, yields, _ := spinChoice(false, false, true, 1, 2, 1, 0)
	require.False(t, yields)
}

// TestTurnPatience: patience is a small part of a spin's budget.
func TestTurnPatience(t *testing.T) {
	require.Positive(t, turnPatience)
	require.Less(t, turnPatience, defaultSpin/10, "patience is a small part of a spin")
}

// TestTurnDue: on a bounded table a release is a turn at every
// turnEvery-th token of a crowded table while a request of the Manager
// waits; not on an uncrowded table, not at other tokens, not with none of
// its requests waiting. The test hook makes every TurnEvery-th one a turn,
// crowded or not.
func TestTurnDue(t *testing.T) {
	o := OpenOptions{Fairness: Bounded(time.Hour), MaxResources: 64, MaxRequests: 256, MaxAgents: 32, MaxNameLen: 64}
	m := openM(t, tablePath(t), &o)
	m.view.agents.Store(m.view.usable.Load() + 1) // crowded, as the view would say
	require.False(t, m.turnDue(turnEvery), "none of ours waits")
	m.view.spinners.Add(1) // one of ours waits
	defer m.view.spinners.Add(-1)
	require.True(t, m.turnDue(turnEvery))
	require.True(t, m.turnDue(3*turnEvery))
	require.False(t, m.turnDue(turnEvery+1))
	m.view.agents.Store(m.view.usable.Load()) // not crowded
	require.False(t, m.turnDue(turnEvery))
	testhooks.TurnEvery.Store(1)
	defer testhooks.TurnEvery.Store(0)
	require.True(t, m.turnDue(turnEvery+1), "the hook: every grant, crowded or not")
}

// TestBoundedDueYieldGivesTheP: a due yield (yieldIfDue) of a Manager on a
// bounded table also gives the goroutine's P to the process's others while
// a request of its own waits; on a FIFO table it gives only the CPU.
func TestBoundedDueYieldGivesTheP(t *testing.T) {
	for _, bounded := range []bool{false, true} {
		o := OpenOptions{MaxResources: 64, MaxRequests: 256, MaxAgents: 32, MaxNameLen: 64}
		if bounded {
			o.Fairness = Bounded(time.Hour)
		}
		m := openM(t, tablePath(t), &o)
		var n atomic.Int32
		m.turn.yieldHook = func() { n.Add(1) }
		m.view.lastYield.Store(m.mono() - 2*int64(yieldEvery))
		m.yieldIfDue()
		require.Zero(t, n.Load(), "none of ours waits: the CPU only")
		m.view.spinners.Add(1) // one of ours waits
		m.view.lastYield.Store(m.mono() - 2*int64(yieldEvery))
		m.yieldIfDue()
		want := int32(0)
		if bounded {
			want = 1
		}
		require.Equal(t, want, n.Load(), "bounded %v", bounded)
		// Not due again: its last yield is recent (made later than now, so
		// that a loaded machine's delay between two calls does not make it due).
		m.view.lastYield.Store(m.mono() + int64(time.Hour))
		m.yieldIfDue()
		require.Equal(t, want, n.Load(), "bounded %v", bounded)
		m.view.spinners.Add(-1)
	}
}

// TestSpinnerGivesThePBack: on a crowded bounded table a spinner that
// gives its CPU to the OS between looks (and keeps its P) gives the P to a
// goroutine of its Manager that gave its own away at a due yield
// (goschedTurn) at its next look. With one P the goroutine otherwise waits
// for the runtime to preempt the spinner (10 ms of looks): the longest
// waits at 4 x 4 and 4 x 16 on 2 CPUs. Counted in looks, not timed.
func TestSpinnerGivesThePBack(t *testing.T) {
	if cpusAllowed() < 2 {
		t.Skip("a process confined to one CPU parks after two looks (spinStep): no spinner to look at")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	path := tablePath(t)
	o := *smallTable
	o.Fairness, o.SpinLimit = Bounded(time.Hour), time.Minute
	b := openM(t, path, &o) // the holder; with it the table has more agents than our one P
	a := openM(t, path, &o)
	ctx := ctxT(t, 30*time.Second)
	held, err := b.Acquire(ctx, "n", RequestOptions{})
	require.NoError(t, err)
	var looks atomic.Int64
	a.view.spinYieldHook = func() { looks.Add(1); cpuYield() }
	got := acquireReleased(ctx, a, "n")
	for a.view.spinners.Load() == 0 || looks.Load() == 0 {
		require.NoError(t, ctx.Err(), "the request never spun")
		runtime.Gosched()
	}
	require.True(t, a.view.agents.Load() > a.view.usable.Load(), "the table is crowded for a")
	before := looks.Load()
	a.goschedTurn()
	require.LessOrEqual(t, looks.Load()-before, int64(2), "the spinner kept the P while we waited for it")
	require.Zero(t, a.view.gaveP.Load())
	require.Equal(t, int32(1), a.view.spinners.Load(), "still spinning: it gave the P, not up")
	require.NoError(t, held.Release())
	mustDone(t, ctx, got, "the spinner's request")
}
