package table

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// watchOn claims a slot and links a watch of agent a on name in mode.
func (f *fastEnv) watchOn(a *Agent, name string, mode uint32) (Ref, WatchOutcome) {
	f.t.Helper()
	var w Wakes
	r, err := f.tb.Claim(a, Hash(name))
	require.NoError(f.t, err)
	out, err := f.tb.Watch(a, r, name, Hash(name), mode, 1, &w)
	require.NoError(f.t, err)
	f.check(a)
	return r, out
}

// A watch takes its entry from the fast path (a fast holder is moved into
// the held list, so its release goes through the latch and rings), keeps it
// latched while it lasts, and hands it back when it goes.
func TestWatchKeepsEntryOffTheFastPath(t *testing.T) {
	f := newFastEnv(t)
	a, b := f.agent(101), f.agent(102)
	r, tok := f.fastHold(a, "x")

	// Nothing to wait for on a name with no entry: no slot stays claimed.
	_, out := f.watchOn(b, "nobody", ModeExclusive)
	require.Equal(t, WatchReady, out)
	require.Zero(t, f.tb.Usage().Watching)
	ni, err := f.tb.Name(b, "nobody", Hash("nobody"))
	require.NoError(t, err)
	require.False(t, ni.Live, "Name allocates no entry")

	// Name sees the fast holder and moves nothing.
	ni, err = f.tb.Name(b, "x", Hash("x"))
	require.NoError(t, err)
	require.Len(t, ni.Held, 1)
	require.Equal(t, tok, ni.Held[0].Token)
	require.Equal(t, a.Idx, ni.Held[0].Agent)
	require.NotEqual(t, uint32(fastLatched), uint32(f.fastWordOf(b, "x")), "Name must not take the entry from the fast path")

	wr, out := f.watchOn(b, "x", ModeExclusive)
	require.Equal(t, WatchLinked, out)
	require.Equal(t, uint32(fastLatched), uint32(f.fastWordOf(b, "x")), "a watched entry is latched")
	gen0, ok := f.tb.WatchGen(b, wr)
	require.True(t, ok)

	// A's release (its fast CAS fails) goes through the latch and rings B.
	var w Wakes
	require.NoError(t, f.tb.Release(a, r, &w))
	require.False(t, w.Empty())
	require.Equal(t, []uint32{b.Idx}, w.agents[:w.n])
	gen1, _ := f.tb.WatchGen(b, wr)
	require.NotEqual(t, gen0, gen1)
	f.check(b)

	// Still watched: the entry stays latched, an acquire takes the latched path.
	require.Equal(t, uint32(fastLatched), uint32(f.fastWordOf(b, "x")))
	r2, out2, tok2 := f.acquire(a, "x", ModeExclusive, false)
	require.Equal(t, Granted, out2)
	require.False(t, f.isFast(r2), "no fast grant on a watched name")
	require.Equal(t, tok+1, tok2, "the watch consumed no token")
	require.NoError(t, f.release(a, r2))

	out3, _, err := f.tb.WatchCheck(b, wr, &w)
	require.NoError(t, err)
	require.Equal(t, WatchRemoved, out3, "x is free: the exclusive watch is done")
	f.check(b)
	require.Equal(t, uint32(fastIdle), uint32(f.fastWordOf(b, "x")), "back on the fast path")
	require.NoError(t, f.tb.Check(nil))
}

// Repair rebuilds watch lists from the WATCHING slot words, and a reaper
// removes a dead agent's watches.
func TestWatchRepairedAndReaped(t *testing.T) {
	f := newFastEnv(t)
	a, b, c := f.agent(101), f.agent(102), f.agent(103)
	r, _, _ := f.acquire(a, "x", ModeExclusive, false)
	f.watchOn(b, "x", ModeAny)
	f.watchOn(c, "x", ModeShared)

	// A dead latch owner left the watch list cut.
	bk := f.tb.BucketOf(Hash("x"))
	dead := f.agent(104)
	var w Wakes
	require.NoError(t, f.tb.latch(dead, bk, &w))
	e, err := f.tb.findEntry(bk, "x", Hash("x"))
	require.NoError(t, err)
	*f.tb.u32(f.tb.entryOff(e) + enWHead) = 0
	f.live.kill(104)
	require.Error(t, f.tb.check(false), "the checker sees the cut list")
	gen0 := atomic.LoadUint32(f.tb.u32(f.tb.entryOff(e) + enGen))
	n, err := f.tb.ReapDead(a, &w) // takes the latch over: repair
	require.NoError(t, err)
	require.Equal(t, 1, n)
	f.check(a)
	ni, err := f.tb.Name(a, "x", Hash("x"))
	require.NoError(t, err)
	require.Len(t, ni.Watchers, 2)
	require.NotEqual(t, gen0, ni.Gen, "a repair counts as a change")

	// C dies: its watch goes with it; B's stays.
	f.live.kill(103)
	_, err = f.tb.ReapDead(a, &w)
	require.NoError(t, err)
	f.check(a)
	ni, _ = f.tb.Name(a, "x", Hash("x"))
	require.Len(t, ni.Watchers, 1)
	require.Equal(t, b.Idx, ni.Watchers[0].Agent)
	require.Equal(t, uint32(ModeAny), ni.Watchers[0].Mode)

	// B closes (deregisters): no watch is left, the released name is idle.
	require.NoError(t, f.release(a, r))
	require.NoError(t, f.tb.Deregister(b, &w))
	require.Zero(t, f.tb.Usage().Watching)
	require.NoError(t, f.tb.Check(nil))
}

// A watch fires at the change that makes its mode grantable, even if the
// name is taken again before its owner looks: WaitUnlocked returns at the
// first free instant, not at the first one its goroutine happens to see.
func TestWatchFiresAtTheFreeInstant(t *testing.T) {
	f := newFastEnv(t)
	a, b := f.agent(101), f.agent(102)
	r, _, _ := f.acquire(a, "x", ModeShared, false)
	wx, out := f.watchOn(b, "x", ModeExclusive)
	require.Equal(t, WatchLinked, out)
	ws, out := f.watchOn(b, "x", ModeShared) // grantable now: nothing is linked
	require.Equal(t, WatchReady, out)
	_ = ws
	require.NoError(t, f.release(a, r))
	r2, out2, _ := f.acquire(a, "x", ModeExclusive, false) // taken again before B looks
	require.Equal(t, Granted, out2)
	var w Wakes
	out, _, err := f.tb.WatchCheck(b, wx, &w)
	require.NoError(t, err)
	require.Equal(t, WatchRemoved, out, "x was free at A's release")
	f.check(b)

	// A change that does not make the mode grantable does not fire it.
	wx, out = f.watchOn(b, "x", ModeShared)
	require.Equal(t, WatchLinked, out)
	rq, outq, _ := f.acquire(a, "x", ModeShared, false)
	require.Equal(t, Queued, outq)
	out, _, err = f.tb.WatchCheck(b, wx, &w)
	require.NoError(t, err)
	require.Equal(t, WatchLinked, out)
	require.NoError(t, f.release(a, r2)) // grants a's queued shared request: shared is grantable
	out, _, err = f.tb.WatchCheck(b, wx, &w)
	require.NoError(t, err)
	require.Equal(t, WatchRemoved, out)
	require.NoError(t, f.release(a, rq))
	require.NoError(t, f.tb.Check(nil))
}
