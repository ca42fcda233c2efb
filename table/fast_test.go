package table

import (
	"fmt"
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
// the fast path: the Ref is the entry's reserved slot.
func (f *fastEnv) fastHold(a *Agent, name string) (Ref, uint64) {
	f.t.Helper()
	r, _, _ := f.acquire(a, name, ModeExclusive, false)
	require.NoError(f.t, f.release(a, r))
	r, out, tok := f.acquire(a, name, ModeExclusive, false)
	require.Equal(f.t, Granted, out)
	require.True(f.t, f.isFast(r), "granted by the fast path")
	return r, tok
}

// isFast reports whether r was granted by the fast path (its slot is an
// entry's reserved one).
func (f *fastEnv) isFast(r Ref) bool { return r.Slot >= uint32(f.tb.l.MaxRequests) }

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

	// Now it is granted by the fast path: no slot is claimed, the entry's
	// fast word names the agent and the Ref is the entry's reserved slot.
	usage := f.tb.Usage()
	r, out, tok2 := f.acquire(a, "x", ModeExclusive, false)
	require.Equal(t, Granted, out)
	require.Greater(t, tok2, tok1)
	require.True(t, f.isFast(r))
	require.Equal(t, uint8(SlotFree), f.slotState(r), "no slot word says anything yet")
	require.Equal(t, a.Idx+1, uint32(f.fastWordOf(a, "x")))
	require.Equal(t, usage.Slots, f.tb.Usage().Slots, "no request slot is used")
	require.True(t, f.tb.Holds(a, r))
	require.False(t, f.tb.Holds(b, r))
	require.False(t, f.tb.Holds(a, Ref{Slot: r.Slot, Serial: r.Serial - 1, Bucket: r.Bucket}), "an earlier grant's Ref")
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
	require.True(t, f.tb.Holds(a, r))

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
		if f.isFast(r) {
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
	require.False(t, f.tb.Holds(a, r))
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
	require.True(t, f.isFast(rc))
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
	require.True(t, f.isFast(rx), "x by the fast path")
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

// A fast hold's Ref is the entry's reserved slot with the counter as its
// serial, so it must never match a later grant on the entry. Renaming an
// entry keeps its counter's low word going (renamedToken): here the new
// name's bucket has a high-water mark whose low word is 0, which would
// restart the counter at 1 and let A's stale Ref from before the rename
// release A's own later hold of the new name.
func TestFastRefNeverMatchesALaterGrant(t *testing.T) {
	installFakeLiveness(t)
	f := &fastEnv{t: t, tb: newTestTable(t, Geometry{MaxResources: 1, MaxRequests: 16, MaxAgents: 4, MaxNameLen: 16})}
	a, b := f.agent(101), f.agent(102)
	var x, y string
	for i := 0; y == ""; i++ {
		n := fmt.Sprintf("n%d", i)
		switch {
		case x == "":
			x = n
		case f.tb.BucketOf(Hash(n)) != f.tb.BucketOf(Hash(x)):
			y = n
		}
	}
	stale, _ := f.fastHold(a, x)
	rb, out, _ := f.acquire(b, x, ModeExclusive, true) // B steals x: A's hold is gone
	require.Equal(t, Granted, out)
	require.NoError(t, f.release(b, rb))

	*f.tb.u64(f.tb.bucketOff(f.tb.BucketOf(Hash(y))) + bkMaxToken) = 5 << 32
	ry, _, _ := f.acquire(b, y, ModeExclusive, false) // the only entry is renamed to y
	require.False(t, f.isFast(ry), "a new name is granted under the latch")
	require.NoError(t, f.release(b, ry))
	var last uint64
	for i := 0; i < int(stale.Serial)+5; i++ {
		r, out, tok := f.acquire(a, y, ModeExclusive, false)
		require.Equal(t, Granted, out)
		require.True(t, f.isFast(r))
		require.Equal(t, stale.Slot, r.Slot, "the same entry, so the same reserved slot")
		require.Greater(t, tok, max(last, uint64(5)<<32), "y's tokens exceed its bucket's high-water mark and increase")
		last = tok
		var w Wakes
		err := f.tb.Release(a, stale, &w)
		require.Error(t, err, "round %d: the stale Ref released something", i)
		require.True(t, f.tb.Holds(a, r), "round %d: A's hold of y survives the stale Release", i)
		f.check(a)
		require.NoError(t, f.release(a, r))
	}
	require.NoError(t, f.tb.Check(nil))
}

func TestRenamedToken(t *testing.T) {
	for _, c := range []struct{ bucketMax, old, want uint64 }{
		{0, 0, 0},
		{0, 7, 7},
		{9, 7, 9},
		{5 << 32, 7, 5<<32 | 7},
		{5<<32 | 9, 7, 5<<32 | 9},
		{3, 2<<32 | 1, 3},
		{3, 2<<32 | 8, 8},
		{lo32, 0, lo32},
	} {
		got := renamedToken(c.bucketMax, c.old)
		require.Equal(t, c.want, got, "bucketMax %#x old %#x", c.bucketMax, c.old)
		require.GreaterOrEqual(t, got, c.bucketMax, "above the bucket's high-water mark")
		require.GreaterOrEqual(t, uint32(got), uint32(c.old), "the entry's counter does not go back")
		require.Equal(t, c.bucketMax>>32, got>>32, "the high word is never raised")
	}
}

// A rename into a bucket whose high-water mark is ahead of the entry's own
// counter keeps the mark's high word: tokens grow with grants, not with
// renames (a rename that raised the high word would add 2^32 each time, and
// a busy table of many short-lived names would wrap 64-bit tokens).
func TestRenamesDoNotInflateTokens(t *testing.T) {
	installFakeLiveness(t)
	f := &fastEnv{t: t, tb: newTestTable(t, Geometry{MaxResources: 2, MaxRequests: 8, MaxAgents: 2, MaxNameLen: 16})}
	a := f.agent(101)
	// Names a, d, c share a bucket; b is in another one.
	var a0, b0, c0, d0 string
	for i := 0; c0 == ""; i++ {
		n := fmt.Sprintf("n%d", i)
		switch {
		case a0 == "":
			a0 = n
		case b0 == "" && f.tb.BucketOf(Hash(n)) != f.tb.BucketOf(Hash(a0)):
			b0 = n
		case f.tb.BucketOf(Hash(n)) == f.tb.BucketOf(Hash(a0)) && d0 == "":
			d0 = n
		case f.tb.BucketOf(Hash(n)) == f.tb.BucketOf(Hash(a0)) && d0 != "" && n != d0:
			c0 = n
		}
	}
	use := func(name string) Ref {
		r, out, _ := f.acquire(a, name, ModeExclusive, false)
		require.Equal(t, Granted, out)
		return r
	}
	require.NoError(t, f.release(a, use(b0))) // entry 2, a low counter
	for i := 0; i < 10; i++ {
		require.NoError(t, f.release(a, use(a0))) // entry 1 runs ahead
	}
	rd := use(d0) // a0's idle entry renamed to d0: the bucket's mark is a0's last token
	_, _, tokC := f.acquire(a, c0, ModeExclusive, false)
	// c0 reclaims b0's entry (its own bucket's entry is held by d0): a
	// rename from a counter behind the mark.
	require.Less(t, tokC, uint64(1)<<32, "token %#x: the rename raised the high word", tokC)
	require.Greater(t, tokC, uint64(10), "above the bucket's high-water mark")
	require.NoError(t, f.release(a, rd))
	require.NoError(t, f.tb.Check(nil))
}

// A fast word can name an agent that cannot own it: a process that died
// right after its acquire raced with the Close of its Manager (its record
// was freed), or whose record was then taken by another process (which never
// marked the entry's range). The checker reports such an orphan in a
// quiescent table, and the next latch holder drops it.
func TestFastOrphanDropped(t *testing.T) {
	for _, reuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("record reused=%v", reuse), func(t *testing.T) {
			f := newFastEnv(t)
			a, b := f.agent(101), f.agent(102)
			_, tokA := f.fastHold(a, "x")
			// A's record is freed under its fast hold (as a Deregister that
			// missed an acquire in flight would).
			*f.tb.u64(f.tb.agentOff(a.Idx) + agWord) = 0
			if reuse {
				c := f.agent(103)
				for c.Idx != a.Idx { // take the same record
					c = f.agent(103 + int(c.Idx) + 1)
				}
			}
			err := f.tb.Check(nil)
			require.ErrorIs(t, err, ErrCorrupt)
			require.Contains(t, err.Error(), "orphan")
			rb, out, tokB := f.acquire(b, "x", ModeExclusive, false)
			require.Equal(t, Granted, out, "the orphaned hold was dropped")
			require.Greater(t, tokB, tokA)
			require.NoError(t, f.release(b, rb))
			require.NoError(t, f.tb.Check(nil))
		})
	}
}

// The reserved slots are only ever in their own entry's held list: the
// checker reports one that is queued, or held on another entry.
func TestReservedSlotMisuseReported(t *testing.T) {
	f := newFastEnv(t)
	a, b := f.agent(101), f.agent(102)
	r, _ := f.fastHold(a, "x")
	_, out, _ := f.acquire(b, "x", ModeExclusive, false) // A's hold moves into its reserved slot
	require.Equal(t, Queued, out)
	require.Equal(t, uint8(SlotHeld), f.slotState(r))
	so := f.tb.slotOff(r.Slot)
	e := *f.tb.u32(so + slEntry)
	*f.tb.u32(so + slEntry) = e + 1 // claims to hold another entry
	err := f.tb.Check(nil)
	require.ErrorIs(t, err, ErrCorrupt)
	require.Contains(t, err.Error(), "reserved for entry")
	*f.tb.u32(so + slEntry) = e
	require.NoError(t, f.tb.Check(nil))
}
