package manager

import (
	"sync"
	"sync/atomic"

	"github.com/shmlocks/shmlocks/table"
)

// The local level of the two-level queue: this Manager's parked requests
// per name, in the table queue's order, and the channels that wake them.

// waiters are a Manager's parked requests: by slot (for a poke by slot,
// read without mu) and per name in queue order, with a free list of
// waiters kept for reuse. mu guards them, the done watches (donewatch.go)
// and the deadlock rounds' bookkeeping (deadlock.go).
type waiters struct {
	mu          sync.Mutex
	nwait       int                  // our parked requests (in queues)
	bySlot      slotIndex[waiter]    // the same by slot, read without mu (pokeSlot)
	queues      map[string]*waitList // the same, per name in queue order
	freeWaiters *waiter              // removed waiters kept for reuse, linked by next
	nfree       int                  // waiters on freeWaiters
}

// waiter is a goroutine waiting for its request to be granted.
type waiter struct {
	ref   table.Ref
	name  string
	seq   uint32         // the request's place in its name's queue (table.QueueSeq)
	ch    chan struct{}  // buffered(1): "look at your slot again"
	spun  atomic.Bool    // spun at the head of the queue already
	relay atomic.Bool    // set with a poke by relayNext: spin now, our turn is near
	dl    waiterDeadlock // deadlock detection's state of this request (deadlock.go)

	prev, next *waiter   // in m.queues[name], in queue order (m.mu)
	q          *waitList // m.queues[name] while registered (m.mu)

	dw           *doneWatch // the watch of its context's Done channel, if registered (donewatch.go; m.mu)
	dprev, dnext *waiter    // in dw's list (m.mu)
}

// waitList is this Manager's parked requests on one name, in queue order. A
// name's queue grants in order, so after a ring only a prefix of the list
// can have been granted, and only the first request still waiting can have
// become the head: the bell loop looks at that prefix, not at every waiter
// (O(1) per grant while one name's queue drains).
type waitList struct{ head, tail *waiter }

// addWaiter registers w (m.mu held), keeping its name's list in queue order.
func (m *Manager) addWaiter(w *waiter) {
	m.waits.nwait++
	m.waits.bySlot.store(w.ref.Slot, w)
	q := m.waits.queues[w.name]
	if q == nil {
		q = &waitList{}
		m.waits.queues[w.name] = q
	}
	w.q = q
	p := q.tail
	for p != nil && int32(p.seq-w.seq) > 0 { // wrap-safe: p is behind w
		p = p.prev
	}
	w.prev = p
	if p == nil {
		w.next, q.head = q.head, w
	} else {
		w.next, p.next = p.next, w
	}
	if w.next == nil {
		q.tail = w
	} else {
		w.next.prev = w
	}
}

// eachWaiter calls f for every parked request of ours (m.mu held).
func (m *Manager) eachWaiter(f func(w *waiter)) {
	for _, q := range m.waits.queues {
		for w := q.head; w != nil; w = w.next {
			f(w)
		}
	}
}

// removeWaiter unregisters w (m.mu held). Its slot index cell is left as
// it is, to be overwritten by the next waiter parked at the slot: a poke
// reaches a slot's cell only after the granter saw the slot's park mark,
// which its request sets after it registered (the mark is cleared when a
// request enqueues), so a left cell is never read for a poke that matters,
// and a stray poke only makes a waiter look at its slot once more. What
// must know whether w is registered asks w.q (giveVerdict). Clearing it
// was a locked instruction on every wake-up; a waiter that leaves the free
// list clears it (dropWaiter).
func (m *Manager) removeWaiter(w *waiter) {
	m.waits.nwait--
	q := w.q
	w.q = nil
	if w.prev == nil {
		q.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		q.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	w.prev, w.next = nil, nil
	if q.head == nil {
		delete(m.waits.queues, w.name)
	}
}

// newWaiter returns a waiter for request ref of name at place seq of its
// queue (m.mu held): a recycled one if this Manager has one, else a new one
// (an allocation per park is a cost every contended grant would pay, with
// the collector's work). Its channel comes with it, emptied of any late poke.
func (m *Manager) newWaiter(ref table.Ref, name string, seq uint32) *waiter {
	w := m.waits.freeWaiters
	if w == nil {
		return &waiter{ref: ref, name: name, seq: seq, ch: getPokeChan()}
	}
	m.waits.freeWaiters, w.next = w.next, nil
	m.waits.nfree--
	w.ref, w.name, w.seq = ref, name, seq
	drainPoke(w.ch) // a late poke of its previous request
	return w
}

// recycleWaiter keeps removed waiter w for a later park (m.mu held), or
// drops it (dropWaiter) when the free list is full. Late readers of a
// removed waiter are harmless to its next request: a deadlock round hands
// a verdict only to a waiter still registered for the request it looked at
// (giveVerdict, under m.mu), and pokeSlot, which read it from the slot
// index just before it was removed, only pokes its channel: the poke makes
// the channel's next waiter look at its slot once more, which every poke
// may do anyway.
func (m *Manager) recycleWaiter(w *waiter) {
	if m.waits.nfree >= maxFreeWaiters {
		m.dropWaiter(w)
		return
	}
	// Reset what the next park does not set itself (newWaiter and wait set
	// ref, name, seq and spun), storing only what is set: each atomic store
	// is a locked instruction.
	w.name = "" // no name kept alive by the free list
	if w.relay.Load() {
		w.relay.Store(false)
	}
	w.dl.due, w.dl.tagged = 0, nil
	if w.dl.verdict.Load() != nil {
		w.dl.verdict.Store(nil)
	}
	w.prev, w.next = nil, m.waits.freeWaiters
	m.waits.freeWaiters = w
	m.waits.nfree++
}

// dropWaiter lets removed waiter w go; its channel is recycled. Its slot
// index cell, left by removeWaiter, is cleared here unless another waiter
// took it, so that a burst of parked requests leaves no more waiters
// reachable than the free list keeps.
func (m *Manager) dropWaiter(w *waiter) {
	m.waits.bySlot.clear(w.ref.Slot, w)
	putPokeChan(w.ch) // a late poke of w only makes the chan's next waiter look once more
}

// maxFreeWaiters bounds the waiters a Manager keeps for reuse: a burst of
// thousands of parked requests leaves that many on the free list.
const maxFreeWaiters = 256

// pokeChans recycles the waiters' poke channels (one allocation per park
// fewer: makechan and the collector's assists are a visible share of the
// CPU when many goroutines of one process contend; docs/experiments.md).
// A channel may be poked after its
// waiter left (pokeSlot read the waiter just before it left, a deadlock
// round holds it): the token makes the channel's next waiter look at its
// slot once more, which every poke may do anyway.
var pokeChans = sync.Pool{New: func() any { return make(chan struct{}, 1) }}

func getPokeChan() chan struct{} {
	ch := pokeChans.Get().(chan struct{})
	drainPoke(ch) // a late poke of its previous waiter
	return ch
}

// drainPoke empties a reused poke channel.
func drainPoke(ch chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

func putPokeChan(ch chan struct{}) { pokeChans.Put(ch) }

// poke asks w's goroutine to look at its slot again.
func (w *waiter) poke() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// parkedWaiters returns how many requests of ours are registered as parked.
func (m *Manager) parkedWaiters() int {
	m.waits.mu.Lock()
	defer m.waits.mu.Unlock()
	return m.waits.nwait
}
