package manager

import (
	"fmt"
	"strings"
	"time"

	"github.com/shmlocks/shmlocks/table"
)

// Fairness is the order in which a table grants a name's requests, fixed
// when the table file is created (like its geometry: an existing file
// keeps its own; Manager.Fairness says which). See docs/waiting.md,
// "Bounded fairness".
//
// FIFO, the default, is Web Locks' order: per name, requests are granted
// in the order they were made. Bounded(d) is sync.Mutex's design across
// processes: a request may take a free name ahead of queued ones while the
// oldest of them has waited less than d; once it has waited d, grants
// follow arrival order until no queued request has waited d (the queue is
// served in order, and requests arriving meanwhile queue behind it). While
// the oldest has waited d/2 to d, a release serves the releasing process's
// own requests that have waited d/2 before older ones of other processes
// (a batch per process: fewer hand-offs between processes). Query shows
// each queue in arrival order, and a request waits at most d plus the
// hand-offs to the requests ahead of it. A request that does not wait (IfAvailable,
// or any request finding the name free) may take the name ahead of the
// queue in the same cases, so IfAvailable may be granted while requests
// are queued. Steal, abort, reaping, deadlock detection and WaitUnlocked
// keep their contracts; WaitUnlocked returns when a request in its mode
// would have been granted at once, a barge included. A Manager on a
// bounded table applies OpenOptions.HandOver's rules whatever its options
// say, so that the goroutines of a process take turns at the name.
type Fairness struct {
	bounded bool
	d       time.Duration
}

// FIFO is strict arrival order per request (Web Locks): the default.
var FIFO Fairness

// Bounded lets a request take a free name ahead of queued ones while the
// oldest of them has waited less than d; once it has waited d, grants
// follow arrival order until the queue is served (sync.Mutex's starvation
// mode). d must be in (0, MaxFairnessBound]: Open refuses other values with
// ErrNotSupported.
func Bounded(d time.Duration) Fairness { return Fairness{bounded: true, d: d} }

// MaxFairnessBound is the largest d of Bounded.
const MaxFairnessBound = table.MaxFairnessBound

// IsBounded reports whether f is Bounded(d), and d.
func (f Fairness) IsBounded() (time.Duration, bool) { return f.d, f.bounded }

// String returns "fifo" or "bounded:D" (ParseFairness reads both).
func (f Fairness) String() string {
	if !f.bounded {
		return "fifo"
	}
	return "bounded:" + f.d.String()
}

// ParseFairness parses "fifo" or "bounded:D" (D a time.ParseDuration
// duration, e.g. "bounded:1ms").
func ParseFairness(s string) (Fairness, error) {
	if s == "fifo" {
		return FIFO, nil
	}
	if ds, ok := strings.CutPrefix(s, "bounded:"); ok {
		d, err := time.ParseDuration(ds)
		if err == nil {
			f := Bounded(d)
			return f, f.validate()
		}
	}
	return FIFO, fmt.Errorf("%w: fairness %q: want fifo or bounded:DURATION (e.g. bounded:1ms)", ErrNotSupported, s)
}

// MarshalText is String: a Fairness travels in JSON (OpenOptions) as
// "fifo" or "bounded:D".
func (f Fairness) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

// UnmarshalText is ParseFairness.
func (f *Fairness) UnmarshalText(b []byte) error {
	v, err := ParseFairness(string(b))
	if err != nil {
		return err
	}
	*f = v
	return nil
}

// validate reports a Bounded d out of range.
func (f Fairness) validate() error {
	if f.bounded && (f.d <= 0 || f.d > MaxFairnessBound) {
		return fmt.Errorf("%w: fairness bound %v out of range (0, %v]", ErrNotSupported, f.d, MaxFairnessBound)
	}
	return nil
}

// tableBound is f as the table records it (0: FIFO).
func (f Fairness) tableBound() time.Duration {
	if !f.bounded {
		return 0
	}
	return f.d
}

// Fairness returns the fairness of the Manager's table: the one it was
// created with, whatever this Manager's OpenOptions asked for. FIFO on a
// Manager of another backend.
func (m *Manager) Fairness() Fairness {
	if m.life.t == nil {
		return FIFO
	}
	if d := m.life.t.Bound(); d > 0 {
		return Bounded(d)
	}
	return FIFO
}

// takeTurn: waiting request ref, first in its queue of a bounded table,
// takes the name if nothing in the way holds it (table.TakeTurn; a release
// left it the name, or is about to). With rearm (a parked request) it sets
// its park mark first: a release that left it the name cleared the mark
// when it woke it, and one that leaves it the name after the latched look
// below must wake it again (it reads the mark under the latch that look
// also takes). It reports whether ref holds the name now.
func (m *Manager) takeTurn(ref table.Ref, rearm bool) bool {
	if rearm {
		m.life.t.MarkParked(ref, true)
	}
	if !m.enter() {
		return false // the parking loop reports ErrClosed
	}
	var w table.Wakes
	ok, _ := m.life.t.TakeTurn(m.life.a, ref, &w) // an error: the next look at the slot decides
	if !w.Empty() {
		m.deliver(&w)
	}
	m.leave()
	return ok
}
