package manager

import (
	"context"
	"fmt"
	"time"

	"github.com/shmlocks/shmlocks/table"
)

// Deadlock detection (docs/multi-and-deadlock.md).
//
// A request that has waited DeadlockDelay (parked: nothing of this runs on
// the uncontended path, nor while a waiter spins) checks the wait-for graph
// (table.WaitFor) for a cycle through itself, and again every DeadlockDelay
// while it waits:
//
//  1. When it parks (before any check, and also in a Manager that does not
//     check), it has tagged the holds its task carries into the wait
//     (carriedRefs: the earlier names of an AcquireAll, the lock of
//     Request's or RequestAll's callback ctx) with its own slot and serial
//     (table.TagHolds), so that every process can follow the graph from
//     those holds to this request. Holds of other goroutines of the process
//     are not linked: a goroutine that waits does not keep its siblings
//     from releasing what they hold.
//  2. It reaps dead agents (a dead holder is not a cycle, it is released).
//  3. It reads the table (Snapshot: each bucket under its latch), builds the
//     graph and looks for a cycle through itself in which every other waiting
//     request started waiting before it: it is then that cycle's victim (the
//     rule: the request of the cycle that started waiting last, ties by the
//     higher slot), and every member computes the same victim from the same
//     table words, so two members checking at the same moment never both
//     give up.
//  4. It reads the table again: the cycle is real only if every request in
//     it is the same request (slot and serial) in the same state, and every
//     edge is still there (table.SameRequests): each waited, or was held,
//     throughout the interval, so the snapshot's bucket-by-bucket latching
//     cannot have composed a phantom.
//  5. It withdraws itself (as an aborted request) and fails with ErrDeadlock
//     naming the cycle; if it was granted meanwhile, it keeps the grant.
//
// The other members keep waiting; the victim's withdrawal (and its caller
// releasing what it held) lets them proceed.

// DefaultDeadlockDelay is the DeadlockDelay of a zero OpenOptions field.
const DefaultDeadlockDelay = time.Second

// victimHook, when set (tests only, before any Manager is opened), runs
// when a check has confirmed a cycle and is about to withdraw its victim:
// a pause there widens the moment in which the other members check too.
var victimHook func()

// deadlockWatch is the deadlock timer of one parked request.
type deadlockWatch struct {
	m      *Manager
	timer  *time.Timer
	tagged []table.Ref // holds tagged with this request's task tag
}

// newDeadlockWatch is called when waiting request ref parks. It tags the
// holds its task carries into the wait (whether or not this Manager checks:
// the tags let other processes' checks and shmlocks dump follow the graph
// through this request) and arms the deadlock timer. It returns nil when
// there is nothing to tag and this Manager does not check.
func (m *Manager) newDeadlockWatch(ctx context.Context, ref table.Ref) *deadlockWatch {
	holds := carriedRefs(ctx)
	if len(holds) == 0 && m.deadlock <= 0 {
		return nil
	}
	d := &deadlockWatch{m: m}
	if len(holds) > 0 && m.enter() {
		// A table error here (a latch held too long) leaves some holds
		// untagged: cycles through them go unseen; the wait reports it.
		var w table.Wakes
		m.t.TagHolds(m.a, holds, table.TaskTag(ref), &w)
		m.t.Deliver(&w, m.ringFn)
		m.leave()
		d.tagged = holds
	}
	if m.deadlock > 0 {
		d.timer = time.NewTimer(m.deadlock)
	}
	return d
}

// fired is the channel of the armed timer (nil, which never fires, if none).
func (d *deadlockWatch) fired() <-chan time.Time {
	if d == nil || d.timer == nil {
		return nil
	}
	return d.timer.C
}

// stop disarms the timer and clears the tags of the request's holds (its
// wait is over, before the caller can give the waiting slot back).
func (d *deadlockWatch) stop() {
	if d == nil {
		return
	}
	if d.timer != nil {
		d.timer.Stop()
	}
	if len(d.tagged) == 0 || !d.m.enter() {
		return
	}
	defer d.m.leave()
	table.Guard(func() error {
		var w table.Wakes
		_, err := d.m.t.TagHolds(d.m.a, d.tagged, 0, &w)
		d.m.t.Deliver(&w, d.m.ringFn)
		return err
	})
}

// checkDeadlock runs one check for waiting request ref of name (see above).
// over reports that the wait is over: the request was withdrawn as a
// deadlock victim (err matches ErrDeadlock), or granted meanwhile.
func (m *Manager) checkDeadlock(ctx context.Context, name string, ref table.Ref, d *deadlockWatch) (token uint64, err error, over bool) {
	defer d.timer.Reset(m.deadlock)
	if !m.enter() {
		return 0, nil, false // the parking loop reports ErrClosed
	}
	defer m.leave()
	if err := m.reap(); err != nil {
		return 0, fmt.Errorf("lock %q: deadlock check: %w", name, err), true
	}
	g, err := m.waitFor()
	if err != nil {
		return 0, fmt.Errorf("lock %q: deadlock check: %w", name, err), true
	}
	me := g.Find(ref.Slot, ref.Serial)
	if me < 0 {
		return 0, nil, false // no longer waiting: the parking loop looks
	}
	cycle := g.CycleThrough(me, true)
	if cycle == nil {
		return 0, nil, false
	}
	g2, err := m.waitFor()
	if err != nil {
		return 0, fmt.Errorf("lock %q: deadlock check: %w", name, err), true
	}
	if !table.SameRequests(g, g2, cycle) {
		return 0, nil, false // it changed while we read: look again after the delay
	}
	if h := victimHook; h != nil {
		h()
	}
	var w table.Wakes
	out, token, err := m.t.Abort(m.a, ref, &w)
	if !w.Empty() {
		m.t.Deliver(&w, m.ringFn)
	}
	if err == nil && out == table.Granted {
		// The cycle was broken (a member aborted, was stolen from or died)
		// and we were granted: keep it.
		token, err = m.granted(ctx, name, ref, token)
		return token, err, true
	}
	if err != nil {
		return 0, nil, false // stolen or removed meanwhile: the parking loop reports it
	}
	return 0, fmt.Errorf("lock %q: %w: %s", name, ErrDeadlock, g.Describe(cycle)), true
}

// waitFor reads the table (each bucket under its latch) into its wait-for graph.
func (m *Manager) waitFor() (*table.WaitFor, error) {
	held, pending, err := m.t.Snapshot(m.a)
	if err != nil {
		return nil, err
	}
	return table.NewWaitFor(held, pending), nil
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
	if m.closed.Load() {
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
	var g *table.WaitFor
	err := table.Guard(func() (err error) { g, err = m.waitFor(); return err })
	m.leave()
	if err != nil {
		return wg, fmt.Errorf("wait graph: %w", err)
	}
	return WaitGraphOf(g), nil
}

// WaitGraphOf converts a table-level graph (shmlocks dump builds one from a
// read-only mapping).
func WaitGraphOf(g *table.WaitFor) WaitGraph {
	wg := WaitGraph{Waits: []WaitInfo{}, Cycles: [][]WaitNode{}}
	node := func(i int) WaitNode {
		li := g.Nodes[i]
		return WaitNode{LockInfo{Name: li.Name, Mode: Mode(li.Mode), ClientID: ClientIDOf(li.Nonce), PID: li.PID}, g.Held(i)}
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
