package stress

import (
	"bytes"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// testRegion is an in-memory check region with slots running workers.
func testRegion(t *testing.T, names, slots, goroutines int) *Region {
	t.Helper()
	sh := RegionShape{Names: names, Slots: slots, Goroutines: goroutines, Records: childRecords}
	words := make([]uint64, (RegionSize(sh)+7)/8)
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
	r, err := InitRegion(buf, sh)
	require.NoError(t, err)
	for s := 0; s < slots; s++ {
		r.ClaimSlot(s, s)
		r.SetPID(s, os.Getpid()) // alive: a conflict with a dead process's record is not one
	}
	return r
}

// fakeClock is a monotonic clock that advances by a microsecond per reading.
func fakeClock() func() int64 {
	var t atomic.Int64
	t.Store(1e9)
	return func() int64 { return t.Add(1000) }
}

func testChecker(r *Region, slot int, clock func() int64) *Checker {
	c := NewChecker(r, slot, 1000+slot, clock)
	c.StealWait = 10 * time.Millisecond
	return c
}

func violations(r *Region) (int, string) {
	n, msgs := r.Violations()
	return n, strings.Join(msgs, "\n")
}

// grant makes goroutine g of c request and be granted name with token.
func grant(c *Checker, g, name int, mode uint32, steal bool, token uint64) *Request {
	q := c.Begin(g, name, mode, steal, !steal, 0)
	q.End()
	q.Granted(token)
	q.Enter()
	return q
}

func release(q *Request) {
	q.Exit()
	q.Release()
}

func TestCheckerSequentialExclusiveIsClean(t *testing.T) {
	r := testRegion(t, 2, 2, 2)
	clock := fakeClock()
	c0, c1 := testChecker(r, 0, clock), testChecker(r, 1, clock)
	tok := uint64(0)
	for i := 0; i < 100; i++ {
		c := c0
		if i%2 == 1 {
			c = c1
		}
		tok++
		q := grant(c, i%2, 0, modeExclusive, false, tok)
		release(q)
	}
	n, msgs := violations(r)
	require.Zero(t, n, msgs)
	require.EqualValues(t, 100, uint32(loadU64(r.nu64(0, nmCounter))))
	require.EqualValues(t, 100, loadU64(r.nu64(0, nmGrantsX)))
}

func TestCheckerDoubleExclusive(t *testing.T) {
	r := testRegion(t, 1, 2, 1)
	clock := fakeClock()
	c0, c1 := testChecker(r, 0, clock), testChecker(r, 1, clock)
	q0 := grant(c0, 0, 0, modeExclusive, false, 1)
	q1 := grant(c1, 0, 0, modeExclusive, false, 2)
	n, msgs := violations(r)
	require.Equal(t, 1, n)
	require.Contains(t, msgs, "exclusion broken on stress-0: exclusive grant token 2")
	// Both write the counter: the second to exit sees the first one's write.
	release(q1)
	release(q0)
	n, msgs = violations(r)
	require.Equal(t, 2, n)
	require.Contains(t, msgs, "counter changed from 0 to 1 (written by token 2)")
}

func TestCheckerSharedAndExclusive(t *testing.T) {
	r := testRegion(t, 1, 3, 1)
	clock := fakeClock()
	c0, c1, c2 := testChecker(r, 0, clock), testChecker(r, 1, clock), testChecker(r, 2, clock)
	q0 := grant(c0, 0, 0, modeShared, false, 1)
	q1 := grant(c1, 0, 0, modeShared, false, 2)
	n, msgs := violations(r)
	require.Zero(t, n, msgs) // shared with shared is fine
	grant(c2, 0, 0, modeExclusive, false, 3)
	n, msgs = violations(r)
	require.Equal(t, 2, n, "one per shared holder") // exclusive over two shared holders
	require.Contains(t, msgs, "exclusive grant token 3 (goroutine 0) overlapped shared holder")
	release(q0)
	release(q1)
}

func TestCheckerKilledHolderIgnored(t *testing.T) {
	r := testRegion(t, 1, 2, 1)
	clock := fakeClock()
	c0, c1 := testChecker(r, 0, clock), testChecker(r, 1, clock)
	grant(c0, 0, 0, modeExclusive, false, 1) // never releases: killed
	r.setSlotState(0, slotKilled)
	r.AddKill()
	q := grant(c1, 0, 0, modeExclusive, false, 2)
	release(q)
	n, msgs := violations(r)
	require.Zero(t, n, msgs)
}

func TestCheckerStealExcused(t *testing.T) {
	r := testRegion(t, 1, 3, 1)
	clock := fakeClock()
	c0, c1, c2 := testChecker(r, 0, clock), testChecker(r, 1, clock), testChecker(r, 2, clock)
	victim := grant(c0, 0, 0, modeExclusive, false, 1)
	thief := grant(c1, 0, 0, modeExclusive, true, 2)
	release(thief)
	// A waiter granted after the thief, while the victim is still inside.
	next := grant(c2, 0, 0, modeExclusive, false, 3)
	release(next)
	release(victim) // sees the counter changed, knows it was stolen: fenced
	victim.LostAtRelease()
	n, msgs := violations(r)
	require.Zero(t, n, msgs)
	require.EqualValues(t, 3, loadU64(r.nu64(0, nmGrantsX)))
	require.EqualValues(t, 1, loadU64(r.nu64(0, nmFenced)))
	require.EqualValues(t, 2, uint32(loadU64(r.nu64(0, nmCounter))))
}

func TestCheckerTokenRegression(t *testing.T) {
	r := testRegion(t, 1, 2, 1)
	clock := fakeClock()
	c0, c1 := testChecker(r, 0, clock), testChecker(r, 1, clock)
	release(grant(c0, 0, 0, modeExclusive, false, 5))
	release(grant(c1, 0, 0, modeExclusive, false, 5)) // same token again
	release(grant(c1, 0, 0, modeExclusive, false, 3)) // lower
	n, msgs := violations(r)
	require.Equal(t, 2, n, msgs)
	require.Contains(t, msgs, "token regression on stress-0: exclusive grant with token 5 after token 5")
	require.Contains(t, msgs, "exclusive grant with token 3 after token 5")
	release(grant(c0, 0, 0, modeShared, false, 4)) // shared below an exclusive token
	n, msgs = violations(r)
	require.Equal(t, 3, n, msgs)
	require.Contains(t, msgs, "shared grant with token 4 after exclusive token 5")
}

func TestCheckerSharedTokensMayRecordOutOfOrder(t *testing.T) {
	r := testRegion(t, 1, 2, 1)
	clock := fakeClock()
	c0, c1 := testChecker(r, 0, clock), testChecker(r, 1, clock)
	release(grant(c0, 0, 0, modeExclusive, false, 1))
	a := grant(c0, 0, 0, modeShared, false, 3) // granted together with 2, seen first
	b := grant(c1, 0, 0, modeShared, false, 2)
	release(a)
	release(b)
	release(grant(c1, 0, 0, modeExclusive, false, 4))
	n, msgs := violations(r)
	require.Zero(t, n, msgs)
}

func TestCheckerLostWithoutSteal(t *testing.T) {
	r := testRegion(t, 1, 1, 1)
	c := testChecker(r, 0, fakeClock())
	q := grant(c, 0, 0, modeExclusive, false, 1)
	release(q)
	q.LostAtRelease()
	n, msgs := violations(r)
	require.Equal(t, 1, n)
	require.Contains(t, msgs, "was lost (release said stolen), but no steal of it was recorded")

	// With kills in the run, the thief may have died before it recorded.
	r.AddKill()
	q.LostAtRelease()
	n, _ = violations(r)
	require.Equal(t, 1, n)
}

func TestCheckerCounterWrittenDuringHold(t *testing.T) {
	r := testRegion(t, 1, 1, 1)
	c := testChecker(r, 0, fakeClock())
	q := grant(c, 0, 0, modeExclusive, false, 1)
	// Someone increments the counter without holding the lock (its record is
	// not published, so only the counter can tell).
	storeU64(r.nu64(0, nmCounter), 9<<32|1)
	release(q)
	n, msgs := violations(r)
	require.Equal(t, 1, n)
	require.Contains(t, msgs, "counter changed from 0 to 1 (written by token 9)")
}

func TestCheckerWithoutTokens(t *testing.T) {
	r := testRegion(t, 1, 2, 1)
	clock := fakeClock()
	c0, c1 := testChecker(r, 0, clock), testChecker(r, 1, clock)
	c0.Tokens, c1.Tokens = false, false
	q0 := grant(c0, 0, 0, modeExclusive, false, 0)
	require.EqualValues(t, 1, q0.token)
	grant(c1, 0, 0, modeExclusive, false, 0)
	n, msgs := violations(r)
	require.Equal(t, 1, n, msgs)
	require.NotContains(t, msgs, "token regression")
}

func TestCheckerHandoffAndReapWatch(t *testing.T) {
	r := testRegion(t, 1, 2, 1)
	clock := fakeClock()
	c0, c1 := testChecker(r, 0, clock), testChecker(r, 1, clock)
	q0 := grant(c0, 0, 0, modeExclusive, false, 1)
	w := c1.Begin(0, 0, modeExclusive, false, true, 0) // waits
	release(q0)                                        // stamps: a waiter exists
	w.End()
	g := w.Granted(2)
	require.Positive(t, g.Handoff)
	w.Enter()

	// The supervisor kills w's process and arms the reap watch.
	storeU32(r.nu32(0, nmReapSlot), 1)
	storeU32(r.nu32(0, nmReapG), 0)
	storeU64(r.nu64(0, nmReapToken), 2)
	storeI64(r.ni64(0, nmReapKill), clock())
	storeU32(r.nu32(0, nmReapState), 1)
	r.setSlotState(1, slotKilled)
	q := grant(c0, 0, 0, modeExclusive, false, 3)
	require.EqualValues(t, 2, atomic32(r.nu32(0, nmReapState)))
	require.Greater(t, loadI64(r.ni64(0, nmReapGrant)), loadI64(r.ni64(0, nmReapKill)))
	release(q)
	n, msgs := violations(r)
	require.Zero(t, n, msgs)
}

// TestRegionViolationMessages: the counts are exact; the first messages of
// each kind are kept (a flood of one kind does not hide another), up to
// maxMessages, each cut to its slot.
func TestRegionViolationMessages(t *testing.T) {
	r := testRegion(t, 1, 1, 1)
	for i := 0; i < maxMessages+5; i++ {
		r.Violation(strings.Repeat("x", 300))
	}
	r.violation(kindExec, "later, of another kind")
	n, msgs := r.Violations()
	require.Equal(t, maxMessages+6, n)
	require.Len(t, msgs, perKindKept+1)
	require.Len(t, msgs[0], messageSize-4)
	require.Equal(t, "exec: later, of another kind", msgs[perKindKept])
	for k := 0; k < numKinds; k++ {
		for i := 0; i < maxMessages; i++ {
			r.violation(k, "m")
		}
	}
	_, msgs = r.Violations()
	require.Len(t, msgs, maxMessages)
	require.Equal(t, maxMessages+6+numKinds*maxMessages, r.kindCount(kindOther)+func() int {
		s := 0
		for k := 0; k < numKinds; k++ {
			if k != kindOther {
				s += r.kindCount(k)
			}
		}
		return s
	}())
}

func TestParseHold(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		in     string
		lo, hi time.Duration
	}{
		{"none", 0, 0},
		{"0", 0, 0},
		{"fixed:10us", 10 * time.Microsecond, 10 * time.Microsecond},
		{"uniform:0-100us", 0, 100 * time.Microsecond},
		{"uniform:10-20us", 10 * time.Microsecond, 20 * time.Microsecond},
		{"uniform:1ms-2ms", time.Millisecond, 2 * time.Millisecond},
		{"exp:50us", 0, time.Second},
	} {
		h, err := ParseHold(c.in)
		require.NoError(t, err, c.in)
		for i := 0; i < 100; i++ {
			d := h.Sample(rng)
			require.True(t, d >= c.lo && d <= c.hi, "%s: %v", c.in, d)
		}
		if c.in != "0" {
			require.Equal(t, c.in, h.String())
		}
	}
	for _, bad := range []string{"10us", "fixed:", "fixed:-1s", "exp:abc", "uniform:5us", "uniform:2ms-1ms", "normal:1ms"} {
		_, err := ParseHold(bad)
		require.ErrorIs(t, err, ErrUsage, bad)
	}
}

func TestConfigValidate(t *testing.T) {
	good := func() Config {
		c := Config{Worker: []string{"x"}}
		c.Defaults()
		return c
	}
	c := good()
	require.NoError(t, c.Validate())
	require.Equal(t, 4, c.Procs)
	require.Equal(t, 5*time.Second, c.Duration)
	for _, mut := range []func(*Config){
		func(c *Config) { c.Procs = -1 },
		func(c *Config) { c.Names = 0 },
		func(c *Config) { c.Shared = 1.5 },
		func(c *Config) { c.Steal = -0.1 },
		func(c *Config) { c.Backend = "mutex" },
		func(c *Config) { c.Chaos = -1 },
		func(c *Config) { c.Worker = nil },
		func(c *Config) { c.Ops = -3 },
		func(c *Config) { c.Fairness = "bounded:0s" },
		func(c *Config) { c.Fairness = "lifo" },
	} {
		c := good()
		mut(&c)
		require.ErrorIs(t, c.Validate(), ErrUsage)
	}
}

func TestWriteText(t *testing.T) {
	rep := &Report{Backend: "shmlocks", Seed: 7, Procs: 2, Goroutines: 1, Names: 1, Hold: "none", Ops: 10,
		Violations: 1, ViolationMessages: []string{"boom"}, Table: "/x/t.tbl",
		AcquireWaitByMode: map[string]Percentiles{"exclusive": {Count: 3, P50: 1.5}}}
	var b bytes.Buffer
	require.NoError(t, WriteText(&b, []*Report{rep, rep}))
	out := b.String()
	require.Contains(t, out, "seed 7")
	require.Contains(t, out, "acquire wait, exclusive [shmlocks]")
	require.Contains(t, out, "1 VIOLATIONS")
	require.Contains(t, out, "boom")
}
