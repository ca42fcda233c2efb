package manager

import (
	"log/slog"
	"os"
	"time"

	"github.com/shmlocks/shmlocks/table"
)

// OpenOptions configure Open. The geometry fields are used only when the file
// is created; an existing file keeps its own. Zero fields take the defaults.
type OpenOptions struct {
	MaxResources int         // distinct names held or queued at once (default 4096)
	MaxRequests  int         // held + pending requests at once, all agents together (default 32768)
	MaxAgents    int         // open Managers at once, all processes together (default 256)
	MaxNameLen   int         // bytes (default 256)
	FileMode     os.FileMode // permission bits when created (default 0600)

	// SpinLimit bounds how long a queued request spins on its slot while
	// no grant is made on its name, before it parks (default 50µs;
	// negative: never spin, never yield the CPU before queueing, and no
	// HandOver).
	SpinLimit time.Duration

	// HandOver trades fairness per goroutine for throughput when many
	// goroutines of this process contend for a name with short sections
	// (turns.go, docs/waiting.md). A release that grants a sleeping
	// request of this Manager yields the goroutine's P to it, and while a
	// goroutine sits in such a yield every 16th release of the Manager
	// yields too, so that goroutines take turns at a name their hand-overs
	// emptied. FIFO per request is unchanged (a yield comes after a
	// release, before the caller's next request), but goroutines waiting
	// in Go's run queue have not asked yet, so fairness per goroutine is
	// the Go scheduler's. It pays for short sections and costs a queue of
	// goroutines that leave after one grant (docs/benchmarks.md has the
	// figures). It does nothing while the table has more agents than the
	// process has usable CPUs. Off by default on a FIFO table; always on
	// on a table of bounded fairness (Bounded: there requests that run
	// take a released name first, and without the hand-over the
	// goroutines that sleep get a share of the grants only at the
	// bound's hand-offs: at 1 x 64 on 2 CPUs max/min grants per goroutine
	// 2.3-4.7 without, 1.2 with, for 18% fewer grants; docs/waiting.md).
	HandOver bool

	// Fairness is the order in which the table grants a name's requests:
	// FIFO (the zero value: strict arrival order, Web Locks) or Bounded(d)
	// (a request may take a free name ahead of queued ones while the oldest
	// of them has waited less than d). Used only when the file is created;
	// an existing file keeps its own (Manager.Fairness). See fairness.go.
	Fairness Fairness

	// Stats makes the Manager count its requests by mode and outcome, their
	// time queued, steals, lost locks, reaps and repairs (see Stats): an
	// atomic add per request, and two clock reads and three adds more for a
	// request that queues. Off by default: the request paths then test one
	// field and count nothing.
	Stats bool
	// Logger receives the events an operator cares about: a dead agent
	// reaped, a bucket latch taken over, a corrupt table, a steal (both
	// sides); see events.go. nil: discard.
	Logger *slog.Logger
	// DeadlockDelay is how long a request waits before the wait-for graph
	// is checked for a cycle through it, and then again every
	// DeadlockDelay while it waits (default 1s, like PostgreSQL's
	// deadlock_timeout; negative: this Manager never checks, and its
	// requests are never chosen as victims; they still mark what their
	// task holds, so that other Managers and shmlocks dump see cycles
	// through them). See docs/multi-and-deadlock.md.
	DeadlockDelay time.Duration
}

// Defaults used for zero OpenOptions fields.
var (
	DefaultMaxResources = table.DefaultGeometry.MaxResources
	DefaultMaxRequests  = table.DefaultGeometry.MaxRequests
	DefaultMaxAgents    = table.DefaultGeometry.MaxAgents
	DefaultMaxNameLen   = table.DefaultGeometry.MaxNameLen
)

// settings are what OpenOptions set for a Manager's waits.
type settings struct {
	spin     time.Duration // OpenOptions.SpinLimit
	handOver bool          // OpenOptions.HandOver or a bounded table, and spinning allowed (turns.go)
	bounded  bool          // the table's fairness is Bounded (fairness.go)
	deadlock time.Duration // OpenOptions.DeadlockDelay; <= 0: no checks
}

// defaultSpin is the SpinLimit of a zero OpenOptions field.
const defaultSpin = 50 * time.Microsecond

func orDefault(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}
