package manager

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// The ctx of Request's fn.
//
// It carries fn's grant (a request made with it on the name is a child of
// that grant: reentrant.go), has its parent's values and deadline, and is
// cancelled when the parent is, when the grant is taken away, and when
// Request returns. It obeys context.Context: once Done is closed, Err is
// non-nil, and Done returns one channel for the ctx's life.
//
// User code may keep fn's ctx after Request returned (a goroutine started
// in fn), so it is never reused: one object per grant holds the Lock and
// the ctx (grant), and nothing pooled is reachable from it. Once the grant
// has ended the ctx carries nothing (Lock.heldNow) and is done.
//
// Nothing is allocated, and no goroutine started, until Done is asked for:
// then the channel, and an AfterFunc on a cancellable parent; the loss of
// the grant reaches the ctx through its lockExt (markLost, or the end of a
// child's parent), with no goroutine waiting for it.

// grant is what Request hands fn: its ctx and its Lock, in one allocation
// (of 128 bytes). ctx comes first: fnCtx.lock finds the Lock from it.
type grant struct {
	ctx  fnCtx
	Lock Lock
}

// fnCtx is the ctx of Request's fn (see above). It lives in a grant.
type fnCtx struct {
	parent context.Context
	mu     sync.Mutex
	flags  atomic.Uint32 // ctxEnded | ctxArmed
	done   chan struct{} // made by Done; closed by cancel (mu)
	err    error         // set once, when cancelled (mu): then done, if made, is closed
	stop   func() bool   // the AfterFunc on parent (mu)
}

const (
	ctxEnded      = 1 << iota // Request returned
	ctxArmed                  // Done was asked for: the end must close the channel
	ctxParentDone             // cancelled because the parent is done (its cause is the parent's)
)

// lock returns the grant c carries (c is the first field of its grant).
func (c *fnCtx) lock() *Lock { return &(*grant)(unsafe.Pointer(c)).Lock }

func (c *fnCtx) Deadline() (time.Time, bool) { return c.parent.Deadline() }

// Value answers carriedKey (reentrancy, and the deadlock detector's holds:
// multi.go) with c itself; any other key goes to the parent, except the
// context package's own key once c is done for a reason of its own (its
// grant ended or was lost): context.Cause(c) is then c.Err(), not the
// cause of a parent that was not cancelled.
func (c *fnCtx) Value(key any) any {
	if _, ok := key.(carriedKey); ok {
		return c
	}
	if key == causeKey && causeKey != nil && c.flags.Load()&ctxParentDone == 0 && c.Err() != nil {
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

// cause says why c is done, nil if it is not (yet), with ctxParentDone if
// the reason is its parent's end.
func (c *fnCtx) cause() (flag uint32, err error) {
	if c.flags.Load()&ctxEnded != 0 || c.lock().lostNow() {
		return 0, context.Canceled
	}
	if err := c.parent.Err(); err != nil {
		return ctxParentDone, err
	}
	return 0, nil
}

func (c *fnCtx) Err() error {
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if flag, cause := c.cause(); cause != nil {
		return c.cancelBy(cause, flag)
	}
	return nil
}

func (c *fnCtx) Done() <-chan struct{} {
	c.mu.Lock()
	if c.done != nil {
		d := c.done
		c.mu.Unlock()
		return d
	}
	// Armed before cause reads ctxEnded: an end after this sees ctxArmed
	// and closes the channel made below; one before it is seen here.
	c.flags.Or(ctxArmed)
	if c.err == nil {
		var flag uint32
		if flag, c.err = c.cause(); flag != 0 {
			c.flags.Or(flag)
		}
	}
	if c.err != nil {
		c.done = closedChan
		c.mu.Unlock()
		return closedChan
	}
	d := make(chan struct{})
	c.done = d
	c.mu.Unlock()
	// Outside c.mu: either may cancel c at once.
	if c.parent.Done() != nil {
		stop := context.AfterFunc(c.parent, c.parentDone)
		c.mu.Lock()
		if c.err == nil {
			c.stop, stop = stop, nil
		}
		c.mu.Unlock()
		if stop != nil {
			stop() // cancelled meanwhile
		}
	}
	c.lock().noteLoss(c)
	return d
}

// parentDone cancels c when its parent is done.
func (c *fnCtx) parentDone() {
	err := c.parent.Err()
	if err == nil {
		err = context.Canceled // a parent that broke the rule: Done closed, Err nil
	}
	c.cancelBy(err, ctxParentDone)
}

// cancel makes c done with err (unless it is already) and returns c's error.
// The channel is closed only by the first cancel: a Done made after the
// error was set returns closedChan.
func (c *fnCtx) cancel(err error) error { return c.cancelBy(err, 0) }

// cancelBy is cancel, noting flag (ctxParentDone) with the error.
func (c *fnCtx) cancelBy(err error, flag uint32) error {
	c.mu.Lock()
	if c.err != nil {
		err = c.err
		c.mu.Unlock()
		return err
	}
	if flag != 0 {
		c.flags.Or(flag)
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	stop := c.stop
	c.stop = nil
	c.mu.Unlock()
	if stop != nil {
		stop()
	}
	return err
}

// end is called when Request returns: c is done (context.Canceled) from
// now on.
func (c *fnCtx) end() {
	if c.flags.Or(ctxEnded)&ctxArmed != 0 {
		c.cancel(context.Canceled)
	}
}

// noteLoss arranges for fn's ctx c to be cancelled when l is taken away,
// or cancels it now if it was.
func (l *Lock) noteLoss(c *fnCtx) {
	word := l.state.Load()
	if word&flagBackend != 0 {
		// A backend closes its grant's lost channel itself.
		bk := l.ext.Load().bk
		bk.watch()
		go func() {
			select {
			case <-bk.Lost:
				c.cancel(context.Canceled)
			case <-c.done:
			}
		}()
		return
	}
	e := l.extension()
	e.mu.Lock()
	lost := l.lostNow()
	if !lost {
		e.fn = c // markLost, or the end of a child's parent, cancels it
	}
	e.mu.Unlock()
	if lost {
		c.cancel(context.Canceled)
		return
	}
	if word&flagChild == 0 {
		l.watch() // a steal or reap marks l lost (and may do so at once)
	}
}
