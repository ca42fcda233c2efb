package manager

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/shmlocks/shmlocks/table"
)

// Statistics are kept only by a Manager opened with OpenOptions.Stats: then
// every request costs an atomic add on this Manager's counters, and a
// request that queues two clock reads and three more adds. Without it the
// request paths test one plain field (Manager.stats, written once by Open)
// and count nothing, so the uncontended Acquire+Release is unchanged.

// Outcome is what became of a request, as counted by Stats.
type Outcome int

const (
	OutcomeGranted      Outcome = iota // the lock was granted (at once or after a wait)
	OutcomeNotAvailable                // IfAvailable and not grantable at once
	OutcomeAborted                     // ctx ended before the grant
	OutcomeStolen                      // granted and taken away before the waiter saw it, or removed by a reap
	OutcomeFailed                      // any other error: closed, table full, corrupt, not supported
	NumOutcomes                        // the number of outcomes
)

// String returns the outcome's name as a metric label: "granted",
// "not_available", "aborted", "stolen" or "failed".
func (o Outcome) String() string {
	switch o {
	case OutcomeGranted:
		return "granted"
	case OutcomeNotAvailable:
		return "not_available"
	case OutcomeAborted:
		return "aborted"
	case OutcomeStolen:
		return "stolen"
	case OutcomeFailed:
		return "failed"
	}
	return "unknown"
}

// outcomeOf classifies a request's error.
func outcomeOf(err error) Outcome {
	switch {
	case err == nil:
		return OutcomeGranted
	case errors.Is(err, ErrNotAvailable):
		return OutcomeNotAvailable
	case errors.Is(err, ErrAborted):
		return OutcomeAborted
	case errors.Is(err, ErrStolen):
		return OutcomeStolen
	}
	return OutcomeFailed
}

// waitBounds are the upper bounds (inclusive) of the wait-time histogram's
// buckets (WaitHistogram.Bound): 1 µs, 4 µs, 16 µs, ... 4^13 µs (about
// 67 s); a last bucket, WaitHistogram.Counts[len(waitBounds)], holds the
// longer waits.
var waitBounds = func() [14]time.Duration {
	var b [14]time.Duration
	for i := range b {
		b[i] = time.Microsecond << (2 * i)
	}
	return b
}()

// waitBucket returns the index of the bucket of a wait of ns nanoseconds:
// the first i with ns ≤ waitBounds[i], or len(waitBounds).
func waitBucket(ns int64) int {
	if ns <= 1000 {
		return 0
	}
	us := uint64(ns-1) / 1000 // ns in (4^(i-1) µs, 4^i µs] gives i
	i := (bits.Len64(us) + 1) / 2
	return min(i, len(waitBounds))
}

// WaitHistogram is the distribution of the time granted requests spent
// queued, from joining their name's queue to the grant; a request granted
// without queueing counts as a wait of 0 (the clock is read only for a
// request that queues). Counts are per bucket (not cumulative); Counts[i]
// counts the waits in (Bound(i-1), Bound(i)], the last element those above
// the last bound.
type WaitHistogram struct {
	Counts [len(waitBounds) + 1]uint64
	Count  uint64        // every recorded wait
	Sum    time.Duration // their total
}

// Bound returns the upper bound (inclusive) of bucket i of Counts: 1 µs,
// 4 µs, 16 µs, ... 4^13 µs (about 67 s) for i from 0 to len(Counts)-2;
// the last bucket has none (math.MaxInt64).
func (WaitHistogram) Bound(i int) time.Duration {
	if i < len(waitBounds) {
		return waitBounds[i]
	}
	return math.MaxInt64
}

// Stats is a snapshot of a Manager's counters (see OpenOptions.Stats) and of
// its table's usage.
type Stats struct {
	// Enabled reports whether this Manager counts requests (OpenOptions.Stats).
	// Without it the request counters and histograms below are zero; the
	// usage and the table-wide counters are always filled in.
	Enabled bool

	// Requests counts this Manager's requests by mode and outcome:
	// Requests[Exclusive][OutcomeGranted], ...
	Requests [2][NumOutcomes]uint64
	// Wait is the time this Manager's granted requests spent queued, by mode.
	Wait [2]WaitHistogram
	// Steals counts this Manager's granted Steal requests (stealer side).
	Steals uint64
	// LocksLost counts locks held by this Manager that were taken away (a
	// steal by another request, or a reap of this agent).
	LocksLost uint64
	// Reaps counts the dead agents this Manager reaped; Repairs the bucket
	// latches it took over from dead owners (and rebuilt the buckets of).
	Reaps, Repairs uint64
	// Corrupt counts the times this Manager met a corrupt or truncated table.
	Corrupt uint64

	// Usage is the table's use against Geometry (read without latching:
	// advisory). Usage.Reaps and Usage.Repairs count table-wide, for the
	// life of the file.
	Usage    table.Usage
	Geometry table.Geometry
}

// stats holds the counters of a Manager opened with OpenOptions.Stats.
type stats struct {
	requests [2][NumOutcomes]atomic.Uint64
	wait     [2]waitCounters
	steals   atomic.Uint64
	lost     atomic.Uint64
	reaps    atomic.Uint64
	repairs  atomic.Uint64
	corrupt  atomic.Uint64
}

// waitCounters count the waits of queued requests; the requests granted at
// once are the granted outcomes not counted here (Stats adds them to the
// first bucket).
type waitCounters struct {
	counts [len(waitBounds) + 1]atomic.Uint64
	n      atomic.Uint64 // the sum of counts
	sum    atomic.Int64
}

// modeIndex maps a mode to its counters (an invalid mode, refused by
// validate, counts as exclusive).
func modeIndex(mode Mode) int {
	if mode == Shared {
		return 1
	}
	return 0
}

// record counts one request that ended with err.
func (s *stats) record(mode Mode, err error) {
	s.requests[modeIndex(mode)][outcomeOf(err)].Add(1)
}

// observeWait counts the wait of a request granted after queueing.
func (s *stats) observeWait(mode Mode, waited time.Duration) {
	w := &s.wait[modeIndex(mode)]
	w.counts[waitBucket(int64(waited))].Add(1)
	w.n.Add(1)
	w.sum.Add(int64(waited))
}

// acquireCounted is acquire for a Manager that keeps statistics (acquire
// itself times the requests that queue).
func (m *Manager) acquireCounted(ctx context.Context, name string, opts RequestOptions) (table.Ref, uint64, error) {
	ref, token, err := m.acquire(ctx, name, opts)
	if _, child := err.(*reentry); !child { // a child grant is not a request of the table
		m.stats.record(opts.Mode, err)
	}
	return ref, token, err
}

// Stats returns a snapshot of the Manager's counters and of its table's
// usage. The counters are read one by one, not as one atomic snapshot. If
// the table cannot be read (ErrCorrupt), the counters are still returned,
// with the error.
func (m *Manager) Stats() (Stats, error) {
	var st Stats
	if err := m.tableOnly("Stats"); err != nil {
		return st, err
	}
	if !m.enter() {
		return st, ErrClosed
	}
	defer m.leave()
	if s := m.stats; s != nil {
		st.Enabled = true
		for mi := range s.requests {
			for o := range s.requests[mi] {
				st.Requests[mi][o] = s.requests[mi][o].Load()
			}
			w, h := &s.wait[mi], &st.Wait[mi]
			for i := range w.counts {
				h.Counts[i] = w.counts[i].Load()
				h.Count += h.Counts[i]
			}
			h.Sum = time.Duration(w.sum.Load())
			// The requests granted without queueing waited 0. (The counters
			// are read one by one: never let a wait counted after its
			// outcome was read make this negative.)
			if at, n := st.Requests[mi][OutcomeGranted], w.n.Load(); at > n {
				h.Counts[0] += at - n
				h.Count += at - n
			}
		}
		st.Steals, st.LocksLost = s.steals.Load(), s.lost.Load()
		st.Reaps, st.Repairs, st.Corrupt = s.reaps.Load(), s.repairs.Load(), s.corrupt.Load()
	}
	st.Geometry = m.life.t.Geometry()
	if err := table.Guard(func() error { st.Usage = m.life.t.Usage(); return nil }); err != nil {
		m.noteErr("stats", err)
		return st, fmt.Errorf("stats: %w", err)
	}
	return st, nil
}
