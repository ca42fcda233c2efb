package manager

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/shmlocks/shmlocks/table"
)

// RequestOptions select the mode and the Web Locks options of a request.
type RequestOptions struct {
	Mode        Mode
	IfAvailable bool // grant only without waiting, else report not available
	Steal       bool // release every held lock on the name and grant this one first
}

// Request waits until the lock is granted, runs fn while holding it, releases
// it and returns fn's error. ctx aborts the wait (the Web Locks "signal").
// With IfAvailable and the lock not grantable at once, fn runs with l == nil.
// fn's ctx is cancelled when the lock is stolen or lost; Request then returns
// an error that errors.Is(err, ErrStolen) (joined with fn's own error, if any).
// l must not be used after fn returns.
func (m *Manager) Request(ctx context.Context, name string, opts RequestOptions,
	fn func(ctx context.Context, l *Lock) error) error {
	if m.be != nil {
		return m.requestBackend(ctx, name, opts, fn)
	}
	var ref table.Ref
	var token uint64
	var err error
	if m.stats == nil {
		ref, token, err = m.acquire(ctx, name, opts)
	} else {
		ref, token, err = m.acquireCounted(ctx, name, opts)
	}
	if err != nil {
		if r, ok := err.(*reentry); ok {
			return m.requestChild(ctx, r, opts.Mode, fn)
		}
		if errors.Is(err, ErrNotAvailable) {
			return fn(ctx, nil)
		}
		return err
	}
	l := m.pool.Get().(*Lock)
	l.init(m, name, opts.Mode, ref, token)
	lc := &l.extension().ctx // allocated once per pooled Lock
	*lc = lockCtx{l: l, parent: ctx, inc: l.state.Load() >> stateBits}
	ferr := fn(lc, l)
	lc.finish()
	rerr := l.releaseOwn()
	if rerr == nil {
		m.pool.Put(l)
		return ferr
	}
	if errors.Is(rerr, ErrReleased) {
		// fn released the lock itself.
		m.pool.Put(l)
		return ferr
	}
	// Stolen, reaped or closed under fn: report it with fn's own error. The
	// Lock is not reused, in case fn kept it.
	return errors.Join(rerr, ferr)
}

// Acquire is the handle form of Request; the caller must Release.
// With IfAvailable and the lock not grantable at once: (nil, ErrNotAvailable).
//
// Every grant gets a Lock of its own (a stale handle must never alias a
// later grant). Acquire is small enough to be inlined into its caller, so
// the compiler allocates that Lock in the caller: on the caller's stack when
// the handle does not outlive the caller's frame (the usual Acquire, defer
// Release), else one 64-byte heap object. Nothing the Lock's methods do
// retains it, except Lost (and Request's context), which register it with
// the bell loop: a caller that calls Lost gets a heap Lock.
func (m *Manager) Acquire(ctx context.Context, name string, opts RequestOptions) (l *Lock, err error) {
	l = new(Lock)
	err = m.acquireNew(ctx, name, opts, &l)
	return
}

// acquireNew is acquire for Acquire: it makes *lp, a new Lock that nobody
// else can reach yet, the handle of the grant (state written plainly), or
// sets *lp to nil. Neither it nor Release retains the Lock: keep it so, or
// every Acquire allocates (TestAcquireOnTheStack).
func (m *Manager) acquireNew(ctx context.Context, name string, opts RequestOptions, lp **Lock) error {
	if m.be != nil { // the backend seam: one field load and a predictable branch
		return m.acquireBackend(ctx, name, opts, lp)
	}
	var ref table.Ref
	var token uint64
	var err error
	if m.stats == nil { // statistics off: one plain load (stats.go)
		ref, token, err = m.acquire(ctx, name, opts)
	} else {
		ref, token, err = m.acquireCounted(ctx, name, opts)
	}
	if err != nil {
		if r, ok := err.(*reentry); ok {
			r.fill(*lp, opts.Mode) // a child grant of ctx's (reentrant.go)
			return nil
		}
		*lp = nil
		return err
	}
	l := *lp
	l.m, l.name, l.token, l.ref, l.mode = m, name, token, ref, uint8(opts.Mode)
	*(*uint64)(unsafe.Pointer(&l.state)) = 1<<stateBits | lockHeld
	return nil
}

// validate applies the contract's order: closed, then name and options, then ctx.
func (m *Manager) validate(ctx context.Context, name string, opts RequestOptions) error {
	if m.closed.Load() {
		return ErrClosed
	}
	if len(name) > 0 && name[0] == '-' && !internalCtx(ctx) {
		return fmt.Errorf("%w: lock name %q starts with '-'", ErrNotSupported, name)
	}
	if max := m.maxName; len(name) > max {
		return fmt.Errorf("%w: lock name of %d bytes is longer than MaxNameLen %d", ErrNotSupported, len(name), max)
	}
	if opts.Mode != Exclusive && opts.Mode != Shared {
		return fmt.Errorf("%w: mode %d", ErrNotSupported, int(opts.Mode))
	}
	if opts.Steal && opts.IfAvailable {
		return fmt.Errorf("%w: Steal with IfAvailable (lock %q)", ErrNotSupported, name)
	}
	if opts.Steal && opts.Mode == Shared {
		return fmt.Errorf("%w: Steal with Shared mode (lock %q)", ErrNotSupported, name)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: lock %q: %w", ErrAborted, name, err)
	}
	return nil
}

// acquire grants or queues and waits for a request and returns its Ref and
// fencing token; the caller makes the Lock (Acquire a new one, which the
// compiler may keep on the caller's stack; Request a pooled one).
func (m *Manager) acquire(ctx context.Context, name string, opts RequestOptions) (ref table.Ref, token uint64, err error) {
	// The file may be truncated under us (the mapping then faults): the
	// fault becomes ErrCorrupt, and the Manager stops trusting its count
	// of operations in flight, which the fault may have left raised.
	defer table.EndGuard(table.BeginGuard(), &err, m.faultFn)
	if err := m.validate(ctx, name, opts); err != nil {
		return table.Ref{}, 0, err
	}
	var w table.Wakes
	h := table.Hash(name)
	if opts.Mode == Exclusive && !opts.Steal {
		// The uncontended path: take an idle name by one CAS, with no slot
		// claim and no in-flight count. Close sets closed before it
		// releases our fast holds, and we look at closed after our CAS:
		// either Close finds this hold, or we see closed and give it back.
		ref, token, out := m.t.AcquireFast(m.a, name, h, &w)
		if !w.Empty() {
			m.deliver(&w)
		}
		if out == table.Granted {
			if m.closed.Load() {
				// Give it back; if a latch holder had moved it into the
				// held list meanwhile, the release grants the next waiter,
				// who must be rung.
				m.t.Release(m.a, ref, &w)
				m.deliver(&w)
				return table.Ref{}, 0, ErrClosed
			}
			return ref, token, nil
		}
	}
	if !opts.Steal {
		// Not granted by the fast path: the name may be held through ctx
		// (reentrant.go). Only this path asks ctx: an idle name has no
		// grant to re-enter.
		if err := m.reenter(ctx, name, opts.Mode); err != nil {
			return table.Ref{}, 0, err
		}
	}
	// A slot for the latched path. The claim is what Close waits for
	// instead of an in-flight count (ClaimsSettled): a claim made before
	// Close set closed is seen by it, one made after sees closed here.
	ref, err = m.t.Claim(m.a, h)
	if err != nil {
		m.noteErr("acquire", err)
		return table.Ref{}, 0, fmt.Errorf("lock %q: %w", name, err)
	}
	if m.closed.Load() {
		m.t.FreeClaimed(m.a, ref)
		return table.Ref{}, 0, ErrClosed
	}
	if !m.enter() {
		m.t.FreeClaimed(m.a, ref)
		return table.Ref{}, 0, ErrClosed
	}
	// The first attempt never queues (a waiting request takes a second
	// one), so the uncontended path reads no clock.
	ref, out, token, err := m.t.AcquireClaimed(m.a, ref, name, h, uint32(opts.Mode), !opts.Steal, opts.Steal, &w)
	if out == table.NotAvailable && err == nil && !opts.IfAvailable {
		// The name is taken. Yield outside the queue if this Manager has
		// not given up its CPU for yieldEvery: let the other runnable
		// processes have it before we join the queue, so that the queue is
		// made of running processes (a grant then lands on a spinning
		// waiter, not on one the kernel has to schedule first). Not when
		// the table has no more agents than we have CPUs while another
		// request of ours waits (yieldsOutsideQueue, waitpolicy.go).
		if m.spin > 0 && m.shouldYield() {
			m.leave()
			m.yieldIfDue()
			if !m.enter() {
				return table.Ref{}, 0, ErrClosed
			}
		}
		ref, out, token, err = m.t.Acquire(m.a, name, h, uint32(opts.Mode), false, false, &w)
	}
	if out == table.NotAvailable && err == nil && m.reapHolders(name, h) {
		// A holder in the way was dead: it has been reaped, try once more.
		ref, out, token, err = m.t.Acquire(m.a, name, h, uint32(opts.Mode), opts.IfAvailable, opts.Steal, &w)
	}
	if !w.Empty() {
		m.deliver(&w)
	}
	m.leave()
	if err != nil {
		m.noteErr("acquire", err)
		return table.Ref{}, 0, fmt.Errorf("lock %q: %w", name, err)
	}
	switch out {
	case table.NotAvailable:
		return table.Ref{}, 0, fmt.Errorf("lock %q: %w", name, ErrNotAvailable)
	case table.Queued:
		var queued time.Time
		if m.stats != nil { // statistics on (stats.go): time the wait
			queued = time.Now()
		}
		token, err = m.wait(ctx, name, ref)
		if err != nil {
			return table.Ref{}, 0, err
		}
		if m.stats != nil {
			m.stats.observeWait(opts.Mode, time.Since(queued))
		}
	}
	if opts.Steal {
		m.noteSteal(name, token)
	}
	// The Lock is registered in m.held only once someone can observe its
	// loss asynchronously (Lost, or the Request context's Done): Release
	// learns of a steal from the table anyway.
	return ref, token, nil
}

// mono is this Manager's monotonic clock, in ns since Open.
func (m *Manager) mono() int64 { return int64(time.Since(m.born)) }

// reapHolders reaps the dead agents among name's holders and queue, so that
// an if-available request does not fail because of a process that is gone.
// It looks at most once a millisecond per Manager (a liveness check reads
// /proc) and reports whether it reaped anyone.
func (m *Manager) reapHolders(name string, h uint64) bool {
	now := time.Now().UnixNano()
	last := m.lastInWay.Load()
	if now-last < int64(time.Millisecond) || !m.lastInWay.CompareAndSwap(last, now) {
		return false
	}
	agents := m.t.AgentsInWay(m.a, name, h)
	reaped := false
	var w table.Wakes
	for _, idx := range agents {
		if dead, word := m.t.AgentDeadWord(idx); dead {
			if m.t.Reap(m.a, idx, word, &w) == nil {
				reaped = true
			}
		}
	}
	m.deliver(&w)
	return reaped
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

	prev, next *waiter // in m.queues[name], in queue order (m.mu)
}

// waitList is this Manager's parked requests on one name, in queue order. A
// name's queue grants in order, so after a ring only a prefix of the list
// can have been granted, and only the first request still waiting can have
// become the head: the bell loop looks at that prefix, not at every waiter
// (O(1) per grant while one name's queue drains).
type waitList struct{ head, tail *waiter }

// addWaiter registers w (m.mu held), keeping its name's list in queue order.
func (m *Manager) addWaiter(w *waiter) {
	m.nwait++
	m.bySlot.store(w.ref.Slot, w)
	q := m.queues[w.name]
	if q == nil {
		q = &waitList{}
		m.queues[w.name] = q
	}
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
	for _, q := range m.queues {
		for w := q.head; w != nil; w = w.next {
			f(w)
		}
	}
}

// removeWaiter unregisters w (m.mu held).
func (m *Manager) removeWaiter(w *waiter) {
	m.nwait--
	m.bySlot.clear(w.ref.Slot, w)
	q := m.queues[w.name]
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
		delete(m.queues, w.name)
	}
}

// wait blocks until ref is granted, ctx ends or the Manager closes.
//
// A queued request first spins on its own slot word, if one of its
// Manager's spinWindow places is free and few of its Manager's requests
// wait (arrivalSpins; else it parks at once: the two-level queue of
// docs/design.md §4). It keeps its CPU
// while it spins (it yields only to the goroutines of its own process):
// a waiter that gave its CPU to the kernel would be off it when its turn
// comes, and every later grant would wait for a process to be scheduled
// (the collapse of strict FIFO with 8 processes on 2 CPUs). CPUs are
// handed over outside the queue instead (yieldIfDue). One exception is a
// process with more requests waiting than it has Ps on a crowded table:
// its spinners yield to the OS (spinYields). The other is a
// process confined to one CPU: there the holder it waits for may need this
// very CPU, so it yields to the OS once and then parks (spinStep). The
// budget is adaptive: SpinLimit (50 µs) restarts whenever the name's queue
// moves, so a waiter stays on its CPU while its turn approaches, and parks
// once the lock has been held for SpinLimit without any grant: a long wait
// costs no CPU.
// A parked request may be readied to spin earlier, by the grant of a
// request of its own Manager on the name (relayNext: a crowded table, more
// of the Manager's requests waiting than it has Ps), and readies the next
// in turn at its own grant.
// A parked request that becomes the head of its queue is rung one grant
// ahead of its turn (wakeAhead) and spins again, unless the name's holder
// is a request of its own Manager: that holder's release pokes it at its
// grant (table.DeliverLocal), and it never spins.
//
// Before parking, a request raises its agent's parked count, sets its
// slot's park mark and looks at its slot once more: a granter sets the slot
// HELD before it reads the mark (and then the parked count), so either the
// granter sees the mark and rings, or the waiter sees the grant (no lost
// wake-up; all the words are sequentially consistent atomics).
func (m *Manager) wait(ctx context.Context, name string, ref table.Ref) (token uint64, err error) {
	done := ctx.Done()
	spun := false
	if m.spin > 0 && m.arrivalMaySpin() && m.takeSpinPlace() {
		// A request parks at once when spinWindow requests of its Manager
		// spin already, or when several of its requests wait (they are
		// ahead of it in some queue: arrivalSpins), and is readied one
		// grant ahead of its turn (wakeAhead), or at its grant when the
		// grant comes from its own Manager (a poke by slot, no syscall).
		spun = m.t.IsHead(m.a, ref)
		if token, err, over := m.spinHead(ctx, done, name, ref, true); over {
			if err == nil && m.relayWanted() {
				m.mu.Lock()
				m.relayNext(name)
				m.mu.Unlock()
			}
			return token, err // no waiter made: most contended requests end here
		}
	}
	w := &waiter{ref: ref, name: name, seq: m.t.QueueSeq(ref), ch: getPokeChan()}
	w.spun.Store(spun)
	m.mu.Lock()
	m.addWaiter(w)
	if m.deadlock > 0 {
		m.parkChecked(w) // the deadlock rounds look at it (deadlock.go)
	}
	m.mu.Unlock()
	parked := m.a.Parked()
	first := atomic.AddUint32(parked, 1) == 1
	m.t.MarkParked(ref, true) // before the loop's look at the slot (no lost wake-up)
	now := m.mono()
	m.refreshView(now) // the one clock read of a park: the waiting policy's view of the machine
	if first || m.watch.stale(now) {
		m.watch.kick() // watch the agents in our way (a refresh per park cost 18% of the CPU at 1 x 64)
	}
	if holds := carriedRefs(ctx); len(holds) > 0 {
		m.tagCarried(w, holds) // so that the wait-for graph goes through them (deadlock.go)
	}
	// relay: the wait ended in a grant after which relayWanted said yes.
	// Set only once both returned normally: a fault of the mapping panics
	// through this defer with err still nil, and relayNext under m.mu reads
	// nothing of the mapping.
	relay := false
	defer func() {
		m.mu.Lock()
		m.removeWaiter(w)
		if relay && err == nil {
			m.relayNext(name)
		}
		m.mu.Unlock()
		putPokeChan(w.ch) // a late poke of w only makes the chan's next waiter look once more
		if len(w.dl.tagged) > 0 {
			m.untagCarried(w)
		}
	}()
	for {
		select {
		case <-done:
			atomic.AddUint32(parked, ^uint32(0))
			return m.abort(ctx, name, ref)
		default:
		}
		if !m.enter() {
			atomic.AddUint32(parked, ^uint32(0))
			return 0, fmt.Errorf("lock %q: %w", name, ErrClosed)
		}
		st, token, ok := m.t.Status(m.a, ref)
		readied := w.relay.Swap(false)
		head := ok && st == table.SlotWaiting && m.spin > 0 && (readied || !w.spun.Load() && m.t.IsHead(m.a, ref))
		m.leave()
		switch {
		case ok && st == table.SlotHeld:
			atomic.AddUint32(parked, ^uint32(0))
			token, err := m.granted(ctx, name, ref, token)
			relay = err == nil && m.relayWanted()
			return token, err
		case ok && st == table.SlotWaiting:
			if m.deadlock > 0 && w.dl.verdict.Load() != nil {
				// A deadlock round found us a cycle's victim (deadlock.go).
				if token, err, over := m.checkDeadlock(ctx, name, w); over {
					atomic.AddUint32(parked, ^uint32(0))
					return token, err
				}
				continue // not withdrawn: look at the slot again
			}
		case ok && st == table.SlotStolen:
			// Granted and stolen before we looked: we never held it usefully.
			m.t.FreeStolen(m.a, ref)
			atomic.AddUint32(parked, ^uint32(0))
			return 0, fmt.Errorf("lock %q: %w", name, ErrStolen)
		default:
			atomic.AddUint32(parked, ^uint32(0))
			return 0, fmt.Errorf("lock %q: request removed from the table (agent reaped?): %w", name, ErrStolen)
		}
		if head {
			// Woken one grant ahead: spin (not counted as parked), then
			// park again with the usual re-check.
			w.spun.Store(true)
			m.t.MarkParked(ref, false) // a grant need not ring us while we spin
			atomic.AddUint32(parked, ^uint32(0))
			if token, err, over := m.spinHead(ctx, done, name, ref, false); over {
				relay = err == nil && m.relayWanted() // a readied request relays in turn
				return token, err
			}
			atomic.AddUint32(parked, 1)
			m.t.MarkParked(ref, true)
			continue
		}
		select {
		case <-w.ch: // a poke (also Close's: it sets closed first)
		case <-done:
		}
	}
}

// spinHead watches the slot of a queued request for up to the spin limit
// (restarted by progress on the name). over reports that the wait is over
// (granted or aborted, with token and err); otherwise the caller parks.
//
// placed says the caller took one of the spinWindow places (takeSpinPlace);
// a request woken one grant ahead of its turn spins without one.
func (m *Manager) spinHead(ctx context.Context, done <-chan struct{}, name string, ref table.Ref, placed bool) (token uint64, err error, over bool) {
	if !placed {
		m.spinners.Add(1)
	}
	defer m.spinners.Add(-1)
	if !m.enter() {
		return 0, nil, false // the parking loop reports ErrClosed
	}
	defer m.leave() // Close waits at most one spin limit for us
	// The budget starts at the first clock read, after 8 looks: a spin that
	// ends sooner (most hand-offs) reads no clock.
	var deadline, nextSched int64
	progress := m.t.Progress(ref)
	oneCPU := m.onOneCPU()
	procs := m.procs.Load()
	for i := 0; ; i++ {
		select {
		case <-done:
			token, err = m.abort(ctx, name, ref)
			return token, err, true
		default:
		}
		st, token, ok := m.t.Status(m.a, ref)
		if ok && st == table.SlotHeld {
			token, err = m.granted(ctx, name, ref, token)
			return token, err, true
		}
		if !ok || st != table.SlotWaiting {
			return 0, nil, false
		}
		parked, spinners := atomic.LoadUint32(m.a.Parked()), m.spinners.Load()
		lookOnly := spinLooksOnly(oneCPU, spinners, procs, parked)
		if i&7 == 7 && (!lookOnly || i&63 == 63) {
			// The budget is adaptive: it restarts whenever the queue moves
			// (a grant on the name), so a waiter keeps its CPU while its
			// turn approaches and parks after SpinLimit without progress.
			// A grant to a parked request of ours bumps our bell word: look
			// for it here rather than leave it to the doorbell, which
			// reaches a process whose Ps are all busy spinning only through
			// the runtime's netpoll (up to 10 ms under sysmon).
			if bell, last := atomic.LoadUint32(m.a.Bell()), m.lastBell.Load(); bell != last &&
				atomic.LoadUint32(m.a.Parked()) > 0 && m.lastBell.CompareAndSwap(last, bell) {
				m.scanWaiters(false)
			}
			now := m.mono()
			if deadline == 0 {
				deadline, nextSched = now+int64(m.spin), now+int64(goschedEvery)
				m.refreshView(now)
			}
			if p := m.t.Progress(ref); p != progress {
				progress, deadline = p, now+int64(m.spin)
			} else if now > deadline {
				return 0, nil, false
			}
			if lookOnly && now > nextSched {
				nextSched = now + int64(goschedEvery)
				runtime.Gosched()
			}
		}
		if lookOnly {
			continue
		}
		switch spinStep(i, oneCPU, spinYields(m.agents.Load() > m.usable.Load(), parked, spinners, procs)) {
		case spinPark:
			return 0, nil, false
		case spinOSYield:
			cpuYield()
		default:
			runtime.Gosched()
		}
	}
}

// granted accepts an observed grant unless ctx ended meanwhile: a grant
// seen after the cancellation is handed back (abort), so a caller whose ctx
// was cancelled before the grant always gets ErrAborted.
func (m *Manager) granted(ctx context.Context, name string, ref table.Ref, token uint64) (uint64, error) {
	if ctx.Err() != nil {
		return m.abort(ctx, name, ref)
	}
	return token, nil
}

// abort withdraws a waiting request whose ctx ended. If a grant raced with
// the cancellation and won, the lock is released at once, which hands it to
// the next waiter: once a waiter has seen its ctx done it returns ErrAborted
// and holds nothing, and no grant is leaked either way.
func (m *Manager) abort(ctx context.Context, name string, ref table.Ref) (uint64, error) {
	if !m.enter() {
		return 0, fmt.Errorf("lock %q: %w", name, ErrClosed)
	}
	var w table.Wakes
	out, _, err := m.t.Abort(m.a, ref, &w)
	if err == nil && out == table.Granted {
		err = m.t.Release(m.a, ref, &w)
	}
	if !w.Empty() {
		m.deliver(&w)
	}
	m.leave()
	return 0, fmt.Errorf("%w: lock %q: %w", ErrAborted, name, ctx.Err())
}

// scan looks at every waiting request and held lock of this Manager: wakes
// the waiters whose slot changed and marks lost the locks that were stolen.
// With force it looks even if the sequence words did not change.
func (m *Manager) scan(force bool) {
	bell := atomic.LoadUint32(m.a.Bell())
	if m.lastBell.Swap(bell) != bell || force {
		m.scanWaiters(force)
	}
	stl := atomic.LoadUint32(m.a.StealSeq())
	if m.lastStl.Swap(stl) != stl || force {
		m.scanHeld()
	}
}

// scanWaiters wakes every waiter whose slot is no longer waiting, and every
// one that became the head of its queue and has not spun yet. Per name it
// looks only at the requests up to the first one still waiting (see
// waitList); with all it looks at every waiter (after a reap, which may
// remove requests anywhere in a queue, and on the periodic safety scan).
func (m *Manager) scanWaiters(all bool) {
	m.scanObservers() // a ring may be for a watch (observe.go)
	m.mu.Lock()
	defer m.mu.Unlock() // also when a read of a truncated file faults (Guard)
	for _, q := range m.queues {
		for w := q.head; w != nil; w = w.next {
			st, _, ok := m.t.Status(m.a, w.ref)
			waiting := ok && st == table.SlotWaiting
			if !waiting || (!w.spun.Load() && m.t.IsHead(m.a, w.ref)) {
				w.poke()
			}
			if waiting && !all {
				break
			}
		}
	}
}

// pokeAll asks every parked waiter (and watch) to look at its slot again.
func (m *Manager) pokeAll() {
	m.pokeObservers()
	m.mu.Lock()
	m.eachWaiter(func(w *waiter) { w.poke() })
	m.mu.Unlock()
}

// pokeChans recycles the waiters' poke channels (one allocation per park
// fewer: makechan and the collector's assists were 9% of the CPU with 64
// goroutines of one process on one name). A channel may be poked after its
// waiter left (pokeSlot read the waiter just before it left, a deadlock
// round holds it): the token makes the channel's next waiter look at its
// slot once more, which every poke may do anyway.
var pokeChans = sync.Pool{New: func() any { return make(chan struct{}, 1) }}

func getPokeChan() chan struct{} {
	ch := pokeChans.Get().(chan struct{})
	select {
	case <-ch: // a late poke of its previous waiter
	default:
	}
	return ch
}

func putPokeChan(ch chan struct{}) { pokeChans.Put(ch) }

// relayNext readies the earliest parked request of ours on name to spin
// (m.mu held; it reads nothing of the mapping), called when a request of
// ours on name was granted after it waited and relayWanted said yes: the
// next grant of ours on the name is then a few grants away, and a request
// that spins when its turn comes is handed the lock in a hand-off of
// memory, where one that sleeps in a process the granter must
// wake through the doorbell costs a chain of thread wake-ups (a sendto, the
// bell loop's netpoller thread, then a thread to run the waiter: 25-35 µs
// per grant that crosses processes with 4 processes x 3 goroutines on 2
// vCPUs and every request parked; docs/experiments.md). This is the
// two-level queue's "each grant readies the next local request"
// (docs/design.md §4); the table's queue alone decides the order. Only when
// relays says so (a crowded table, more of our requests waiting than we
// can spin) and when this process may use several CPUs (on one, spinStep
// parks at once): relayWanted.
func (m *Manager) relayNext(name string) {
	q := m.queues[name]
	if q == nil {
		return
	}
	if w := q.head; !w.relay.Swap(true) {
		w.poke()
	}
}

// relayWanted reports whether a request of ours just granted after it
// waited should ready our next sleeping one on its name (relayNext). It
// reads our agent's parked word in the mapping: never call it with m.mu
// held (a fault would leave the mutex locked).
//
// The process-local conditions come first: with one agent (1 x 64) or no
// more agents than CPUs no grant reads the parked word, which every park
// and wake-up of the Manager writes.
func (m *Manager) relayWanted() bool {
	crowded := m.agents.Load() > m.usable.Load()
	if m.spin <= 0 || !crowded || m.onOneCPU() {
		return false
	}
	return relays(crowded, atomic.LoadUint32(m.a.Parked()), m.spinners.Load(), m.procs.Load())
}

// poke asks w's goroutine to look at its slot again.
func (w *waiter) poke() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// scanHeld marks lost every registered lock whose slot is no longer held by
// us. It reads nothing of a Lock but its atomic state word: the registry
// index is the slot, and the Lock is changed only by a CAS on the
// (incarnation, held) word that was registered at that slot.
func (m *Manager) scanHeld() { m.held.each(m.loseIfGone) }

// loseIfGone marks the Lock of registration e (at slot) lost if the grant
// it was registered for is no longer held by us. It reads nothing of the
// Lock but its state word. The registration must still be the slot's
// current one: an entry's reserved slot serves one grant after another, so
// a registration seen by an earlier look at the registry may be of a grant
// the Lock (reused by Request) no longer has, while the same Lock is
// registered at the same slot again for its next grant.
func (m *Manager) loseIfGone(slot uint32, e *regEntry) {
	l := e.l
	word := l.state.Load()
	if word&stateMask != lockHeld || m.held.load(slot) != e {
		return // released, re-granted elsewhere, or registered anew
	}
	if m.t.Holds(m.a, table.Ref{Slot: slot, Serial: e.serial}) {
		return
	}
	st, serial, mine := m.t.SlotState(m.a, slot)
	if l.markLost(word, lockStolen) {
		// The incarnation is lost for good: nothing re-inits l now (Request
		// does not pool a Lock that was taken away), so its name is stable.
		m.noteLost(l)
		m.held.dropEntry(slot, e)
		if mine && st == table.SlotStolen && serial == e.serial {
			m.t.FreeStolen(m.a, table.Ref{Slot: slot, Serial: serial})
		}
	}
}
