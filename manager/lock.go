package manager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/shmlocks/shmlocks/table"
)

// Lock states, in the low bits of Lock.state; the bits above stateBits
// count the Lock's incarnations. Request reuses Lock objects, and the bell
// loop may still hold a pointer to a Lock that was released and granted
// again: it only ever changes a Lock by a CAS on the exact (incarnation,
// state) word it validated, so it can never touch a later incarnation.
const (
	lockHeld     = 1 + iota // granted, not yet released
	lockReleased            // released by its holder
	lockClosed              // released by Close
	lockStolen              // stolen or reaped while held

	stateMask      = 0x0f // the lock state
	flagRegistered = 0x10 // in m.held, so that the bell loop closes lost when it is taken away
	flagShown      = 0x20 // some incarnation was registered: the bell loop may still read the word (kept by init)
	flagChild      = 0x40 // a child grant of a reentrant request (reentrant.go): nothing in the table
	flagBackend    = 0x80 // a grant of a Backend (in ext.bk), not of the table: never registered
	stateBits      = 8
)

// Lock is a granted request. A Lock obtained in Request's callback must not
// be used after the callback returns.
//
// Acquire makes one Lock per grant (a handle must never alias a later
// grant), on its caller's stack when it can (see Acquire), else on the heap,
// so the Lock is kept to one 64-byte size class: what only Lost and
// Request's context use lives in ext, allocated on first use.
type Lock struct {
	m     *Manager
	name  string
	token uint64
	state atomic.Uint64 // incarnation<<stateBits | flagShown? | flagRegistered? | lock state
	ref   table.Ref
	mode  uint8
	ext   atomic.Pointer[lockExt]
}

// lockExt is the part of a Lock that Lost and Request's context need.
type lockExt struct {
	mu   sync.Mutex
	lost chan struct{} // created lazily by Lost or the Request context
	ctx  lockCtx       // Request's context for fn (a pooled Lock keeps it)
	bk   *backendGrant // the grant, on a Manager made by NewBackendManager

	// Reentrancy (reentrant.go). Of a child grant: its outer grant and that
	// grant's incarnation (written before the child is published). Of an
	// outer grant: how many children of incarnation nestedInc are held (mu).
	parent    *Lock
	parentInc uint64
	nested    int
	nestedInc uint64
}

// extension returns l's lockExt, creating it.
func (l *Lock) extension() *lockExt {
	if e := l.ext.Load(); e != nil {
		return e
	}
	l.ext.CompareAndSwap(nil, &lockExt{})
	return l.ext.Load()
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// init makes pooled Lock l (Request's) a fresh held lock: a new incarnation.
// Only the state word is read by other goroutines, so the other fields are
// written plainly.
func (l *Lock) init(m *Manager, name string, mode Mode, ref table.Ref, token uint64) {
	l.m, l.name, l.mode, l.ref, l.token = m, name, uint8(mode), ref, token
	if e := l.ext.Load(); e != nil {
		e.lost = nil
	}
	word := l.state.Load()
	next := (word>>stateBits+1)<<stateBits | word&flagShown | lockHeld
	if word&flagShown == 0 {
		// No incarnation of l was ever registered, so the bell loop and
		// Close never had a pointer to it: nobody else reads this word now
		// (a Lock from Request is not used after its callback returned).
		*(*uint64)(unsafe.Pointer(&l.state)) = next
		return
	}
	l.state.Store(next)
}

func (l *Lock) st() uint64 { return l.state.Load() & stateMask }

// Name returns the lock's name.
func (l *Lock) Name() string { return l.name }

// Mode returns the lock's mode.
func (l *Lock) Mode() Mode { return Mode(l.mode) }

// Token returns the fencing token of this grant: strictly increasing per
// name, across agents, deaths, steals and reuse of table entries, for the
// life of the file.
func (l *Lock) Token() uint64 { return l.token }

// Lost returns a channel that is closed when the lock is stolen or
// otherwise taken away (reaped, or released by Close).
func (l *Lock) Lost() <-chan struct{} {
	if e := l.ext.Load(); e != nil && e.parent != nil {
		// A child grant is lost with its outer grant.
		if !e.parentHeld() {
			return closedChan
		}
		return e.parent.Lost()
	}
	e := l.extension()
	e.mu.Lock()
	c := l.lostLocked(e)
	e.mu.Unlock()
	if c != closedChan {
		l.watch()
	}
	return c
}

// lostLocked returns the lost channel, creating it (e is l's lockExt, e.mu
// held). markLost, which changes the state word before it looks for e,
// closes the channel if it finds e; if it did not, the state word read here
// already says lost.
func (l *Lock) lostLocked(e *lockExt) chan struct{} {
	if e.lost == nil {
		if st := l.st(); st == lockStolen || st == lockClosed {
			return closedChan
		}
		e.lost = make(chan struct{})
	}
	return e.lost
}

// watch registers a held lock with its Manager's bell loop, which closes its
// lost channel when a steal or reap takes it away, and then looks once
// itself, in case that happened before the registration.
func (l *Lock) watch() {
	word := l.state.Load()
	if word&stateMask != lockHeld || word&(flagRegistered|flagBackend) != 0 {
		if word&flagBackend != 0 {
			l.ext.Load().bk.watch() // a backend closes its grants' lost channels itself
		}
		return
	}
	m := l.m
	if !m.enter() {
		l.markLost(word, lockClosed)
		return
	}
	defer m.leave()
	// A fault on the mapping (the file truncated under us) leaves l
	// registered: the bell loop's scans, guarded too, keep looking.
	var fault error
	defer table.EndGuard(table.BeginGuard(), &fault, m.faultFn)
	// flagShown is set before the bell loop can see l, and init keeps it.
	reg := word | flagRegistered | flagShown
	if !l.state.CompareAndSwap(word, reg) {
		return
	}
	e := m.held.store(l.ref.Slot, l.ref.Serial, l)
	if l.state.Load() != reg {
		// Released (or lost) between the CAS and the Store, too early for
		// Release to unregister it: do it here.
		m.held.dropEntry(l.ref.Slot, e)
		return
	}
	m.loseIfGone(l.ref.Slot, e)
}

// markLost moves the incarnation whose state word is word from held to to
// (lockStolen or lockClosed) and closes its channels. It does nothing if l
// has moved on (released, or another incarnation).
func (l *Lock) markLost(word, to uint64) bool {
	if word&stateMask != lockHeld || !l.state.CompareAndSwap(word, word&^stateMask|to) {
		return false
	}
	e := l.ext.Load()
	if e == nil {
		return true // nobody asked for Lost yet: lostLocked reads the state word
	}
	e.mu.Lock()
	if e.lost != nil {
		close(e.lost)
	} else {
		e.lost = closedChan
	}
	e.mu.Unlock()
	return true
}

// Release releases the lock. A second Release, or one after the lock was
// stolen or released by Close, returns an error (ErrReleased, ErrStolen or
// ErrClosed) and never touches another holder's grant.
func (l *Lock) Release() error {
	if l == nil || l.m == nil {
		return fmt.Errorf("%w: nil lock", ErrReleased)
	}
	word := l.state.Load()
	if word&stateMask != lockHeld || !l.state.CompareAndSwap(word, word&^stateMask|lockReleased) {
		return l.notHeldErr()
	}
	if word&flagChild != 0 {
		return l.releaseChild()
	}
	return l.release(word)
}

// releaseOwn is Release by Request once its callback has returned: if l was
// never registered (nothing but this goroutine can reach it any more), the
// state word needs no CAS; it is left as it is, and a failed release sets it.
func (l *Lock) releaseOwn() error {
	word := l.state.Load()
	if word&(stateMask|flagRegistered|flagChild) != lockHeld {
		return l.Release()
	}
	return l.release(word)
}

// release gives up the table's grant of l, whose state word was word (held)
// and is now l's alone to set.
func (l *Lock) release(word uint64) error {
	m := l.m
	var reg *regEntry
	if word&(flagRegistered|flagBackend) != 0 {
		// One test of the word already loaded serves both: a table
		// lock's Release pays nothing for the backend seam.
		if word&flagBackend != 0 {
			return l.releaseBackend(word)
		}
		reg = m.held.drop(l.ref.Slot, l)
	}
	if m.closed.Load() {
		return fmt.Errorf("release %q: %w", l.name, ErrClosed) // Close released it
	}
	// No in-flight count here (the uncontended path saves two atomic adds):
	// a Close racing with this Release leaves the mapping valid (see Close)
	// and frees our slot, so the table finds it no longer ours and does nothing.
	poked, err := m.tableRelease(l.ref)
	switch {
	case err == nil:
		if m.handOver { // one plain load on every Release; the rest is a call
			m.afterRelease(poked > 0) // hand the P to a sibling we granted (turns.go)
		}
		if l.token%yieldCheckOps == 0 && m.spin > 0 {
			// Give up the CPU between an unlock and the next lock, never
			// while holding or queued, so that the kernel rarely needs to
			// preempt this process at a worse moment (see Manager.wait).
			// Once per yieldCheckOps grants of a name (by its fencing
			// token) keeps the clock off the fast path.
			if m.shouldYield() {
				m.yieldIfDue()
			}
		}
		return nil
	case m.closed.Load():
		l.state.Store(word&^stateMask | lockClosed)
		return fmt.Errorf("release %q: %w", l.name, ErrClosed)
	case errors.Is(err, table.ErrStolen), errors.Is(err, table.ErrNotHeld):
		l.state.Store(word&^stateMask | lockStolen)
		m.noteLost(l)
		return fmt.Errorf("release %q: %w", l.name, ErrStolen)
	default:
		// The table could not be updated (a bucket latch held too long by a
		// live process, or corruption): the lock is still ours; keep it
		// releasable so that the caller can retry.
		l.state.Store(word)
		m.held.restore(l.ref.Slot, reg)
		m.noteErr("release", err)
		return fmt.Errorf("release %q: %w", l.name, err)
	}
}

// tableRelease gives up ref in the table and delivers the wakes (poked:
// how many sleeping requests of ours it poked), with a
// fault on the mapping (the file truncated under us) returned as
// ErrCorrupt: the Lock then stays held and releasable, as for any table
// error.
func (m *Manager) tableRelease(ref table.Ref) (poked int, err error) {
	defer table.EndGuard(table.BeginGuard(), &err, m.faultFn)
	var w table.Wakes
	err = m.t.Release(m.a, ref, &w)
	if !w.Empty() {
		poked = m.deliver(&w)
	}
	return poked, err
}

func (l *Lock) notHeldErr() error {
	switch l.st() {
	case lockStolen:
		return fmt.Errorf("release %q: %w", l.name, ErrStolen)
	case lockClosed:
		return fmt.Errorf("release %q: %w", l.name, ErrClosed)
	}
	return fmt.Errorf("release %q: %w", l.name, ErrReleased)
}

// lockCtx is the context passed to Request's callback: its parent's values
// and deadline, cancelled when the parent is or when the lock is lost. It
// allocates nothing unless Done is called. It lives in its Lock's lockExt,
// whose mu guards it.
type lockCtx struct {
	l      *Lock
	parent context.Context
	done   chan struct{}
	stop   func() bool
	fire   func()
	armed  atomic.Bool // Done was called: finish has something to undo
	inc    uint64      // l's incarnation during fn (the grant this ctx carries, reentrant.go)
}

func (c *lockCtx) Deadline() (time.Time, bool) { return c.parent.Deadline() }

// Value answers the reentrancy key (reentrant.go) and the deadlock
// detector's key (multi.go) with c itself: it carries its lock. Any other
// key goes to its parent.
func (c *lockCtx) Value(key any) any {
	switch key.(type) {
	case heldKey, carriedKey:
		return c
	}
	return c.parent.Value(key)
}

func (c *lockCtx) Err() error {
	if st := c.l.st(); st == lockStolen || st == lockClosed {
		return context.Canceled
	}
	if e := c.l.ext.Load(); e != nil && e.bk != nil && e.bk.lostNow() {
		return context.Canceled
	}
	return c.parent.Err()
}

func (c *lockCtx) Done() <-chan struct{} {
	l := c.l
	e := l.ext.Load()
	e.mu.Lock()
	done := c.doneLocked(e)
	e.mu.Unlock()
	if done != closedChan {
		l.watch() // without e.mu: watch may close the lost channel itself
	}
	return done
}

func (c *lockCtx) doneLocked(e *lockExt) chan struct{} {
	if c.done != nil {
		return c.done
	}
	lost := c.l.lostLocked(e)
	if lost == closedChan {
		return closedChan
	}
	if c.parent.Done() == nil {
		c.done = lost
		return c.done
	}
	c.done = make(chan struct{})
	done := c.done
	var once sync.Once
	fire := func() { once.Do(func() { close(done) }) }
	c.fire = fire
	c.stop = context.AfterFunc(c.parent, fire)
	c.armed.Store(true)
	go func() {
		select {
		case <-lost:
			fire()
		case <-done:
		}
	}()
	return c.done
}

// finish detaches the context from its parent when Request returns.
func (c *lockCtx) finish() {
	if !c.armed.Load() {
		return // Done was never called with a cancellable parent: nothing to undo
	}
	e := c.l.ext.Load()
	e.mu.Lock()
	stop, fire := c.stop, c.fire
	e.mu.Unlock()
	if stop != nil {
		stop()
		fire() // so the helper goroutine exits
	}
}
