package manager

import (
	"context"
)

// Waking parked requests when their context ends, without a select on the
// context's Done channel in every park.
//
// A parked request sleeps on its own poke channel. Selecting on ctx.Done()
// as well costs a lock of that channel at every park and wake-up, and when
// many requests share one context (the goroutines of a server, a worker
// pool under one deadline) that one channel's lock is taken by all of
// them, a cost a context without a Done channel does not pay
// (docs/experiments.md). So a Done channel that more than one park uses is
// watched once, by one context.AfterFunc, which pokes every parked request
// registered with it; those parks receive on their poke channel only, and
// look at ctx.Done() (without blocking) whenever they wake.
//
// A Done channel is registered at its second park in a row (lastDone): a
// caller that makes a context per request (WithTimeout around each
// Request) keeps the select, which costs it nothing shared, rather than an
// AfterFunc per wait. A registration whose parks are all over stays idle
// for the next park with the same channel; at most maxIdleDones stay, the
// oldest idle one stopped first, and Close stops them all.
//
// No wake-up is lost: a park registers under m.mu before it first looks at
// ctx.Done(), and the AfterFunc pokes, under m.mu, every park registered
// with its channel. A park that registers after the AfterFunc ran (its
// context was done already) looks at ctx.Done() before it sleeps.

// doneWatches are a Manager's watched Done channels (under m.mu).
type doneWatches struct {
	dones       map[<-chan struct{}]*doneWatch // watched Done channels of parked requests
	lastDone    <-chan struct{}                // the Done channel of the last park that did not register
	nidle       int                            // registrations in dones with no park
	doneIdleSeq uint64                         // orders idle registrations (oldest stopped first)
}

// doneWatch is one watched Done channel (fields under m.mu).
type doneWatch struct {
	done <-chan struct{}
	stop func() bool // the AfterFunc's
	head *waiter     // parks registered with it, linked by dnext/dprev
	n    int         // how many
	gone bool        // no longer in m.dones (its AfterFunc ran, or Close stopped it)
	idle uint64      // when n fell to 0: m.doneIdleSeq at that moment (eviction order)
}

// maxIdleDones bounds the registrations kept with no park (each retains its
// context until stopped).
const maxIdleDones = 4

// watchDone registers parked waiter w, whose request's context is ctx with
// Done channel done (not nil), with the watch of done if done is shared
// (m.mu held). It reports whether w is registered: then w's park need not
// select on done.
func (m *Manager) watchDone(ctx context.Context, done <-chan struct{}, w *waiter) bool {
	dw := m.dw.dones[done]
	if dw == nil {
		if m.dw.lastDone != done {
			m.dw.lastDone = done // seen once: the park selects on it this time
			return false
		}
		if m.life.closed.Load() {
			return false // Close stops the registrations; a late one would leak
		}
		dw = &doneWatch{done: done}
		m.dw.dones[done] = dw
		dw.stop = context.AfterFunc(ctx, func() { m.doneFired(dw) })
	} else if dw.n == 0 {
		m.dw.nidle-- // idle no more
	}
	dw.n++
	w.dw = dw
	w.dprev, w.dnext = nil, dw.head
	if dw.head != nil {
		dw.head.dprev = w
	}
	dw.head = w
	return true
}

// unwatchDone removes w from its done watch (m.mu held), when its park is
// over. The last park leaves the watch idle, to be reused by the next park
// with the same Done channel.
func (m *Manager) unwatchDone(w *waiter) {
	dw := w.dw
	if dw == nil {
		return
	}
	w.dw = nil
	if w.dprev == nil {
		dw.head = w.dnext
	} else {
		w.dprev.dnext = w.dnext
	}
	if w.dnext != nil {
		w.dnext.dprev = w.dprev
	}
	w.dprev, w.dnext = nil, nil
	dw.n--
	if dw.n > 0 || dw.gone {
		return
	}
	m.dw.doneIdleSeq++
	dw.idle = m.dw.doneIdleSeq
	m.dw.nidle++
	if m.dw.nidle > maxIdleDones {
		m.evictIdleDone()
	}
}

// evictIdleDone stops the registration idle for the longest (m.mu held).
func (m *Manager) evictIdleDone() {
	var old *doneWatch
	for _, dw := range m.dw.dones {
		if dw.n == 0 && (old == nil || dw.idle < old.idle) {
			old = dw
		}
	}
	if old == nil {
		return
	}
	delete(m.dw.dones, old.done)
	m.dw.nidle--
	old.stop()
}

// doneFired is dw's AfterFunc: its context is done. It pokes every park
// registered with it (each sees ctx.Done() closed and aborts) and drops
// the registration.
func (m *Manager) doneFired(dw *doneWatch) {
	m.waits.mu.Lock()
	defer m.waits.mu.Unlock()
	dw.gone = true
	if m.dw.dones[dw.done] == dw {
		delete(m.dw.dones, dw.done)
		if dw.n == 0 {
			m.dw.nidle--
		}
	}
	for w := dw.head; w != nil; w = w.dnext {
		w.poke()
	}
}

// stopDones stops every done watch (Close; m.mu held). Parks still
// registered are woken by Close's pokes and unregister as they leave.
func (m *Manager) stopDones() {
	for done, dw := range m.dw.dones {
		delete(m.dw.dones, done)
		if dw.n == 0 {
			m.dw.nidle--
		}
		dw.gone = true // its last park must not count it idle
		dw.stop()
	}
}
