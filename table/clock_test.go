package table

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeCounter is a time-stamp counter and a monotonic clock under a test's
// control: ns is the true time since origin; the counter reads
// start + ns*rate, or what the test sets.
type fakeCounter struct {
	ns    int64
	start uint64
	rate  float64 // ticks per ns
	at    uint64  // counter value at ns0 (after a change of rate)
	ns0   int64
	jump  uint64 // added to the second of each pair of reads (a preempted bracket)
	reads int
}

func (f *fakeCounter) ticks() uint64 {
	f.reads++
	v := f.at + uint64(float64(f.ns-f.ns0)*f.rate)
	if f.reads%2 == 0 {
		v += f.jump
	}
	return v
}

// setRate changes the counter's rate from now on.
func (f *fakeCounter) setRate(r float64) {
	f.at, f.ns0, f.rate = f.at+uint64(float64(f.ns-f.ns0)*f.rate), f.ns, r
}

func newFakeClock(usable bool) (*tscClock, *fakeCounter) {
	f := &fakeCounter{ns: int64(time.Hour), at: 1 << 40, ns0: int64(time.Hour), rate: 3}
	c := &tscClock{ticks: f.ticks, since: func() int64 { return f.ns }, usable: func() bool { return usable }}
	return c, f
}

// newCalibratedClock is newFakeClock(true) after its first base: two
// anchors calibrateAfter apart.
func newCalibratedClock() (*tscClock, *fakeCounter) {
	c, f := newFakeClock(true)
	c.read()
	f.ns += int64(calibrateAfter)
	c.read()
	return c, f
}

// read is MonoNow on c.
func (c *tscClock) read() int64 { return c.now() }

// TestTSCClock: the counter clock reads the monotonic clock until its
// first rate is measured, then extrapolates exactly at a constant rate,
// takes a new base at least every rebaseEvery, never runs backwards when
// its rate was a little fast (the lead is slewed out), and turns itself off
// for good when the counter runs backwards or changes rate (then it may
// step back once, by what the base led).
func TestTSCClock(t *testing.T) {
	step := func(c *tscClock, f *fakeCounter, d time.Duration, prev int64) int64 {
		f.ns += int64(d)
		got := c.read()
		require.GreaterOrEqual(t, got, prev, "ran backwards at %v", time.Duration(f.ns))
		return got
	}

	t.Run("calibrates, then extrapolates", func(t *testing.T) {
		c, f := newFakeClock(true)
		require.Equal(t, f.ns, c.read(), "no base yet: the monotonic clock")
		require.Nil(t, c.base.Load())
		f.ns += int64(calibrateAfter / 2)
		require.Equal(t, f.ns, c.read())
		require.Nil(t, c.base.Load(), "too soon to measure a rate")
		f.ns += int64(calibrateAfter)
		require.Equal(t, f.ns, c.read())
		require.NotNil(t, c.base.Load(), "calibrated")
		reads := f.reads
		var prev int64
		for i := 0; i < 1000; i++ {
			prev = step(c, f, 997*time.Microsecond, prev)
			require.InDelta(t, float64(f.ns), float64(prev), 2, "read %d", i)
		}
		require.Less(t, f.reads-reads, 1000+2*10, "about one slow read per rebaseEvery")
	})

	t.Run("a fast rate's lead is slewed out", func(t *testing.T) {
		c, f := newCalibratedClock()
		f.setRate(3 * (1 + 5e-4)) // the counter speeds up: the base now runs 500 µs/s fast
		var prev, lead int64
		for i := 0; i < 15000; i++ { // steps shorter than the lead: a step back would show
			prev = step(c, f, 200*time.Microsecond, prev)
			lead = max(lead, prev-f.ns)
		}
		require.Greater(t, lead, int64(400*time.Microsecond), "the fast base led")
		require.Less(t, lead, maxLead)
		require.InDelta(t, float64(f.ns), float64(prev), float64(2*time.Microsecond), "slewed back to the monotonic clock")
		require.Equal(t, tscOn, c.state.Load())
	})

	t.Run("a preempted bracket is no anchor", func(t *testing.T) {
		c, f := newFakeClock(true)
		c.read()
		f.jump = maxBracket + 1
		f.ns += int64(calibrateAfter)
		require.Equal(t, f.ns, c.read())
		require.Nil(t, c.base.Load())
		f.jump = 0
		f.ns += int64(calibrateAfter)
		c.read()
		require.NotNil(t, c.base.Load())
	})

	t.Run("a counter that runs backwards turns it off", func(t *testing.T) {
		c, f := newCalibratedClock()
		require.NotNil(t, c.base.Load())
		f.at -= 1 << 30 // backwards: past the base's limit, to the slow path
		f.ns += int64(time.Millisecond)
		got := c.read()
		require.LessOrEqual(t, got, f.ns+maxLead)
		require.Equal(t, tscOff, c.state.Load())
		f.ns += int64(time.Second)
		require.Equal(t, f.ns, c.read(), "off: the monotonic clock")
	})

	t.Run("racing anchors do not turn it off", func(t *testing.T) {
		// Two goroutines in the slow path at once: the one whose bracket
		// ended later stored its anchor first, with a later midpoint tick
		// but an earlier monotonic reading.
		c, _ := newFakeClock(true)
		c.once.Do(func() {})
		c.state.Store(tscOn)
		c.update(1000, 5000)
		c.update(1000+3*uint64(calibrateAfter)+220, 5000+int64(calibrateAfter)+215)
		require.NotNil(t, c.base.Load())
		c.update(1000+3*uint64(calibrateAfter)+200, 5000+int64(calibrateAfter)+290)
		require.Equal(t, tscOn, c.state.Load())
		require.NotNil(t, c.base.Load())
	})

	t.Run("a rate that changes turns it off", func(t *testing.T) {
		c, f := newCalibratedClock()
		f.setRate(3 * 1.05) // the base now runs 5% fast: once off, the clock steps back by its lead
		for i := 0; i < 1500 && c.state.Load() == tscOn; i++ {
			f.ns += int64(time.Millisecond)
			got := c.read()
			require.LessOrEqual(t, got, f.ns+int64(time.Second/15), "read %d", i)
		}
		require.Equal(t, tscOff, c.state.Load())
		f.ns += int64(2 * time.Second)
		require.Equal(t, f.ns, c.read())
	})

	t.Run("not usable", func(t *testing.T) {
		c, f := newFakeClock(false)
		for i := 0; i < 3; i++ {
			f.ns += int64(calibrateAfter)
			require.Equal(t, f.ns, c.read())
		}
		require.Nil(t, c.base.Load())
		require.Equal(t, tscOff, c.state.Load())
		require.Zero(t, f.reads, "the counter is never read")
	})
}

// TestMonoNowTracksSince: the process's clock, whichever source it uses,
// stays within 100 µs of time.Since(origin) and never runs backwards.
func TestMonoNowTracksSince(t *testing.T) {
	var prev int64
	deadline := time.Now().Add(50 * time.Millisecond) // past calibrateAfter, for a process that just started
	for i := 0; time.Now().Before(deadline) || i < 1000; i++ {
		a := int64(time.Since(origin))
		got := MonoNow()
		b := int64(time.Since(origin))
		require.GreaterOrEqual(t, got, a-int64(100*time.Microsecond), "read %d", i)
		require.LessOrEqual(t, got, b+int64(100*time.Microsecond), "read %d", i)
		require.GreaterOrEqual(t, got, prev, "read %d ran backwards", i)
		prev = got
	}
	t.Logf("counter clock state %d (1 on, 2 off)", tsc.state.Load())
}
