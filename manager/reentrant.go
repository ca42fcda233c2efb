package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"unsafe"
)

// Child grants: reentrancy by context (docs/multi-and-deadlock.md).
//
// A ctx can carry grants: WithLock(ctx, g) carries g, the ctx of Request's
// fn carries fn's grant, the ctx of RequestAll's fn its grants. A request
// (Acquire or Request, not Steal) whose ctx carries a held grant g of the
// same Manager on the same name is a child of g (of the innermost such
// grant, when the ctx carries several), decided without the table:
//
//	g           asked        outcome
//	exclusive   exclusive    a child, when no other child of g is held
//	exclusive   shared       a child, when no exclusive child of g is held
//	shared      shared       a child, at once
//	shared      exclusive    ErrWouldDeadlock, at once (an upgrade: g, held
//	                         by the caller's side, is in its way forever)
//
// Children of one grant exclude each other as requests of the name do:
// one exclusive child at a time, shared children together, granted in
// arrival order, a shared child never overtaking a waiting exclusive one.
// IfAvailable is granted only at once (else ErrNotAvailable), ctx aborts a
// waiting child (ErrAborted; a grant that raced with the abort is passed
// on), and a child is a grant like any other: it can have children of its
// own (a request through a ctx that carries the child). Steal is never a
// child: it steals, also from the carried grant.
//
// The owner of a child is whoever made the request: the goroutine that
// holds the child's Lock, or that runs the child Request's fn. Handing a
// ctx to goroutines hands them the right to ask, not the grant: four
// goroutines given fn's ctx take the name one at a time. The holder of g is
// not excluded by g's children (g is its own to share).
//
// A child never outlives its parent: releasing g, or losing it (a steal, a
// reap, Close, or, for a child, the end of its own parent), first ends
// every held child of g as a loss: its Lost channel closes, its fn's ctx is
// cancelled, its own children end in turn, and its Release returns
// ErrStolen (ErrClosed after Close). All of this happens before g's grant
// in the table is given up, so before anyone else can be granted the name.
// A child still waiting when g ends goes on as a request whose ctx does
// not carry g: it queues like any other (or is a child of another live
// grant its ctx carries).
//
// A ctx whose grant has ended carries nothing. Grants are never reused (a
// Lock, and fn's ctx, serve one grant: fnctx.go), so a ctx kept after its
// grant ended cannot come to carry a later one.
//
// A child holds nothing in the table: it has the token of its outermost
// grant, and Query shows that grant alone. The first child of a table grant
// registers it with the bell loop, so that a steal or reap reaches its
// children. The uncontended path is untouched: only a request that the
// fast path's CAS did not grant looks at ctx.Value (an idle name has no
// grant to re-enter).

// withLock is the ctx made by WithLock.
type withLock struct {
	context.Context
	l *Lock
}

// Value answers carriedKey (reentrancy, and the deadlock detector's holds:
// multi.go) with c itself.
func (c *withLock) Value(key any) any {
	if _, ok := key.(carriedKey); ok {
		return c
	}
	return c.Context.Value(key)
}

func (c *withLock) carried(i int) *Lock {
	if i == 0 {
		return c.l
	}
	return nil
}

func (c *withLock) carrier() context.Context { return c.Context }

// WithLock returns a ctx that carries l. A request made with it on l's name
// (by l's Manager) in a mode l covers is a child grant of l; one that needs
// more than l (exclusive while l is shared) returns ErrWouldDeadlock at
// once. Steal through it steals. A nil l returns ctx unchanged; an l that is
// no longer held carries nothing.
//
// The owner of a child grant is whoever made the request, not the holder of
// l: children of l exclude each other as requests of the name would (one
// exclusive child at a time, shared children together, in arrival order),
// so goroutines that share the ctx take turns. A child never outlives l:
// releasing or losing l first ends every child as a loss (its Lost closes,
// its Request fn's ctx is cancelled, its Release returns ErrStolen) before
// the name can be granted to anyone else. See the file comment of
// reentrant.go and docs/multi-and-deadlock.md.
func WithLock(ctx context.Context, l *Lock) context.Context {
	if l == nil {
		return ctx
	}
	return &withLock{Context: ctx, l: l}
}

// heldByCtx returns the innermost grant carried by ctx that m holds on name
// now, or nil.
func (m *Manager) heldByCtx(ctx context.Context, name string) *Lock {
	var held *Lock
	eachCarried(ctx, 1<<16, func(l *Lock) bool {
		if l.m == m && l.name == name && l.heldNow() {
			held = l
			return false
		}
		return true
	})
	return held
}

// reentry is the outcome of a request that its ctx's grant covers; acquire
// returns it as an error so that the usual path carries nothing extra.
type reentry struct{ parent *Lock }

func (r *reentry) Error() string { return "shmlocks: reentrant grant" }

// errParentGone: the grant a request was to be a child of ended first; the
// request is made again, its ctx now carrying nothing of that grant.
var errParentGone = errors.New("shmlocks: parent grant ended")

// reenter decides a request on name whose ctx may carry a grant: nil when it
// carries none (the request proceeds as usual), a *reentry when the grant
// covers the request, an ErrWouldDeadlock when it would need an upgrade.
func (m *Manager) reenter(ctx context.Context, name string, mode Mode) error {
	p := m.heldByCtx(ctx, name)
	if p == nil {
		return nil
	}
	if Mode(p.mode) == Shared && mode == Exclusive {
		return fmt.Errorf("%w: lock %q: exclusive requested through a ctx holding it shared (token %d)", ErrWouldDeadlock, name, p.token)
	}
	return &reentry{parent: p}
}

// kinship is the bookkeeping of a grant's children (in the grant's
// lockExt, under its mu).
type kinship struct {
	end    uint64        // 0 while the grant is held; then why it ended (lockReleased, lockStolen, lockClosed)
	ended  chan struct{} // of a backend grant whose loss is watched: closed with end (watchBackendLoss)
	excl   bool          // an exclusive child is held
	shared int           // shared children held
	live   []*lockExt    // the held children
	queue  []*kidWaiter  // the waiting children, in arrival order
}

// kidWaiter is a waiting child request.
type kidWaiter struct {
	kid     *lockExt
	ready   chan struct{} // closed once decided
	decided bool          // granted, or the parent ended (parent's mu)
	granted bool          // (parent's mu)
}

func (k *kinship) fits(mode Mode) bool {
	if mode == Exclusive {
		return !k.excl && k.shared == 0
	}
	return !k.excl
}

func (k *kinship) admit(kid *lockExt) {
	if kid.mode == Exclusive {
		k.excl = true
	} else {
		k.shared++
	}
	k.live = append(k.live, kid)
}

// promote grants the waiting children at the head of the queue while they fit.
func (k *kinship) promote() {
	for len(k.queue) > 0 && k.fits(k.queue[0].kid.mode) {
		w := k.queue[0]
		k.queue[0] = nil
		k.queue = k.queue[1:]
		k.admit(w.kid)
		w.decided, w.granted = true, true
		close(w.ready)
	}
	if len(k.queue) == 0 {
		k.queue = nil
	}
}

// leave removes held child kid and grants the waiters it was in the way
// of; false if kid was not held (its parent ended first).
func (k *kinship) leave(kid *lockExt) bool {
	i := slices.Index(k.live, kid)
	if i < 0 {
		return false
	}
	last := len(k.live) - 1
	k.live[i], k.live[last] = k.live[last], nil
	k.live = k.live[:last]
	if kid.mode == Exclusive {
		k.excl = false
	} else {
		k.shared--
	}
	k.promote()
	return true
}

// kinLocked returns e's kinship, creating it (e.mu held).
func (e *lockExt) kinLocked() *kinship {
	if e.kids == nil {
		e.kids = new(kinship)
	}
	return e.kids
}

// setKids marks l as having children (flagKids: its end ends them), unless
// it is no longer held.
func (l *Lock) setKids() bool {
	for w := l.state.Load(); ; w = l.state.Load() {
		if w&stateMask != lockHeld {
			return false
		}
		if w&flagKids != 0 || l.state.CompareAndSwap(w, w|flagKids) {
			return true
		}
	}
}

// enterChild makes a request on name a child of p, waiting for p's other
// children as the request would wait for other requests of the name. It
// returns the child's lockExt, or errParentGone when p ended first.
func (m *Manager) enterChild(ctx context.Context, p *Lock, name string, opts RequestOptions) (*lockExt, error) {
	pe := p.extension()
	if !p.setKids() {
		return nil, errParentGone
	}
	kid := &lockExt{parent: p, mode: opts.Mode}
	pe.mu.Lock()
	k := pe.kinLocked()
	// Release and markLost change p's state word before they end its
	// children (under pe.mu): a child admitted here is seen by them.
	if k.end != 0 || !p.heldNow() {
		pe.mu.Unlock()
		return nil, errParentGone
	}
	if len(k.queue) == 0 && k.fits(opts.Mode) {
		k.admit(kid)
		pe.mu.Unlock()
		p.watch() // a table grant: its steal or reap must reach its children
		pe.watchBackendLoss()
		return kid, nil
	}
	if opts.IfAvailable {
		pe.mu.Unlock()
		return nil, fmt.Errorf("lock %q (child of the grant of token %d): %w", name, p.token, ErrNotAvailable)
	}
	w := &kidWaiter{kid: kid, ready: make(chan struct{})}
	k.queue = append(k.queue, w)
	pe.mu.Unlock()
	select {
	case <-w.ready:
	case <-ctx.Done():
		pe.mu.Lock()
		granted := w.granted
		if !w.decided {
			k.queue = slices.DeleteFunc(k.queue, func(x *kidWaiter) bool { return x == w })
			k.promote() // the requests behind it may fit now
		} else if granted {
			k.leave(kid) // granted as ctx ended: pass the grant on
		}
		pe.mu.Unlock()
		return nil, fmt.Errorf("%w: lock %q: %w", ErrAborted, name, ctx.Err())
	}
	if !w.granted {
		return nil, errParentGone
	}
	pe.watchBackendLoss()
	return kid, nil
}

// watchBackendLoss makes the loss of e's grant, a backend's, end its
// children (a table grant's loss does so in markLost; a backend closes its
// grant's lost channel itself, so someone must watch it): once per grant,
// a goroutine waits for the loss or for the children's end.
func (e *lockExt) watchBackendLoss() {
	bk := e.bk
	if bk == nil {
		return
	}
	e.mu.Lock()
	k := e.kinLocked()
	if k.ended != nil || k.end != 0 {
		e.mu.Unlock()
		return
	}
	ended := make(chan struct{})
	k.ended = ended
	e.mu.Unlock()
	bk.watch()
	go func() {
		select {
		case <-bk.Lost:
			e.endKids(lockStolen)
		case <-ended:
		}
	}()
}

// endKids ends e's grant's children (e's grant ended, why: lockReleased,
// lockStolen or lockClosed): the held ones as a loss, the waiting ones go
// on as requests whose ctx does not carry the grant. No child is admitted
// after it.
func (e *lockExt) endKids(why uint64) {
	e.mu.Lock()
	k := e.kinLocked()
	if k.end != 0 {
		e.mu.Unlock()
		return
	}
	k.end = why
	if k.ended != nil {
		close(k.ended) // the backend loss watch is done
	}
	live := k.live
	for _, w := range k.queue {
		w.decided = true
		close(w.ready)
	}
	k.live, k.queue, k.excl, k.shared = nil, nil, false, 0
	e.mu.Unlock()
	for _, kid := range live {
		kid.orphan(why)
	}
}

// reopenKids lets e's grant, whose release failed (it is still held),
// have children again (their bookkeeping was ended by the release).
func (e *lockExt) reopenKids() {
	e.mu.Lock()
	if e.kids != nil {
		*e.kids = kinship{}
	}
	e.mu.Unlock()
}

// orphan ends held child kid as a loss, its parent having ended (why):
// its Lost closes, its fn's ctx is cancelled, its own children end.
func (kid *lockExt) orphan(why uint64) {
	kid.mu.Lock()
	kid.gone.Store(why) // under mu: enterChild reads it under mu
	if kid.lost != nil {
		close(kid.lost)
	} else {
		kid.lost = closedChan
	}
	fn := kid.fn
	grandkids := kid.kids != nil
	kid.mu.Unlock()
	if fn != nil {
		fn.cancel(context.Canceled, false)
	}
	if grandkids {
		if why != lockClosed {
			why = lockStolen // lost, not released by their parent's holder
		}
		kid.endKids(why)
	}
}

// fill makes l (new, not yet reachable by anyone else) the held child
// grant kid. It does not retain l (Acquire keeps l on its caller's stack
// when it can): plain writes, as an atomic store through &l.ext would move
// every Acquire's Lock to the heap.
func (kid *lockExt) fill(l *Lock) {
	p := kid.parent
	l.m, l.name, l.token, l.ref, l.mode = p.m, p.name, p.token, p.ref, uint8(kid.mode)
	*(*unsafe.Pointer)(unsafe.Pointer(&l.ext)) = unsafe.Pointer(kid)
	*(*uint64)(unsafe.Pointer(&l.state)) = heldWord | flagChild
}

// releaseKin is Release of a grant with children or a fn ctx with a Done
// channel, or of a child (its state word, word, already moved to
// released): fn's ctx and the children end first, then the grant is given
// up (a child leaves its parent's bookkeeping).
func (l *Lock) releaseKin(word uint64) error {
	// A plain load: ext was written before l was handed out (a child's by
	// fill) or before flagKids or flagCtx was set (word shows them), and an
	// atomic load through &l.ext would move every Acquire's Lock to the heap.
	e := (*lockExt)(*(*unsafe.Pointer)(unsafe.Pointer(&l.ext)))
	if word&flagCtx != 0 {
		e.mu.Lock()
		fn := e.fn
		e.mu.Unlock()
		fn.cancel(context.Canceled, false)
	}
	if word&flagKids != 0 {
		e.endKids(lockReleased)
	}
	if word&flagChild == 0 {
		return l.release(word)
	}
	pe := e.parent.ext.Load()
	pe.mu.Lock()
	k := pe.kids
	left, why := k.leave(e), k.end
	pe.mu.Unlock()
	if left {
		return nil
	}
	switch why {
	case lockClosed:
		return fmt.Errorf("release %q: a child grant, ended with its parent: %w", l.name, ErrClosed)
	case lockReleased:
		return fmt.Errorf("release %q: a child grant, lost: its parent grant was released first: %w", l.name, ErrStolen)
	}
	return fmt.Errorf("release %q: a child grant, lost with its parent grant: %w", l.name, ErrStolen)
}

// Reentries returns the number of child grants of this grant (requests
// made through WithLock or fn's ctx) held now. A child's own children are
// counted by the child.
func (l *Lock) Reentries() int {
	if l == nil {
		return 0
	}
	e := l.ext.Load()
	if e == nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.kids == nil {
		return 0
	}
	return len(e.kids.live)
}
