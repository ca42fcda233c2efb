package manager

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/internal/waitgraph"
	"github.com/shmlocks/shmlocks/table"
)

// Deadlock detection (docs/multi-and-deadlock.md).
//
// Nothing of this runs on the uncontended path, nor while a waiter spins.
// When a request parks:
//
//  1. It tags the holds its task carries into the wait (carriedRefs: the
//     earlier names of an AcquireAll, the lock of Request's or RequestAll's
//     callback ctx) with its own slot and serial (table.TagHolds), so that
//     every process can follow the graph from those holds to this request;
//     also in a Manager that does not check. Holds of other goroutines of
//     the process are not linked: a goroutine that waits does not keep its
//     siblings from releasing what they hold.
//  2. If its Manager checks, its waiter is registered with the Manager's
//     rounds (under the Manager's mu, which the park holds anyway: no
//     allocation, no second lock, no clock read): one timer per Manager
//     runs a round every DeadlockDelay/2 while any of its requests is
//     parked, and a round checks those parked for DeadlockDelay at least
//     (so a process with thousands of waiters reads the table twice per
//     DeadlockDelay, not thousands of times). A park arms the timer only
//     if no round is scheduled; the rounds stop when nothing is parked.
//
// A round:
//
//  3. The round reaps dead agents (a dead holder is not a cycle, it is
//     released).
//  4. It reads the table (Snapshot: each bucket under its latch), builds the
//     graph, and for each of its requests that is on a cycle (InCycle) looks
//     for a cycle through it in which every other waiting request started
//     waiting before it: that request is then the cycle's victim (the rule:
//     the request of the cycle that started waiting last, ties by the higher
//     slot). Every process computes the same victim from the same table
//     words, so two processes checking at the same moment never both give
//     up for one cycle.
//  5. It reads the table again: a cycle is real only if every request in it
//     is the same request (slot and serial) in the same state, and every
//     edge is still there (waitgraph.Confirmed): each waited, or was held,
//     throughout the interval, so the snapshot's bucket-by-bucket latching
//     cannot have composed a phantom. It hands each confirmed victim its
//     verdict (the cycle, described, in its waiter) and wakes it (the
//     waiter's own wake-up: it looks at its verdict whenever it wakes).
//  6. A victim withdraws itself (as an aborted request) and fails with
//     ErrDeadlock naming the cycle; if it was granted meanwhile, it keeps
//     the grant.
//
// The other members keep waiting; the victim's withdrawal (and its caller
// releasing what it held) lets them proceed.

// DefaultDeadlockDelay is the DeadlockDelay of a zero OpenOptions field.
const DefaultDeadlockDelay = time.Second

// deadlockState is a Manager's bookkeeping of its rounds. Its requests are
// found in the Manager's registry of parked waiters (Manager.queues), and
// each one's state is in its waiter (waiterDeadlock): a park costs no
// allocation, no second lock and no clock read for detection. All fields
// are guarded by Manager.mu, which a park holds anyway to register its
// waiter.
type deadlockState struct {
	armed bool        // a round is scheduled or running (Manager.mu)
	epoch uint64      // rounds that have looked at the waiters (Manager.mu)
	timer *time.Timer // AfterFunc(deadlockRound), made by the first park (Manager.mu)
}

// victimHook, when set (tests only, before any Manager is opened), runs
// when a victim is about to withdraw its request: a pause there widens the
// moment in which the other members check too.
var victimHook func()

// waiterDeadlock is the deadlock state of one parked request, part of its
// waiter.
type waiterDeadlock struct {
	due     uint64                 // the first round (deadlockState.epoch) that checks it (Manager.mu)
	verdict atomic.Pointer[string] // set by a round that found it a cycle's victim, then poked
	tagged  []table.Ref            // holds tagged with this request's task tag (its goroutine)
}

// parkChecked registers parked waiter w with this Manager's rounds (m.mu
// held, m.deadlock > 0). Rounds are at least DeadlockDelay/2 apart (the
// timer is re-armed when a round ends), and w parked after round epoch
// looked: round epoch+3 is DeadlockDelay at least, and at most
// 1.5 × DeadlockDelay, after it parked. A park that arms the timer starts
// the rounds itself: round epoch+2 comes DeadlockDelay after it.
func (m *Manager) parkChecked(w *waiter) {
	if m.dl.armed {
		w.dl.due = m.dl.epoch + 3
		return
	}
	m.dl.armed = true
	w.dl.due = m.dl.epoch + 2
	if m.dl.timer == nil {
		m.dl.timer = time.AfterFunc(m.cfg.deadlock/2, m.deadlockRound)
	} else {
		m.dl.timer.Reset(m.cfg.deadlock / 2)
	}
}

// tagCarried is called when waiting request w parks with holds its task
// carries into the wait (carriedRefs, not empty): it tags them with the
// request's task tag, also in a Manager that does not check.
func (m *Manager) tagCarried(w *waiter, holds []table.Ref) {
	if !m.enter() {
		return // the parking loop reports ErrClosed
	}
	// A table error here (a latch held too long) leaves some holds
	// untagged: cycles through them go unseen; the wait reports it.
	var wk table.Wakes
	m.life.t.TagHolds(m.life.a, holds, table.TaskTag(w.ref), &wk)
	m.deliver(&wk)
	m.leave()
	w.dl.tagged = holds
}

// untagCarried clears the tags of the holds w tagged (its wait is over).
func (m *Manager) untagCarried(w *waiter) {
	if !m.enter() {
		return
	}
	defer m.leave()
	table.Guard(func() error {
		var wk table.Wakes
		_, err := m.life.t.TagHolds(m.life.a, w.dl.tagged, 0, &wk)
		m.deliver(&wk)
		return err
	})
}

// checkDeadlock is called when waiting request w of name was handed a
// verdict by a round: it takes the verdict and withdraws the request. over
// reports that the wait is over: withdrawn (err matches ErrDeadlock), or
// granted meanwhile.
func (m *Manager) checkDeadlock(ctx context.Context, name string, w *waiter) (token uint64, err error, over bool) {
	v := w.dl.verdict.Swap(nil)
	if v == nil {
		return 0, nil, false
	}
	ref := w.ref
	if h := victimHook; h != nil {
		h()
	}
	if !m.enter() {
		return 0, nil, false // the parking loop reports ErrClosed
	}
	var wk table.Wakes
	out, token, err := m.life.t.Abort(m.life.a, ref, &wk)
	if !wk.Empty() {
		m.deliver(&wk)
	}
	m.leave()
	if err == nil && out == table.Granted {
		// The cycle was broken (a member gave up, was stolen from or
		// died) and we were granted: keep it.
		token, err = m.granted(ctx, name, ref, token)
		return token, err, true
	}
	if err != nil {
		return 0, nil, false // stolen or removed meanwhile: the parking loop reports it
	}
	return 0, fmt.Errorf("lock %q: %w: %s", name, ErrDeadlock, *v), true
}

// deadlockRound runs in the Manager's round timer: it checks every request
// of this Manager that has been parked for DeadlockDelay (steps 3-5 above),
// hands the confirmed victims their verdicts and wakes them, and schedules
// the next round while any request is parked; otherwise the rounds stop
// until the next park arms them (parkChecked).
func (m *Manager) deadlockRound() {
	var ws []roundWaiter
	m.waits.mu.Lock()
	m.dl.epoch++
	m.eachWaiter(func(w *waiter) {
		if w.dl.due <= m.dl.epoch && w.dl.verdict.Load() == nil {
			ws = append(ws, roundWaiter{w, w.ref})
		}
	})
	m.waits.mu.Unlock()
	if len(ws) > 0 {
		// A table error (a latch held too long, corruption) skips this
		// round; the waiters meet the error themselves.
		table.Guard(func() error { return m.checkRound(ws) })
	}
	m.waits.mu.Lock()
	if m.waits.nwait > 0 && !m.life.closed.Load() {
		m.dl.timer.Reset(m.cfg.deadlock / 2)
	} else {
		m.dl.armed = false
	}
	m.waits.mu.Unlock()
}

// roundWaiter is a parked request a round checks: its waiter and the
// request the waiter was registered for when the round looked. A waiter is
// recycled for a later park once its request is over (recycleWaiter), so a
// round hands a verdict only to a waiter still registered for ref
// (giveVerdict).
type roundWaiter struct {
	w   *waiter
	ref table.Ref
}

// giveVerdict hands cycle description msg to rw's request and wakes it, if
// its waiter is still registered for it (m.mu): a request whose wait ended
// meanwhile is no cycle's member any more, and its waiter may serve another.
func (m *Manager) giveVerdict(rw roundWaiter, msg string) {
	m.waits.mu.Lock()
	if w := rw.w; w.q != nil && w.ref == rw.ref { // registered (m.mu), for that request
		w.dl.verdict.Store(&msg)
		w.poke()
	}
	m.waits.mu.Unlock()
}

// checkRound checks parked requests ws of this Manager.
func (m *Manager) checkRound(ws []roundWaiter) error {
	if err := m.reap(); err != nil {
		return err
	}
	if !m.enter() {
		return nil
	}
	defer m.leave()
	victim := map[int]roundWaiter{} // by the node of its request in the first read
	g, cycles, err := waitgraph.Confirmed(m.snapshot, func(g *waitgraph.Graph) [][]int {
		inCycle := g.InCycle()
		if !slices.Contains(inCycle, true) {
			return nil // the usual case: no cycle at all
		}
		var cycles [][]int
		for _, rw := range ws {
			if i := g.Find(rw.ref.Slot, rw.ref.Serial); i >= 0 && inCycle[i] {
				if c := g.CycleThrough(i, true); c != nil { // c[0] is i
					cycles = append(cycles, c)
					victim[i] = rw
				}
			}
		}
		return cycles
	})
	if err != nil {
		return err
	}
	for _, c := range cycles {
		m.giveVerdict(victim[c[0]], g.Describe(c))
	}
	return nil
}

// snapshot reads the table (each bucket under its latch): the
// waitgraph.Reader of this Manager.
func (m *Manager) snapshot() (held, pending []table.LockInfo, err error) {
	return m.life.t.Snapshot(m.life.a)
}

// WaitGraph is who waits for whom in the table at one moment: for every
// pending request, the requests it waits for (like PostgreSQL's
// pg_blocking_pids), and the wait-for cycles (deadlocks), each listed from
// its victim.
type WaitGraph struct {
	Waits  []WaitInfo   `json:"waits"`
	Cycles [][]WaitNode `json:"cycles"`
}

// WaitInfo is one pending request and what it waits for: the holders of
// its name whose mode conflicts with its own, and the requests queued ahead
// of it whose mode conflicts with its own.
type WaitInfo struct {
	Request  LockInfo   `json:"request"`
	WaitsFor []WaitNode `json:"waitsFor"`
}

// WaitNode is a request in the wait-for graph: held, or waiting.
type WaitNode struct {
	LockInfo
	Held bool `json:"held"`
}

// WaitGraph reads the wait-for graph of the table (after reaping dead agents).
func (m *Manager) WaitGraph(ctx context.Context) (WaitGraph, error) {
	wg := WaitGraph{Waits: []WaitInfo{}, Cycles: [][]WaitNode{}}
	if m.life.be != nil {
		return m.waitGraphBackend(ctx)
	}
	if m.life.t == nil {
		return wg, errNeverOpened
	}
	if m.life.closed.Load() {
		return wg, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return wg, fmt.Errorf("%w: wait graph: %w", ErrAborted, err)
	}
	if err := m.reap(); err != nil {
		return wg, fmt.Errorf("wait graph: %w", err)
	}
	if !m.enter() {
		return wg, ErrClosed
	}
	var held, pending []table.LockInfo
	err := table.Guard(func() (err error) { held, pending, err = m.snapshot(); return err })
	m.leave()
	if err != nil {
		return wg, fmt.Errorf("wait graph: %w", err)
	}
	return waitGraphOf(waitgraph.New(held, pending)), nil
}

// waitGraphOf converts a table-level graph.
func waitGraphOf(g *waitgraph.Graph) WaitGraph {
	wg := WaitGraph{Waits: []WaitInfo{}, Cycles: [][]WaitNode{}}
	node := func(i int) WaitNode {
		li := g.Nodes[i]
		return WaitNode{LockInfo{Name: li.Name, Mode: Mode(li.Mode), ClientID: inspect.ClientID(li.Nonce), PID: li.PID}, g.Held(i)}
	}
	for i := g.NHeld; i < len(g.Nodes); i++ {
		wi := WaitInfo{Request: node(i).LockInfo, WaitsFor: []WaitNode{}}
		for _, j := range g.Out[i] {
			wi.WaitsFor = append(wi.WaitsFor, node(j))
		}
		wg.Waits = append(wg.Waits, wi)
	}
	for _, c := range g.Cycles() {
		nodes := make([]WaitNode, len(c))
		for k, i := range c {
			nodes[k] = node(i)
		}
		wg.Cycles = append(wg.Cycles, nodes)
	}
	return wg
}
