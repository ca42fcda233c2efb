package manager

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"

	"github.com/shmlocks/shmlocks/table"
)

// Waiting for a queued request's grant: a spin on its slot word, a park
// on its channel, the wake-ahead and the relay to the next request of the
// same Manager (the two-level queue of docs/waiting.md), and abort when
// its context ends. Which requests spin, and how, is waitpolicy.go's; who
// is granted is the table's queue's alone.

// wait blocks until ref is granted, ctx ends or the Manager closes.
//
// A queued request first spins on its own slot word, if one of its
// Manager's spinWindow places is free and few of its Manager's requests
// wait (arrivalSpins; else it parks at once: the two-level queue of
// docs/waiting.md). It keeps its CPU
// while it spins (it yields only to the goroutines of its own process):
// a waiter that gave its CPU to the kernel would be off it when its turn
// comes, and every later grant would wait for a process to be scheduled
// (the collapse of strict FIFO with 8 processes on 2 CPUs). CPUs are
// handed over outside the queue instead (yieldIfDue). One exception is a
// process with more requests waiting than it has Ps on a crowded table:
// its spinners yield to the OS (spinYields), and so does every spinner on
// a crowded table of bounded fairness (spinsOffCPU). The other is a
// process confined to one CPU: there the holder it waits for may need this
// very CPU, so it yields to the OS once and then parks (spinStep). The
// budget is adaptive: SpinLimit (50 µs) restarts whenever the name's queue
// moves (on a crowded bounded table, whenever the name is granted at all:
// Progress with barges), so a waiter stays on its CPU while its turn
// approaches, and parks once the lock has been held for SpinLimit without
// any grant: a long wait costs no CPU.
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
	spun, placed := false, false
	if m.cfg.spin > 0 && m.arrivalMaySpin() && m.takeSpinPlace() {
		placed = true
		// A request parks at once when spinWindow requests of its Manager
		// spin already, or when several of its requests wait (they are
		// ahead of it in some queue: arrivalSpins), and is readied one
		// grant ahead of its turn (wakeAhead), or at its grant when the
		// grant comes from its own Manager (a poke by slot, no syscall).
		spun = m.life.t.IsHead(m.life.a, ref)
		if token, err, over := m.spinHead(ctx, done, name, ref, true); over {
			if err == nil && m.relayWanted() {
				m.waits.mu.Lock()
				m.relayNext(name)
				m.waits.mu.Unlock()
			}
			return token, err // no waiter made: most contended requests end here
		}
	}
	seq := m.life.t.QueueSeq(ref)
	m.waits.mu.Lock()
	w := m.newWaiter(ref, name, seq)
	if w.spun.Load() != spun { // a recycled waiter keeps its last value: a store is a locked instruction
		w.spun.Store(spun)
	}
	m.addWaiter(w)
	watched := done != nil && m.watchDone(ctx, done, w) // then the park receives on w.ch only
	if m.cfg.deadlock > 0 {
		m.parkChecked(w) // the deadlock rounds look at it (deadlock.go)
	}
	m.waits.mu.Unlock()
	parked := m.life.a.Parked()
	first := atomic.AddUint32(parked, 1) == 1
	m.life.t.MarkParked(ref, true) // before the loop's look at the slot (no lost wake-up)
	// The park's clock, for the waiting policy's view of the machine and
	// the watch: the reading of our enqueue a moment ago, unless we spun
	// first (a spin may last long while the queue moves).
	now := m.life.t.EnqueuedMono(ref)
	if placed {
		now = m.mono()
	}
	m.refreshView(now)
	if first || m.reaper.Stale(now) {
		m.reaper.Kick() // arm the death watch (wake.Reaper)
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
		m.waits.mu.Lock()
		m.removeWaiter(w)
		m.unwatchDone(w)
		if relay && err == nil {
			m.relayNext(name)
		}
		tagged := len(w.dl.tagged) > 0
		if !tagged {
			m.recycleWaiter(w)
		}
		m.waits.mu.Unlock()
		if tagged {
			m.untagCarried(w)
			m.dropWaiter(w)
		}
	}()
	for {
		select {
		case <-done:
			atomic.AddUint32(parked, ^uint32(0))
			return m.abort(ctx, name, ref)
		default:
		}
		if m.life.closed.Load() {
			if h := closedParkHook.Load(); h != nil {
				(*h)()
			}
			atomic.AddUint32(parked, ^uint32(0)) // before Close frees the agent record: it waits for us
			return 0, fmt.Errorf("lock %q: %w", name, ErrClosed)
		}
		// A look outside the in-flight count (enter): Status and IsHead
		// only read our slot and its entry, which stay mapped until the
		// Manager is garbage; a slot that Close's deregistration freed
		// meanwhile is reported as ErrClosed below. Two atomic adds on a
		// word every goroutine of the Manager shares fewer per look.
		st, token, ok := m.life.t.Status(m.life.a, ref)
		readied := w.relay.Load() && w.relay.Swap(false)
		head := ok && st == table.SlotWaiting && m.cfg.spin > 0 && (readied || !w.spun.Load() && m.life.t.IsHead(m.life.a, ref))
		switch {
		case ok && st == table.SlotHeld:
			atomic.AddUint32(parked, ^uint32(0))
			token, err := m.granted(ctx, name, ref, token)
			relay = err == nil && m.relayWanted()
			return token, err
		case ok && st == table.SlotWaiting:
			if m.cfg.deadlock > 0 && w.dl.verdict.Load() != nil {
				// A deadlock round found us a cycle's victim (deadlock.go).
				if token, err, over := m.checkDeadlock(ctx, name, w); over {
					atomic.AddUint32(parked, ^uint32(0))
					return token, err
				}
				continue // not withdrawn: look at the slot again
			}
		case ok && st == table.SlotStolen:
			// Granted and stolen before we looked: we never held it usefully.
			m.life.t.FreeStolen(m.life.a, ref)
			atomic.AddUint32(parked, ^uint32(0))
			return 0, fmt.Errorf("lock %q: %w", name, ErrStolen)
		default:
			atomic.AddUint32(parked, ^uint32(0))
			if m.life.closed.Load() {
				return 0, fmt.Errorf("lock %q: %w", name, ErrClosed)
			}
			return 0, fmt.Errorf("lock %q: request removed from the table (agent reaped?): %w", name, ErrStolen)
		}
		if m.cfg.bounded && ok && st == table.SlotWaiting && m.life.t.IsHead(m.life.a, ref) {
			if m.takeTurn(ref, true) {
				continue // a bounded table left us the name (fairness.go): the next look returns the grant
			}
			// Granted by someone else since our look (a starved hand-off)?
			// Our mark is set now: a grant after this look rings us, one
			// before it must be seen here, not slept through.
			if st, _, ok := m.life.t.Status(m.life.a, ref); !ok || st != table.SlotWaiting {
				continue
			}
		}
		if head {
			// Woken one grant ahead: spin (not counted as parked), then
			// park again with the usual re-check.
			w.spun.Store(true)
			m.life.t.MarkParked(ref, false) // a grant need not ring us while we spin
			atomic.AddUint32(parked, ^uint32(0))
			if token, err, over := m.spinHead(ctx, done, name, ref, false); over {
				relay = err == nil && m.relayWanted() // a readied request relays in turn
				return token, err
			}
			atomic.AddUint32(parked, 1)
			m.life.t.MarkParked(ref, true)
			continue
		}
		if watched {
			<-w.ch // a poke: Close's (it sets closed first), or the done watch's
			continue
		}
		select {
		case <-w.ch: // a poke (also Close's: it sets closed first)
		case <-done:
		}
	}
}

// closedParkHook, when set (tests only), runs when a parked request has
// seen its Manager closed, before it takes itself off the agent's parked
// count: a pause there widens the moment Close must wait for.
var closedParkHook atomic.Pointer[func()]

// spinHead watches the slot of a queued request for up to the spin limit
// (restarted by progress on the name). over reports that the wait is over
// (granted or aborted, with token and err); otherwise the caller parks.
//
// placed says the caller took one of the spinWindow places (takeSpinPlace);
// a request woken one grant ahead of its turn spins without one.
func (m *Manager) spinHead(ctx context.Context, done <-chan struct{}, name string, ref table.Ref, placed bool) (token uint64, err error, over bool) {
	if !placed {
		m.view.spinners.Add(1)
	}
	defer m.view.spinners.Add(-1)
	if m.yieldsSkipped() && m.view.agents.Load() > m.view.usable.Load() {
		// Our yields come back late: the machine is busy with other
		// work. On a crowded table a spinner shares its CPU with that
		// work by time slice; a sleeper, woken, goes ahead of it
		// (yieldgate.go).
		return 0, nil, false
	}
	if !m.enter() {
		return 0, nil, false // the parking loop reports ErrClosed
	}
	defer m.leave() // Close waits at most one spin limit for us
	// The budget starts at the first clock read, after 8 looks: a spin that
	// ends sooner (most hand-offs) reads no clock.
	var deadline, nextSched int64
	var freeAt int64 // a bounded table's head: when it saw the name free with mark freeMark (0: not free)
	var freeMark uint64
	oneCPU := m.onOneCPU()
	procs := m.view.procs.Load()
	// Barges move the budget's progress too where spinners spin off their
	// CPU (spinsOffCPU): there a head that parks while others barge must be
	// woken for its turn, a chain of wake-ups, where one that spins is
	// found at its grant by a look (docs/experiments.md).
	barges := spinsOffCPU(m.cfg.bounded, m.view.agents.Load() > m.view.usable.Load())
	progress := m.life.t.Progress(ref, barges)

	for i := 0; ; i++ {
		select {
		case <-done:
			token, err = m.abort(ctx, name, ref)
			return token, err, true
		default:
		}
		st, token, ok := m.life.t.Status(m.life.a, ref)
		if ok && st == table.SlotHeld {
			token, err = m.granted(ctx, name, ref, token)
			return token, err, true
		}
		if !ok || st != table.SlotWaiting {
			return 0, nil, false
		}
		crowded := m.view.agents.Load() > m.view.usable.Load()
		if m.cfg.bounded && i&3 == 0 {
			// A bounded table left us the name (fairness.go): take it once
			// it has stayed free for turnPatience; the next look returns
			// the grant.
			if mark, open := m.life.t.TurnOpen(m.life.a, ref); !open {
				freeAt = 0
			} else if freeAt == 0 || mark != freeMark {
				freeAt, freeMark = m.mono(), mark
			} else if m.mono()-freeAt >= int64(turnPatience) && m.takeTurn(ref, false) {
				continue
			}
		}
		parked, spinners := atomic.LoadUint32(m.life.a.Parked()), m.view.spinners.Load()
		lookOnly, yields, ownFirst := spinChoice(oneCPU, m.cfg.bounded, crowded, spinners, procs, parked, m.view.gaveP.Load())
		if i&7 == 7 && (!lookOnly || i&63 == 63) {
			// The budget is adaptive: it restarts whenever the queue moves
			// (a grant on the name), so a waiter keeps its CPU while its
			// turn approaches and parks after SpinLimit without progress.
			// A grant to a parked request of ours bumps our bell word: look
			// for it here rather than leave it to the doorbell, which
			// reaches a process whose Ps are all busy spinning only through
			// the runtime's netpoll (up to 10 ms under sysmon).
			if bell, last := atomic.LoadUint32(m.life.a.Bell()), m.wk.lastBell.Load(); bell != last &&
				atomic.LoadUint32(m.life.a.Parked()) > 0 && m.wk.lastBell.CompareAndSwap(last, bell) {
				m.scanWaiters(false)
			}
			now := m.mono()
			if deadline == 0 {
				deadline, nextSched = now+int64(m.cfg.spin), now+int64(goschedEvery)
				m.refreshView(now)
			}
			if p := m.life.t.Progress(ref, barges); p != progress {
				progress, deadline = p, now+int64(m.cfg.spin)
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
		switch spinStep(i, oneCPU, yields) {
		case spinPark:
			return 0, nil, false
		case spinOSYield:
			if ownFirst {
				runtime.Gosched()
			}
			if h := m.view.spinYieldHook; h != nil {
				h()
			} else {
				m.osYield()
			}
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
	out, _, err := m.life.t.Abort(m.life.a, ref, &w)
	if err == nil && out == table.Granted {
		err = m.life.t.Release(m.life.a, ref, &w)
	}
	if !w.Empty() {
		m.deliver(&w)
	}
	m.leave()
	return 0, fmt.Errorf("%w: lock %q: %w", ErrAborted, name, ctx.Err())
}

// relayNext readies the earliest parked request of ours on name to spin
// (m.mu held; it reads nothing of the mapping), called when a request of
// ours on name was granted after it waited and relayWanted said yes: the
// next grant of ours on the name is then a few grants away, and a request
// that spins when its turn comes is handed the lock in a hand-off of
// memory, where one that sleeps in a process the granter must
// wake through the doorbell costs a chain of thread wake-ups (a sendto, the
// bell loop's netpoller thread, then a thread to run the waiter;
// docs/experiments.md). This is the
// two-level queue's "each grant readies the next local request"
// (docs/waiting.md); the table's queue alone decides the order. Only when
// relays says so (a crowded table, more of our requests waiting than we
// can spin) and when this process may use several CPUs (on one, spinStep
// parks at once): relayWanted.
func (m *Manager) relayNext(name string) {
	q := m.waits.queues[name]
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
	crowded := m.view.agents.Load() > m.view.usable.Load()
	if m.cfg.spin <= 0 || !crowded || m.onOneCPU() {
		return false
	}
	return relays(crowded, atomic.LoadUint32(m.life.a.Parked()), m.view.spinners.Load(), m.view.procs.Load())
}
