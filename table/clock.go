package table

import (
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The table's clock: the times written in the table (a request's enqueue
// and grant times, which Query shows and the deadlock rule orders waits
// by) and the process-wide monotonic clock of the waiting policy. A grant
// made at once reads none of it: it takes the coarse clock (stamp.go).
//
// A queued request's enqueue and its grant read the clock, two reads per
// grant from a queue: through the vDSO a visible share of a grant when the
// goroutines of one process hand a name round (docs/experiments.md). Where the kernel itself keeps time
// with the CPU's time-stamp counter (Linux clocksource "tsc": constant,
// synchronised across CPUs), MonoNow reads the counter (RDTSC, 10 ns) and
// scales it by a base that pairs a counter reading with the monotonic
// clock, renewed at least once a second, with the counter's rate measured
// between two bases (tscClock). Elsewhere, or with SHMLOCKS_CLOCK=mono in
// the environment, it reads the monotonic clock.

// origin is the origin of MonoNow: this process's first use of the package.
var origin = time.Now()

// MonoNow is this process's monotonic clock: nanoseconds since origin. The
// table's times are taken from it (wallAt), and EnqueuedMono reads a
// request's enqueue stamp back in its scale, so that a request that queues
// and then parks reads the clock once. It stays within
// microseconds of time.Since(origin) and does not run backwards in a
// process (but see tscClock for a counter that misbehaves).
func MonoNow() int64 { return tsc.now() }

// now is the reading: extrapolated from the base (the counter is read
// only while there is one), or the slow path's.
func (c *tscClock) now() int64 {
	if b := c.base.Load(); b != nil {
		if d := c.ticks() - b.tick; d < b.limit {
			return b.mono + int64((d*b.mult)>>32)
		}
	}
	return c.slow()
}

// nowNano is the time written in the table: unix nanoseconds, read as the
// wall clock of a base taken at most a second ago plus the monotonic clock
// since. A step of the wall clock shows within a second; the values are
// for display and the deadlock rule's order of waits, which every process
// reads from the same words.
func nowNano() int64 { return wallAt(MonoNow()) }

// wallAt converts mono, a MonoNow reading taken just now, to unix
// nanoseconds by the current base, taking a new base once a second.
// Every reading also refreshes the coarse clock of grants made at once
// (stamp.go).
func wallAt(mono int64) int64 {
	if b := clockBase.Load(); b != nil {
		if d := mono - b.mono; d > -int64(time.Second) && d < int64(time.Second) {
			refreshCoarse(b.wall + d)
			return b.wall + d
		}
	}
	t := time.Now()
	m := int64(t.Sub(origin))
	clockBase.Store(&wallBase{mono: m, wall: t.UnixNano()})
	refreshCoarse(t.UnixNano() - (m - mono))
	return t.UnixNano() - (m - mono)
}

// EnqueuedMono returns the MonoNow reading at which waiting request r was
// queued, read back from its slot's enqueue stamp by the current base: a
// clock for its owner's park that costs no clock read. A stamp that is not
// within a second of the base (none written, a rewritten slot, garbage)
// gives MonoNow().
func (t *Table) EnqueuedMono(r Ref) int64 {
	if b := clockBase.Load(); b != nil && r.Slot < uint32(t.l.MaxRequests) {
		wall := int64(atomic.LoadUint64(t.u64(t.slotOff(r.Slot) + slEnqueue)))
		if d := wall - b.wall; d > -int64(time.Second) && d < int64(time.Second) {
			return b.mono + d
		}
	}
	return MonoNow()
}

type wallBase struct {
	mono int64 // MonoNow at the base
	wall int64 // unix nanoseconds at the base
}

var clockBase atomic.Pointer[wallBase]

// The counter clock's parameters.
const (
	rebaseEvery    = time.Second           // a base extrapolates at most this far
	calibrateAfter = 10 * time.Millisecond // the first rate is measured over at least this
	maxBracket     = 1 << 17               // counter ticks around a monotonic read; more: preempted, not a pair
	maxRateChange  = 0.01                  // between two bases; more: the counter is not a clock here
	maxLead        = int64(time.Millisecond)
)

// tscClock turns counter readings into MonoNow readings.
//
// A base (tick, mono) says that the counter read tick when MonoNow was
// mono; a reading d ticks later is mono + d*mult/2^32, for d below limit
// (rebaseEvery at the measured rate). A reading past the limit, before the
// first base, or after the counter ran backwards takes the slow path:
// time.Since(origin) bracketed by two counter reads (an anchor), and a new
// base once an anchor is calibrateAfter older than the previous one (the
// rate is the monotonic time between the two anchors over their ticks).
// The new base never starts below what the old one extrapolates to at its
// tick, and a lead over the monotonic clock (a rate measured a little
// fast) is slewed out over the next rebaseEvery by a slower mult, so
// readings never run backwards. A rate that moves by more than
// maxRateChange between bases, or a counter that runs backwards, turns the
// counter off for good: MonoNow is then time.Since(origin), and that
// once may step back by what the last base led (a lead of maxLead or more
// is not kept either). Such a counter is one the kernel would not keep
// time with (a guest migrated to another host, say): the readings are for
// display and rate limits, which a step costs at most a late tick.
type tscClock struct {
	base   atomic.Pointer[tscBase] // nil: not calibrated (or off): the slow path
	anchor atomic.Pointer[tscPair] // the last (tick, time.Since) pair taken
	rate   atomic.Uint64           // float64 bits: ns per tick between the last two anchors (0: none yet)
	state  atomic.Int32            // tscUnknown, tscOn, tscOff
	once   sync.Once

	// The sources (the real ones, or a test's).
	ticks  func() uint64
	since  func() int64 // monotonic ns since origin
	usable func() bool  // asked once: may the counter be used at all?
}

type tscBase struct {
	tick  uint64
	mono  int64
	mult  uint64 // ns per tick, 32.32 fixed point
	limit uint64 // ticks after tick that may be extrapolated
}

type tscPair struct {
	tick uint64
	mono int64
}

const (
	tscUnknown int32 = iota
	tscOn
	tscOff
)

var tsc = &tscClock{
	ticks:  rdtsc,
	since:  func() int64 { return int64(time.Since(origin)) },
	usable: tscUsable,
}

// tscUsable reports whether this machine's kernel keeps time with the
// counter (then it is constant and synchronised across CPUs), unless
// SHMLOCKS_CLOCK=mono.
func tscUsable() bool {
	if !haveRDTSC || os.Getenv("SHMLOCKS_CLOCK") == "mono" {
		return false
	}
	b, err := os.ReadFile("/sys/devices/system/clocksource/clocksource0/current_clocksource")
	return err == nil && strings.TrimSpace(string(b)) == "tsc"
}

// slow is MonoNow without a base to extrapolate from.
func (c *tscClock) slow() int64 {
	if c.state.Load() == tscUnknown {
		c.once.Do(func() {
			if c.usable() {
				c.state.Store(tscOn)
			} else {
				c.state.Store(tscOff)
			}
		})
	}
	if c.state.Load() != tscOn {
		return c.since()
	}
	t0 := c.ticks()
	m := c.since()
	t1 := c.ticks()
	if t1 < t0 || t1-t0 > maxBracket {
		return c.floor(m, t0) // preempted between the reads (or a backward step): no anchor
	}
	return c.update(t0+(t1-t0)/2, m)
}

// floor returns m, or what the current base extrapolates to at tick if
// that is later (by less than maxLead): MonoNow does not run backwards.
func (c *tscClock) floor(m int64, tick uint64) int64 {
	if b := c.base.Load(); b != nil && tick >= b.tick {
		e := b.mono + int64(float64(tick-b.tick)*float64(b.mult)/(1<<32))
		if e > m && e-m < maxLead {
			return e
		}
	}
	return m
}

// update takes the anchor (tick, m) and, once it is calibrateAfter past
// the previous one, a new base from it; it returns the reading to report.
func (c *tscClock) update(tick uint64, m int64) int64 {
	prev := c.anchor.Load()
	if prev == nil {
		c.anchor.Store(&tscPair{tick, m})
		return m
	}
	if tick <= prev.tick {
		// Two slow paths at once can store their anchors out of order by
		// up to a bracket; more than that while time went on: the counter
		// ran backwards.
		if prev.tick-tick > maxBracket && m > prev.mono {
			c.off()
		}
		return c.floor(m, tick)
	}
	dm := m - prev.mono
	if dm < int64(calibrateAfter) {
		return c.floor(m, tick)
	}
	rate := float64(dm) / float64(tick-prev.tick)
	if old := math.Float64frombits(c.rate.Load()); old != 0 && math.Abs(rate/old-1) > maxRateChange {
		c.off()
		return c.floor(m, tick)
	}
	rep := c.floor(m, tick)
	lead := rep - m // >= 0: the old base ran a little fast; slew it out
	slew := rate * (1 - float64(lead)/float64(rebaseEvery))
	c.base.Store(&tscBase{
		tick:  tick,
		mono:  rep,
		mult:  uint64(slew * (1 << 32)),
		limit: uint64(float64(rebaseEvery) / rate),
	})
	c.anchor.Store(&tscPair{tick, m})
	c.rate.Store(math.Float64bits(rate))
	return rep
}

// off turns the counter off for good.
func (c *tscClock) off() {
	c.state.Store(tscOff)
	c.base.Store(nil)
}
