package manager

import (
	"sync/atomic"

	"github.com/shmlocks/shmlocks/internal/testhooks"
)

// Turns: with OpenOptions.HandOver, when a release gives the goroutine's
// P to the other goroutines of this process (docs/waiting.md, "Hand-over
// at a release"). Like the waiting policy it decides who runs, never who
// is granted: the table's queue alone orders requests, and a yield happens
// only after a release has completed, so no request is made later than
// its call.
//
// Two rules, on a table no more crowded than this process's CPUs:
//
//   - Hand-over: a release that granted a request of ours (DeliverLocal
//     poked its sleeping goroutine) yields the P to it, as sync.Mutex does
//     in starvation mode. Without it the grant sits on a goroutine that
//     cannot run until the releaser blocks: every hand-off between two
//     goroutines of one process waits for the releaser's next request to
//     queue and park first (the convoy of strict FIFO: one park and one
//     wake-up per grant).
//   - Turn-taking: while some goroutine of ours is in such a yield (it is
//     runnable and will want a lock again), every turnBatch-th release of
//     ours (turnBatchBounded-th on a bounded table) yields too, even one
//     that granted nobody. Once the hand-overs have run a queue empty, the
//     releaser would otherwise take the idle name again and again by the
//     uncontended path until preempted (10 ms) while its siblings wait in
//     the run queue.
//
// The goroutines in Go's run queue have not asked for the lock, so
// fairness per goroutine is the scheduler's, not the queue's (goroutines
// yielded to the global run queue wait there while others circulate
// through the Ps' runnext slots). Hence off by default (docs/experiments.md).
//
// On a crowded FIFO table (more agents than this process has usable CPUs,
// waitpolicy.go) neither rule yields: there a yield keeps a second
// goroutine of ours runnable (the releaser) while the other processes'
// holders need the CPUs. A table of bounded fairness has both rules
// always, crowded or not: there the name goes to requests that run, and
// the goroutines of a process take turns at it only through these yields
// (at 4 x 16 on 2 CPUs, max/min grants per goroutine 3.4-9.9 without them
// on a crowded table, 1.7-2.2 with; docs/experiments.md).

// turnBatch is how many releases of a Manager pass between two
// turn-taking yields while one of its goroutines is in a yield: often
// enough for grants per goroutine to stay even, rarely enough to keep the
// hand-overs' throughput (docs/experiments.md).
const turnBatch = 16

// turnBatchBounded is turnBatch on a table of bounded fairness. There the
// table's turns (turnEvery, below) already pass the name to the oldest
// request of the process, and each turn-taking yield is a Gosched that, with
// a P idle, wakes a thread of the process that finds nothing to run and
// sleeps again: at 4 x 16 on 2 CPUs a yield every 256 releases did
// 1.25-1.3x the grants per second of one every 16, max/min grants per
// goroutine 1.1-1.6 against 1.1-1.4 (1,024: 1.7-1.8; never: 2.2-2.9).
// A FIFO table with HandOver keeps 16: there the yields are what make
// grants per goroutine even (1.02 against 1.15-1.21 at 1 x 64 with 256).
const turnBatchBounded = 256

// batch is this Manager's turnBatch.
func (m *Manager) batch() uint64 {
	if m.cfg.bounded {
		return turnBatchBounded
	}
	return turnBatch
}

// afterRelease applies the two rules after a release of ours that
// succeeded, in a Manager opened with HandOver (the caller tests
// m.handOver, so that the default Release makes no call); handedOver: it
// poked a sleeping request of ours.
func (m *Manager) afterRelease(handedOver bool) {
	if !handedOver && m.turn.yielding.Load() == 0 {
		return // the uncontended path: one load
	}
	if !m.cfg.bounded && m.view.agents.Load() > m.view.usable.Load() {
		return // a crowded FIFO table (as last refreshed)
	}
	if !handedOver && m.turn.turns.Add(1)%m.batch() != 0 {
		return
	}
	m.turn.yielding.Add(1)
	m.gosched()
	m.turn.yielding.Add(-1)
}

// Turns on a bounded table (table.ReleaseTurn): on a crowded table, every
// turnEvery-th grant of a name (by its fencing token, so that the check
// costs no shared word) that a Manager releases while another request of
// its own waits hands the name to its oldest request queued on it, ahead
// of older requests of other processes, unless the head of the queue has
// waited the bound. Running requests otherwise take a released name first,
// and a goroutine of a process that runs takes it again and again while
// its siblings wait for the bound's hand-offs: at 4 x 16 on 2 CPUs max/min
// grants per goroutine 1.7-2.5 without turns, 1.1-1.3 with (with patience,
// waitpolicy.go; docs/experiments.md). The bound is unchanged: a turn is
// a grant ahead of the queue, which Bounded allows while the head has
// waited less than d.
const turnEvery = 16

// turnDue reports whether a release of a grant with this token on a bounded
// table is a turn (above): a crowded table, every turnEvery-th token, a
// request of ours waiting.
func (m *Manager) turnDue(token uint64) bool {
	if h := testhooks.TurnEvery.Load(); h != 0 {
		return token%h == 0 && m.ownWaiting()
	}
	return token%turnEvery == 0 && m.view.agents.Load() > m.view.usable.Load() && m.ownWaiting()
}

// turnState is the Manager's part of the turn rules.
type turnState struct {
	yielding atomic.Int32  // goroutines of ours in afterRelease's yield now
	turns    atomic.Uint64 // releases counted while one of them was

	yieldHook func() // tests: called instead of runtime.Gosched
}
