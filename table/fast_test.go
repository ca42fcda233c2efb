package table

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// The fast path (fast.go), step by step in one process, with the checker
// after every step: an idle name is granted by CAS without the latch, a
// latch holder that needs the lists moves the fast holder into them, tokens
// stay strictly increasing through the 32-bit counter's end, a steal and a
// reap take a fast hold away.

type fastEnv struct {
	t    *testing.T
	tb   *Table
	live *fakeLiveness
}

func newFastEnv(t *testing.T) *fastEnv {
	live := installFakeLiveness(t)
	return &fastEnv{t: t, tb: newTestTable(t, Geometry{MaxResources: 8, MaxRequests: 32, MaxAgents: 8, MaxNameLen: 32}), live: live}
}

func (f *fastEnv) agent(pid int) *Agent {
	a, err := f.tb.Register(Identity{PID: pid, Start: 7, Boot: selfIdentity.Boot}, uint64(pid))
	require.NoError(f.t, err)
	return a
}

func (f *fastEnv) check(a *Agent) {
	f.t.Helper()
	require.NoError(f.t, f.tb.Check(a))
}

func (f *fastEnv) acquire(a *Agent, name string, mode uint32, steal bool) (Ref, Outcome, uint64) {
	f.t.Helper()
	var w Wakes
	ref, out, tok, err := f.tb.Acquire(a, name, Hash(name), mode, false, steal, &w)
	require.NoError(f.t, err)
	f.check(a)
	return ref, out, tok
}

func (f *fastEnv) release(a *Agent, r Ref) error {
	var w Wakes
	err := f.tb.Release(a, r, &w)
	f.check(a)
	return err
}

// fastWordOf returns the fast word of name's entry.
func (f *fastEnv) fastWordOf(a *Agent, name string) uint64 {
	f.t.Helper()
	var w Wakes
	b := f.tb.BucketOf(Hash(name))
	require.NoError(f.t, f.tb.latch(a, b, &w))
	e, err := f.tb.findEntry(b, name, Hash(name))
	f.tb.unlatch(a, b)
	require.NoError(f.t, err)
	require.NotEqual(f.t, noEntry, e)
	return atomic.LoadUint64(f.tb.u64(f.tb.entryOff(e) + enFast))
}

// fastHold uses name once (so that its entry is idle) and then takes it by
// the fast path: the slot stays CLAIMED.
func (f *fastEnv) fastHold(a *Agent, name string) (Ref, uint64) {
	f.t.Helper()
	r, _, _ := f.acquire(a, name, ModeExclusive, false)
	require.NoError(f.t, f.release(a, r))
	r, out, tok := f.acquire(a, name, ModeExclusive, false)
	require.Equal(f.t, Granted, out)
	require.Equal(f.t, uint8(SlotClaimed), f.slotState(r), "granted by the fast path")
	return r, tok
}

func (f *fastEnv) slotState(r Ref) uint8 {
	return wordState(atomic.LoadUint64(f.tb.u64(f.tb.slotOff(r.Slot) + slWord)))
}

func TestFastGrantAndInflate(t *testing.T) {
	f := newFastEnv(t)
	a, b := f.agent(101), f.agent(102)

	// A new name is granted under the latch; released, its entry is idle.
	r, out, tok1 := f.acquire(a, "x", ModeExclusive, false)
	require.Equal(t, Granted, out)
	require.Equal(t, uint8(SlotHeld), f.slotState(r), "a new name is granted under the latch")
	require.NoError(t, f.release(a, r))
	require.Equal(t, uint32(fastIdle), uint32(f.fastWordOf(a, "x")))

	// Now it is granted by the fast path: the slot stays CLAIMED and the
	// entry's fast word names it.
	r, out, tok2 := f.acquire(a, "x", ModeExclusive, false)
	require.Equal(t, Granted, out)
	require.Greater(t, tok2, tok1)
	require.Equal(t, uint8(SlotClaimed), f.slotState(r))
	require.Equal(t, r.Slot+1, uint32(f.fastWordOf(a, "x")))
	require.True(t, f.tb.Holds(a, r.Slot))
	held, pending, err := f.tb.Snapshot(a)
	require.NoError(t, err)
	require.Len(t, held, 1)
	require.Empty(t, pending)
	require.Equal(t, tok2, held[0].Token)
	require.Equal(t, a.Idx, held[0].Agent)

	// B queues: the fast hold is moved into the held list first.
	rb, out, _ := f.acquire(b, "x", ModeExclusive, false)
	require.Equal(t, Queued, out)
	require.Equal(t, uint8(SlotHeld), f.slotState(r), "the fast holder was moved into the held list")
	require.Equal(t, uint32(fastLatched), uint32(f.fastWordOf(a, "x")))
	require.True(t, f.tb.Holds(a, r.Slot))

	// A's release fails its CAS and goes through the latch, granting B.
	require.NoError(t, f.release(a, r))
	st, tokB, ok := f.tb.Status(b, rb)
	require.True(t, ok)
	require.Equal(t, uint8(SlotHeld), st)
	require.Greater(t, tokB, tok2)
	require.NoError(t, f.release(b, rb))
	require.Equal(t, uint32(fastIdle), uint32(f.fastWordOf(a, "x")), "emptied, the entry is idle again")

	// A shared request takes the latch and the entry back from the fast path.
	rs, out, tokS := f.acquire(b, "x", ModeShared, false)
	require.Equal(t, Granted, out)
	require.Greater(t, tokS, tokB)
	require.Equal(t, uint32(fastLatched), uint32(f.fastWordOf(a, "x")))
	require.NoError(t, f.release(b, rs))
	require.NoError(t, f.tb.Check(nil))
}

func TestFastTokensCarry(t *testing.T) {
	f := newFastEnv(t)
	a := f.agent(101)
	b := f.tb.BucketOf(Hash("y"))
	*f.tb.u64(f.tb.bucketOff(b) + bkMaxToken) = 0xFFFFFFFC
	var last uint64
	fast := 0
	for i := 0; i < 8; i++ {
		r, out, tok := f.acquire(a, "y", ModeExclusive, false)
		require.Equal(t, Granted, out)
		require.Greater(t, tok, last, "tokens strictly increase through the counter's end")
		last = tok
		if f.slotState(r) == SlotClaimed {
			fast++
		}
		require.NoError(t, f.release(a, r))
	}
	require.Greater(t, last, uint64(1)<<32)
	require.GreaterOrEqual(t, fast, 5, "the fast path resumes after the carry")
	require.NoError(t, f.tb.Check(nil))
}

func TestFastHoldStolen(t *testing.T) {
	f := newFastEnv(t)
	a, b := f.agent(101), f.agent(102)
	r, tokA := f.fastHold(a, "x")

	rb, out, tokB := f.acquire(b, "x", ModeExclusive, true)
	require.Equal(t, Granted, out)
	require.Greater(t, tokB, tokA)
	require.Equal(t, uint8(SlotStolen), f.slotState(r))
	require.False(t, f.tb.Holds(a, r.Slot))
	require.ErrorIs(t, f.release(a, r), ErrStolen)
	require.NoError(t, f.release(b, rb))
	require.NoError(t, f.tb.Check(nil))
}

func TestFastHoldReaped(t *testing.T) {
	f := newFastEnv(t)
	a, b := f.agent(101), f.agent(102)
	_, tokA := f.fastHold(a, "x")

	// B waits; A dies; reaping A releases its fast hold and grants B.
	rb, out, _ := f.acquire(b, "x", ModeExclusive, false)
	require.Equal(t, Queued, out)
	f.live.kill(101)
	var w Wakes
	n, err := f.tb.ReapDead(b, &w)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	f.check(b)
	st, tokB, ok := f.tb.Status(b, rb)
	require.True(t, ok)
	require.Equal(t, uint8(SlotHeld), st)
	require.Greater(t, tokB, tokA)
	require.NoError(t, f.release(b, rb))

	// A dead fast holder with nobody waiting: the reap leaves the name idle.
	c := f.agent(103)
	rc, _, _ := f.acquire(c, "x", ModeExclusive, false)
	require.Equal(t, uint8(SlotClaimed), f.slotState(rc))
	f.live.kill(103)
	_, err = f.tb.ReapDead(b, &w)
	require.NoError(t, err)
	f.check(b)
	require.Equal(t, uint32(fastIdle), uint32(f.fastWordOf(b, "x")))
	require.Equal(t, SlotFree, int(f.slotState(rc)))
	require.NoError(t, f.tb.Check(nil))
}

// A fast word left inflating by a dead latch owner is finished by repair:
// the holder keeps its lock and releases it normally.
func TestFastInflatingRepaired(t *testing.T) {
	f := newFastEnv(t)
	a, dead := f.agent(101), f.agent(102)
	r, tokA := f.fastHold(a, "x")

	// Agent 102 latches the bucket, marks the fast word inflating, and dies.
	bk := f.tb.BucketOf(Hash("x"))
	var w Wakes
	require.NoError(t, f.tb.latch(dead, bk, &w))
	e, err := f.tb.findEntry(bk, "x", Hash("x"))
	require.NoError(t, err)
	fp := f.tb.u64(f.tb.entryOff(e) + enFast)
	v := atomic.LoadUint64(fp)
	require.True(t, atomic.CompareAndSwapUint64(fp, v, v|fastInfl))
	f.live.kill(102)

	// A's release takes the latch over, repair finishes the move, A releases.
	require.NoError(t, f.release(a, r))
	f.check(a)
	r2, out, tok2 := f.acquire(a, "x", ModeExclusive, false)
	require.Equal(t, Granted, out)
	require.Greater(t, tok2, tokA)
	require.NoError(t, f.release(a, r2))
	require.NoError(t, f.tb.Check(nil))
}

// A fast release empties its entry without the latch, so a bucket can keep
// more than one idle entry; they stay reusable (a new name in the bucket
// renames one) and the checker accepts them.
func TestFastIdleEntriesShareBucket(t *testing.T) {
	f := newFastEnv(t)
	a := f.agent(101)
	var names []string
	bk := f.tb.BucketOf(Hash("n0"))
	for i := 0; len(names) < 3; i++ {
		n := "n" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if f.tb.BucketOf(Hash(n)) == bk {
			names = append(names, n)
		}
	}
	x, y, z := names[0], names[1], names[2]
	rx, _, _ := f.acquire(a, x, ModeExclusive, false)
	ry, _, _ := f.acquire(a, y, ModeExclusive, false)
	require.NoError(t, f.release(a, rx))
	rx, _, _ = f.acquire(a, x, ModeExclusive, false)
	require.Equal(t, uint8(SlotClaimed), f.slotState(rx), "x by the fast path")
	require.NoError(t, f.release(a, ry)) // cannot free x's entry: it is held
	require.NoError(t, f.release(a, rx)) // fast: leaves a second idle entry
	require.Equal(t, uint32(fastIdle), uint32(f.fastWordOf(a, x)))
	require.Equal(t, uint32(fastIdle), uint32(f.fastWordOf(a, y)))
	require.NoError(t, f.tb.Check(nil))
	require.Equal(t, 2, f.tb.Usage().Idle)
	// A new name in the bucket reuses an idle entry.
	rz, out, _ := f.acquire(a, z, ModeExclusive, false)
	require.Equal(t, Granted, out)
	require.Equal(t, 1, f.tb.Usage().Idle)
	require.Equal(t, 1, f.tb.Usage().Entries)
	require.NoError(t, f.release(a, rz))
	require.NoError(t, f.tb.Check(nil))
}
