package manager

import (
	"context"
	"errors"
	"fmt"
	"unsafe"
)

// Reentrancy by context.
//
// A ctx can carry held locks: WithLock(ctx, l) adds l, and the ctx given to
// Request's fn carries fn's lock. A request (Acquire or Request, not Steal)
// whose ctx carries a held grant of the same Manager on the same name is
// decided without the table:
//
//	carried     asked        outcome
//	exclusive   exclusive    a child grant, at once
//	exclusive   shared       a child grant, at once
//	shared      shared       a child grant, at once
//	shared      exclusive    ErrWouldDeadlock, at once (an upgrade: the
//	                         caller's own shared hold is in its way forever)
//
// IfAvailable changes nothing in that table (a child grant is available; an
// upgrade is ErrWouldDeadlock, not ErrNotAvailable, so that the mistake is
// not mistaken for contention). Steal is never reentrant: it steals, also
// from the carried grant, whose Lost channel closes (a steal is the
// recovery path and must reach every holder, including shared holders in
// other processes that a child grant would not displace).
//
// A child grant is a Lock with the outer grant's token and Lost channel. It
// holds nothing of its own: its Release only marks it released (and the
// outer grant's count of children, Reentries, goes down); it ends with the
// outer grant: once the outer grant is released, stolen or closed, the
// child's Release returns ErrReleased, ErrStolen or ErrClosed. Nothing is
// written to the table, so the fast path is untouched: a request can only
// find its ctx's grant on the path that did not get the name by the fast
// path's CAS (an idle name has no grant to re-enter), and only that path
// looks at ctx.Value.
//
// A ctx with no carried lock on the name (none, another name, another
// Manager, or one already released) changes nothing.

// heldKey is the ctx.Value key under which a ctx answers its carried locks.
type heldKey struct{}

// carrier is what ctx.Value(heldKey{}) returns: one carried lock, and the
// ctx to ask for the next one.
type carrier interface {
	carried() (l *Lock, inc uint64, next context.Context)
}

// withLock is the ctx made by WithLock.
type withLock struct {
	context.Context
	l   *Lock  // the outer grant (a child is resolved to its outer grant)
	inc uint64 // l's incarnation when carried: a reused Lock is not this grant
}

func (c *withLock) Value(key any) any {
	switch key.(type) {
	case heldKey, carriedKey: // carriedKey: the deadlock detector's (multi.go)
		return c
	}
	return c.Context.Value(key)
}

func (c *withLock) carried() (*Lock, uint64, context.Context) { return c.l, c.inc, c.Context }

// carried makes the ctx of Request's fn carry its lock (valid only during fn,
// like the Lock: inc is the incarnation of that grant).
func (c *lockCtx) carried() (*Lock, uint64, context.Context) { return c.l, c.inc, c.parent }

// WithLock returns a ctx that carries l: a request made with it on l's name
// (by l's Manager) in a mode l covers is granted at once as a child of l and
// ends with l; one that needs more than l (exclusive while l is shared)
// returns ErrWouldDeadlock at once. Steal through it steals (see the file
// comment of reentrant.go). A nil l returns ctx unchanged.
func WithLock(ctx context.Context, l *Lock) context.Context {
	if l == nil {
		return ctx
	}
	l, inc := l.outer()
	return &withLock{Context: ctx, l: l, inc: inc}
}

// outer returns the grant l stands for: l itself, or the outer grant of a
// child, with its incarnation.
func (l *Lock) outer() (*Lock, uint64) {
	if e := l.ext.Load(); e != nil && e.parent != nil {
		return e.parent, e.parentInc
	}
	return l, l.state.Load() >> stateBits
}

// heldByCtx returns the first lock carried by ctx that m holds on name, still
// in the incarnation carried.
func (m *Manager) heldByCtx(ctx context.Context, name string) (*Lock, uint64) {
	v := ctx.Value(heldKey{})
	for steps := 0; v != nil && steps < 1<<16; steps++ {
		c, ok := v.(carrier)
		if !ok {
			return nil, 0
		}
		l, inc, next := c.carried()
		if l != nil && l.m == m && l.name == name {
			if w := l.state.Load(); w>>stateBits == inc && w&stateMask == lockHeld {
				return l, inc
			}
		}
		if next == nil {
			return nil, 0
		}
		v = next.Value(heldKey{})
	}
	return nil, 0
}

// reentry is the outcome of a request that its ctx's grant covers; acquire
// returns it as an error so that the usual path carries nothing extra.
type reentry struct {
	parent *Lock
	inc    uint64
}

func (r *reentry) Error() string { return "shmlocks: reentrant grant" }

// reenter decides a request on name whose ctx may carry a grant: nil when it
// carries none (the request proceeds as usual), a *reentry when the grant
// covers the request, an ErrWouldDeadlock when it would need an upgrade.
func (m *Manager) reenter(ctx context.Context, name string, mode Mode) error {
	p, inc := m.heldByCtx(ctx, name)
	if p == nil {
		return nil
	}
	if Mode(p.mode) == Shared && mode == Exclusive {
		return fmt.Errorf("%w: lock %q: exclusive requested through a ctx holding it shared (token %d)", ErrWouldDeadlock, name, p.token)
	}
	return &reentry{parent: p, inc: inc}
}

// fill makes l (nobody else can reach it yet) a held child grant of r's
// parent in mode. It does not retain l (Acquire keeps l on its caller's
// stack when it can).
func (r *reentry) fill(l *Lock, mode Mode) {
	p := r.parent
	l.m, l.name, l.token, l.mode = p.m, p.name, p.token, uint8(mode)
	// Plain writes: l is new and unpublished, and an atomic store through
	// &l.ext would make every Acquire's Lock escape to the heap.
	*(*unsafe.Pointer)(unsafe.Pointer(&l.ext)) = unsafe.Pointer(&lockExt{parent: p, parentInc: r.inc})
	*(*uint64)(unsafe.Pointer(&l.state)) = 1<<stateBits | flagChild | lockHeld
	pe := p.extension()
	pe.mu.Lock()
	if pe.nestedInc != r.inc {
		pe.nestedInc, pe.nested = r.inc, 0
	}
	pe.nested++
	pe.mu.Unlock()
}

// parentHeld reports whether child extension e's outer grant is still held.
func (e *lockExt) parentHeld() bool {
	w := e.parent.state.Load()
	return w>>stateBits == e.parentInc && w&stateMask == lockHeld
}

// releaseChild ends child grant l (its state already moved to released).
func (l *Lock) releaseChild() error {
	// A plain load: a child's ext is written once before the child is
	// published and never again, and an atomic load through &l.ext would
	// make every Acquire's Lock escape to the heap (Release calls this).
	e := (*lockExt)(*(*unsafe.Pointer)(unsafe.Pointer(&l.ext)))
	p := e.parent
	pe := p.extension()
	pe.mu.Lock()
	if pe.nestedInc == e.parentInc && pe.nested > 0 {
		pe.nested--
	}
	pe.mu.Unlock()
	if e.parentHeld() {
		return nil
	}
	if w := p.state.Load(); w>>stateBits == e.parentInc {
		switch w & stateMask {
		case lockStolen:
			return fmt.Errorf("release %q: outer grant: %w", l.name, ErrStolen)
		case lockClosed:
			return fmt.Errorf("release %q: outer grant: %w", l.name, ErrClosed)
		}
	}
	return fmt.Errorf("release %q: the outer grant was released first: %w", l.name, ErrReleased)
}

// Reentries returns the number of child grants of this grant (reentrant
// requests through WithLock or Request's ctx) not yet released.
func (l *Lock) Reentries() int {
	l, inc := l.outer()
	e := l.ext.Load()
	if e == nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.nestedInc != inc {
		return 0
	}
	return e.nested
}

// requestChild is Request for a request that its ctx's grant covers: fn
// runs with a child grant and a ctx cancelled when ctx is or when the outer
// grant is lost.
func (m *Manager) requestChild(ctx context.Context, r *reentry, mode Mode, fn func(ctx context.Context, l *Lock) error) error {
	l := new(Lock)
	r.fill(l, mode)
	cctx, cancel := context.WithCancel(ctx)
	lost := r.parent.Lost()
	go func() {
		select {
		case <-lost:
			cancel()
		case <-cctx.Done():
		}
	}()
	ferr := fn(&withLock{Context: cctx, l: r.parent, inc: r.inc}, l)
	cancel()
	rerr := l.Release()
	if rerr == nil || errors.Is(rerr, ErrReleased) && r.parentHeldNow() {
		return ferr // fn released the child itself
	}
	return errors.Join(rerr, ferr)
}

func (r *reentry) parentHeldNow() bool {
	w := r.parent.state.Load()
	return w>>stateBits == r.inc && w&stateMask == lockHeld
}
