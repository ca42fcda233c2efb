package table

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// Fencing tokens never go backwards for one name, on every path that grants
// or moves a grant, across the carry of the entry's 32-bit counter into the
// token's high word. Each case starts the name's tokens a few grants before
// the carry and drives one path across it; every grant's token must be larger
// than every token granted before it.

// carryEnv is a fastEnv whose name "y" starts tokens just below a carry.
type carryEnv struct {
	*fastEnv
	pid    int
	tokens []uint64 // in grant order
}

const carryHigh = uint64(5) << 32

func newCarryEnv(t *testing.T) *carryEnv {
	f := newFastEnv(t)
	b := f.tb.BucketOf(Hash("y"))
	*f.tb.u64(f.tb.bucketOff(b) + bkMaxToken) = carryHigh | (lo32 - 4)
	return &carryEnv{fastEnv: f, pid: 200}
}

func (c *carryEnv) newAgent() (*Agent, int) {
	c.pid++
	return c.agent(c.pid), c.pid
}

// granted records a token in grant order.
func (c *carryEnv) granted(tok uint64) {
	c.t.Helper()
	if n := len(c.tokens); n > 0 {
		require.Greater(c.t, tok, c.tokens[n-1], "token %#x granted after %#x", tok, c.tokens[n-1])
	}
	c.tokens = append(c.tokens, tok)
}

func TestTokensIncreaseAcrossCarry(t *testing.T) {
	cases := []struct {
		name string
		step func(c *carryEnv, a *Agent)
	}{
		{"fast", func(c *carryEnv, a *Agent) {
			r, out, tok := c.acquire(a, "y", ModeExclusive, false)
			require.Equal(c.t, Granted, out)
			c.granted(tok)
			require.NoError(c.t, c.release(a, r))
		}},
		{"latched", func(c *carryEnv, a *Agent) {
			// Shared requests always take the latch path.
			r, out, tok := c.acquire(a, "y", ModeShared, false)
			require.Equal(c.t, Granted, out)
			c.granted(tok)
			require.NoError(c.t, c.release(a, r))
		}},
		{"steal", func(c *carryEnv, a *Agent) {
			r, out, tok := c.acquire(a, "y", ModeExclusive, false)
			require.Equal(c.t, Granted, out)
			c.granted(tok)
			b, _ := c.newAgent()
			rb, out, tokB := c.acquire(b, "y", ModeExclusive, true)
			require.Equal(c.t, Granted, out)
			c.granted(tokB)
			require.ErrorIs(c.t, c.release(a, r), ErrStolen)
			require.NoError(c.t, c.release(b, rb))
			require.NoError(c.t, c.tb.Deregister(b, new(Wakes)))
		}},
		{"steal-between-fast-CAS-and-return", func(c *carryEnv, a *Agent) {
			b, _ := c.newAgent()
			var stealTok uint64
			var rb Ref
			setCrashHook(func(p string) {
				if p != "fast.held" {
					return
				}
				setCrashHook(nil)
				var w Wakes
				var out Outcome
				var err error
				rb, out, stealTok, err = c.tb.Acquire(b, "y", Hash("y"), ModeExclusive, false, true, &w)
				require.NoError(c.t, err)
				require.Equal(c.t, Granted, out)
			})
			defer setCrashHook(nil)
			var w Wakes
			r, out, tok, err := c.tb.Acquire(a, "y", Hash("y"), ModeExclusive, false, false, &w)
			require.NoError(c.t, err)
			require.Equal(c.t, Granted, out)
			setCrashHook(nil)
			c.granted(tok)
			if stealTok == 0 {
				// The latch path granted it (the counter was at its end): no race.
				require.NoError(c.t, c.release(a, r))
			} else {
				c.granted(stealTok)
				require.ErrorIs(c.t, c.release(a, r), ErrStolen)
				require.NoError(c.t, c.release(b, rb))
			}
			require.NoError(c.t, c.tb.Deregister(b, new(Wakes)))
		}},
		{"reap", func(c *carryEnv, a *Agent) {
			d, pid := c.newAgent()
			_, out, tok := c.acquire(d, "y", ModeExclusive, false)
			require.Equal(c.t, Granted, out)
			c.granted(tok)
			r, out, _ := c.acquire(a, "y", ModeExclusive, false)
			require.Equal(c.t, Queued, out)
			c.live.kill(pid)
			var w Wakes
			n, err := c.tb.ReapDead(a, &w)
			require.NoError(c.t, err)
			require.Equal(c.t, 1, n)
			c.check(a)
			st, tokA, ok := c.tb.Status(a, r)
			require.True(c.t, ok)
			require.Equal(c.t, uint8(SlotHeld), st, "the survivor is granted")
			c.granted(tokA)
			require.NoError(c.t, c.release(a, r))
		}},
		{"repair", func(c *carryEnv, a *Agent) {
			// A holds y by the fast path; an agent latches y's bucket, marks
			// the hold for inflation and dies; A's release takes the latch
			// over and repair rebuilds the bucket; the next grant follows.
			r, out, tok := c.acquire(a, "y", ModeExclusive, false)
			require.Equal(c.t, Granted, out)
			c.granted(tok)
			d, pid := c.newAgent()
			bk := c.tb.BucketOf(Hash("y"))
			var w Wakes
			require.NoError(c.t, c.tb.latch(d, bk, &w))
			e, err := c.tb.findEntry(bk, "y", Hash("y"))
			require.NoError(c.t, err)
			fp := c.tb.u64(c.tb.entryOff(e) + enFast)
			if v := atomic.LoadUint64(fp); c.isFast(r) {
				require.True(c.t, atomic.CompareAndSwapUint64(fp, v, v|fastInfl))
			}
			c.live.kill(pid)
			require.NoError(c.t, c.release(a, r))
			_, err = c.tb.ReapDead(a, &w)
			require.NoError(c.t, err)
			c.check(a)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCarryEnv(t)
			a, _ := c.newAgent()
			for i := 0; i < 10; i++ {
				tc.step(c, a)
			}
			// One more plain grant after the path: it follows them all.
			r, out, tok := c.acquire(a, "y", ModeExclusive, false)
			require.Equal(t, Granted, out)
			c.granted(tok)
			require.NoError(t, c.release(a, r))
			require.Greater(t, c.tokens[len(c.tokens)-1], carryHigh|lo32, "the path crossed the carry")
			require.NoError(t, c.tb.Check(nil))
		})
	}
}
