package manager

import (
	"context"
	"errors"
	"fmt"
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
//
// fn's ctx carries the grant: a request made with it on the name is a child
// grant (see WithLock). It is done (context.Canceled) once the grant ends:
// when Request returns (or fn releases l itself), or the lock is lost; it
// then carries nothing.
func (m *Manager) Request(ctx context.Context, name string, opts RequestOptions,
	fn func(ctx context.Context, l *Lock) error) error {
	if m.life.be != nil {
		return m.requestBackend(ctx, name, opts, fn)
	}
	var ref table.Ref
	var token uint64
	var err error
	if m.stats == nil { // statistics off: one plain load (stats.go); m.request, written out: no call on the fast path
		ref, token, err = m.acquire(ctx, name, opts)
	} else {
		ref, token, err = m.acquireCounted(ctx, name, opts)
	}
	var kid *lockExt
	if err != nil {
		ref, token, kid, err = m.refused(ctx, name, opts, err)
	}
	switch {
	case errors.Is(err, ErrNotAvailable):
		return fn(ctx, nil)
	case err != nil:
		return err
	}
	// One object per grant, never reused: fn may keep its ctx (and l).
	g := new(grant)
	if kid != nil {
		kid.fill(&g.Lock)
		return g.run(ctx, fn)
	}
	l := &g.Lock
	l.m, l.name, l.mode, l.ref, l.token = m, name, uint8(opts.Mode), ref, token
	*(*uint64)(unsafe.Pointer(&l.state)) = heldWord // not yet published
	return g.run(ctx, fn)
}

// request makes a request on the table: acquire, counted when statistics
// are on (Request and acquireNew write it out: it is not inlined).
func (m *Manager) request(ctx context.Context, name string, opts RequestOptions) (table.Ref, uint64, error) {
	if m.stats == nil { // statistics off: one plain load (stats.go)
		return m.acquire(ctx, name, opts)
	}
	return m.acquireCounted(ctx, name, opts)
}

// refused follows up a request that request did not grant (err): when ctx
// carries a grant of this Manager on name, the request is a child grant
// of it (kid, reentrant.go); a parent that ended before its child was
// admitted carries nothing any more, and the request is made anew (which
// may grant it: ref, token). Any other err is returned as it is.
func (m *Manager) refused(ctx context.Context, name string, opts RequestOptions, err error) (ref table.Ref, token uint64, kid *lockExt, _ error) {
	for {
		r, ok := err.(*reentry)
		if !ok {
			return ref, token, nil, err
		}
		if kid, err = m.enterChild(ctx, r.parent, name, opts); err != errParentGone {
			return table.Ref{}, 0, kid, err
		}
		if ref, token, err = m.request(ctx, name, opts); err == nil {
			return ref, token, nil, nil
		}
	}
}

// run runs fn with g (held) and its ctx, and releases g (which ends the
// ctx).
func (g *grant) run(ctx context.Context, fn func(ctx context.Context, l *Lock) error) error {
	g.ctx.parent = ctx
	ferr := fn(&g.ctx, &g.Lock)
	rerr := g.Lock.Release()
	if rerr == nil || errors.Is(rerr, ErrReleased) {
		return ferr // released, or fn released the lock itself
	}
	// Stolen, reaped or closed under fn: report it with fn's own error.
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
	if m.life.be != nil { // the backend seam: one field load and a predictable branch
		return m.acquireBackend(ctx, name, opts, lp)
	}
	var ref table.Ref
	var token uint64
	var err error
	if m.stats == nil { // statistics off: one plain load (stats.go); m.request, written out: no call on the fast path
		ref, token, err = m.acquire(ctx, name, opts)
	} else {
		ref, token, err = m.acquireCounted(ctx, name, opts)
	}
	var kid *lockExt
	if err != nil {
		ref, token, kid, err = m.refused(ctx, name, opts, err)
	}
	switch {
	case err != nil:
		*lp = nil
		return err
	case kid != nil:
		kid.fill(*lp) // a child grant of ctx's (reentrant.go)
		return nil
	}
	l := *lp
	l.m, l.name, l.token, l.ref, l.mode = m, name, token, ref, uint8(opts.Mode)
	*(*uint64)(unsafe.Pointer(&l.state)) = heldWord
	return nil
}

// validate applies the contract's order: closed, then name and options, then ctx.
func (m *Manager) validate(ctx context.Context, name string, opts RequestOptions) error {
	if m.life.closed.Load() {
		return ErrClosed
	}
	if len(name) > 0 && name[0] == '-' && !internalCtx(ctx) {
		return fmt.Errorf("%w: lock name %q starts with '-'", ErrNotSupported, name)
	}
	if max := m.life.maxName; len(name) > max || max == 0 {
		if m.unopened() {
			return errNeverOpened
		}
		if len(name) > max {
			return fmt.Errorf("%w: lock name of %d bytes is longer than MaxNameLen %d", ErrNotSupported, len(name), max)
		}
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
// compiler may keep on the caller's stack; Request one with fn's ctx).
func (m *Manager) acquire(ctx context.Context, name string, opts RequestOptions) (ref table.Ref, token uint64, err error) {
	// The file may be truncated under us (the mapping then faults): the
	// fault becomes ErrCorrupt, and the Manager stops trusting its count
	// of operations in flight, which the fault may have left raised.
	defer table.EndGuard(table.BeginGuard(), &err, m.wk.faultFn)
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
		ref, token, out := m.life.t.AcquireFast(m.life.a, name, h, &w)
		if !w.Empty() {
			m.deliver(&w)
		}
		if out == table.Granted {
			if m.life.closed.Load() {
				// Give it back; if a latch holder had moved it into the
				// held list meanwhile, the release grants the next waiter,
				// who must be rung.
				m.life.t.Release(m.life.a, ref, &w)
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
	ref, err = m.life.t.Claim(m.life.a, h)
	if err != nil {
		m.noteErr("acquire", err)
		return table.Ref{}, 0, fmt.Errorf("lock %q: %w", name, err)
	}
	if m.life.closed.Load() {
		m.life.t.FreeClaimed(m.life.a, ref)
		return table.Ref{}, 0, ErrClosed
	}
	if !m.enter() {
		m.life.t.FreeClaimed(m.life.a, ref)
		return table.Ref{}, 0, ErrClosed
	}
	// One latched attempt that grants or queues, unless this Manager may be
	// due to yield outside the queue (mayYield: read without a clock): then
	// the first attempt only grants, and a request that finds the name
	// taken yields if it is due before it queues with a second attempt.
	// Either way an attempt that grants reads no clock.
	twoSteps := !opts.Steal && !opts.IfAvailable && m.cfg.spin > 0 && m.mayYield()
	ref, out, token, err := m.life.t.AcquireClaimed(m.life.a, ref, name, h, uint32(opts.Mode), opts.IfAvailable || twoSteps, opts.Steal, &w)
	if out == table.NotAvailable && err == nil && twoSteps {
		// The name is taken. Yield outside the queue if this Manager has
		// not given up its CPU for yieldEvery: let the other runnable
		// processes have it before we join the queue, so that the queue is
		// made of running processes (a grant then lands on a spinning
		// waiter, not on one the kernel has to schedule first). Not when
		// the table has no more agents than we have CPUs while another
		// request of ours waits (yieldsOutsideQueue, waitpolicy.go).
		if m.shouldYield() {
			m.leave()
			m.yieldIfDue()
			if !m.enter() {
				return table.Ref{}, 0, ErrClosed
			}
		}
		ref, out, token, err = m.life.t.Acquire(m.life.a, name, h, uint32(opts.Mode), false, false, &w)
	}
	if out == table.NotAvailable && err == nil && m.reapHolders(name, h) {
		// A holder in the way was dead: it has been reaped, try once more.
		ref, out, token, err = m.life.t.Acquire(m.life.a, name, h, uint32(opts.Mode), opts.IfAvailable, opts.Steal, &w)
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

// mono is the waiting policy's monotonic clock: the table's (a park may
// use its enqueue's reading, table.EnqueuedMono).
func (m *Manager) mono() int64 { return table.MonoNow() }
