package manager

import (
	"context"
	"time"
	"unsafe"
)

// The ctx of Request's fn.
//
// It carries fn's grant (a request made with it on the name is a child of
// that grant: reentrant.go), has its parent's values and deadline, and is
// done once the grant has ended (released, by Request when fn returns or
// by fn itself; taken away; for a child, ended with its parent) or its
// parent is done. It obeys context.Context: once Done is closed, Err is
// non-nil and stays the same, and Done returns one channel for the ctx's
// life.
//
// User code may keep fn's ctx after Request returned (a goroutine started
// in fn), so it is never reused: one object per grant holds the ctx and the
// Lock (grant, 80 bytes), and nothing pooled is reachable from it. Once the
// grant has ended the ctx carries nothing (Lock.heldNow) and is done.
//
// The ctx itself is its parent alone: its state (the Done channel, the
// error, the AfterFunc on the parent) lives in the Lock's lockExt, made
// when Done is asked for or an error is first reported. Until then nothing
// is allocated beyond the grant and no goroutine started. Once Done was
// asked for, flagCtx in the Lock's state word makes Release close the
// channel (before the table grant is given up), and a loss reaches it
// through lockExt.fn (markLost, or the end of a child's parent), with no
// goroutine waiting for it.

// grant is what Request hands fn: its ctx and its Lock, in one allocation.
// ctx comes first: fnCtx.lock finds the Lock from it.
type grant struct {
	ctx  fnCtx
	Lock Lock
}

// fnCtx is the ctx of Request's fn (see above). It lives in a grant.
type fnCtx struct{ parent context.Context }

// lock returns the grant c carries (c is the first field of its grant).
func (c *fnCtx) lock() *Lock { return &(*grant)(unsafe.Pointer(c)).Lock }

func (c *fnCtx) Deadline() (time.Time, bool) { return c.parent.Deadline() }

// Value answers carriedKey (reentrancy, and the deadlock detector's holds:
// multi.go) with c itself; any other key goes to the parent, except the
// context package's own key once c is done for a reason of its own (its
// grant ended): context.Cause(c) is then c.Err(), not the cause of a parent
// that was not cancelled.
func (c *fnCtx) Value(key any) any {
	if _, ok := key.(carriedKey); ok {
		return c
	}
	if key == causeKey && causeKey != nil && c.Err() != nil && !c.byParent() {
		return nil
	}
	return c.parent.Value(key)
}

// causeKey is the key with which context.Cause asks a Context for its
// cancellation cause (unexported in the context package; nil if Cause
// ever stops asking).
var causeKey = func() any {
	var p causeProbe
	context.Cause(&p)
	return p.key
}()

// causeProbe records the key context.Cause asks it for.
type causeProbe struct {
	context.Context
	key any
}

func (p *causeProbe) Value(key any) any {
	if p.key == nil {
		p.key = key
	}
	return nil
}

func (p *causeProbe) Err() error { return nil }

// fn's ctx carries its grant.
func (c *fnCtx) carried(i int) *Lock {
	if i == 0 {
		return c.lock()
	}
	return nil
}

func (c *fnCtx) carrier() context.Context { return c.parent }

// cause says why c is done, nil if it is not (yet); byParent if the
// reason is its parent's end.
func (c *fnCtx) cause() (err error, byParent bool) {
	if l := c.lock(); !l.heldNow() || l.lostNow() {
		return context.Canceled, false
	}
	if err := c.parent.Err(); err != nil {
		return err, true
	}
	return nil, false
}

// byParent reports whether c, done (its error recorded), was cancelled by
// its parent's end.
func (c *fnCtx) byParent() bool {
	e := c.lock().ext.Load()
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ctxByParent
}

func (c *fnCtx) Err() error {
	if e := c.lock().ext.Load(); e != nil {
		e.mu.Lock()
		err := e.ctxErr
		e.mu.Unlock()
		if err != nil {
			return err
		}
	}
	if err, byParent := c.cause(); err != nil {
		return c.cancel(err, byParent)
	}
	return nil
}

func (c *fnCtx) Done() <-chan struct{} {
	l := c.lock()
	e := l.extension()
	e.mu.Lock()
	if e.ctxDone != nil {
		d := e.ctxDone
		e.mu.Unlock()
		return d
	}
	if e.ctxErr == nil {
		e.ctxErr, e.ctxByParent = c.cause()
	}
	if e.ctxErr != nil {
		e.ctxDone = closedChan
		e.mu.Unlock()
		return closedChan
	}
	d := make(chan struct{})
	e.ctxDone, e.fn = d, c // markLost, or the end of a child's parent, cancels c
	e.mu.Unlock()
	// Outside e.mu: each of these may cancel c at once.
	if !l.setFlag(flagCtx) {
		c.cancel(context.Canceled, false) // released meanwhile, before it could see flagCtx
		return d
	}
	if c.parent.Done() != nil {
		stop := context.AfterFunc(c.parent, c.parentDone)
		e.mu.Lock()
		if e.ctxErr == nil {
			e.ctxStop, stop = stop, nil
		}
		e.mu.Unlock()
		if stop != nil {
			stop() // cancelled meanwhile
		}
	}
	switch w := l.state.Load(); {
	case w&flagBackend != 0:
		// A backend closes its grant's lost channel itself.
		bk := e.bk
		bk.watch()
		go func() {
			select {
			case <-bk.Lost:
				c.cancel(context.Canceled, false)
			case <-d:
			}
		}()
	case w&flagChild == 0:
		l.watch() // a steal or reap marks l lost (and may do so at once)
	}
	return d
}

// parentDone cancels c when its parent is done.
func (c *fnCtx) parentDone() {
	err := c.parent.Err()
	if err == nil {
		err = context.Canceled // a parent that broke the rule: Done closed, Err nil
	}
	c.cancel(err, true)
}

// cancel makes c done with err (unless it is already) and returns c's
// error. The channel is closed only by the first cancel: a Done made after
// the error was set returns closedChan.
func (c *fnCtx) cancel(err error, byParent bool) error {
	e := c.lock().extension()
	e.mu.Lock()
	if e.ctxErr != nil {
		err = e.ctxErr
		e.mu.Unlock()
		return err
	}
	e.ctxErr, e.ctxByParent = err, byParent
	if e.ctxDone != nil {
		close(e.ctxDone)
	}
	stop := e.ctxStop
	e.ctxStop = nil
	e.mu.Unlock()
	if stop != nil {
		stop()
	}
	return err
}

// setFlag sets flag in l's state word, unless l is no longer held.
func (l *Lock) setFlag(flag uint64) bool {
	for w := l.state.Load(); ; w = l.state.Load() {
		if w&stateMask != lockHeld {
			return false
		}
		if w&flag != 0 || l.state.CompareAndSwap(w, w|flag) {
			return true
		}
	}
}
