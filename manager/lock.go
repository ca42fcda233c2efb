package manager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/shmlocks/shmlocks/table"
)

// Lock states, in the low bits of Lock.state. A Lock serves one grant and
// is never reused (a handle, or a ctx that carries it, may be kept by user
// code for as long as it likes: it must never come to mean a later grant),
// so the bits above stateBits only ever hold 1. The bell loop changes a
// Lock only by a CAS on the (held) word it validated.
const (
	lockHeld     = 1 + iota // granted, not yet released
	lockReleased            // released by its holder
	lockClosed              // released by Close
	lockStolen              // stolen or reaped while held

	stateMask      = 0x0f
	flagRegistered = 0x10  // in m.held, so that the bell loop closes lost when it is taken away
	flagKids       = 0x20  // some request was made a child of this grant (reentrant.go): its end ends them
	flagChild      = 0x40  // a child grant of a reentrant request (reentrant.go): nothing in the table
	flagBackend    = 0x80  // a grant of a Backend (in ext.bk), not of the table: never registered
	flagCtx        = 0x100 // the ctx of Request's fn has a Done channel (ext.ctxDone): its end closes it
	stateBits      = 12
	heldWord       = 1<<stateBits | lockHeld // the state word of a new grant
)

// Lock is a granted request. A Lock obtained in Request's callback must not
// be used after the callback returns: its Release then reports ErrReleased
// (or the loss) and touches nothing else.
//
// Every grant gets a Lock of its own (a stale handle must never alias a
// later grant): Acquire's on its caller's stack when it can (see Acquire),
// else on the heap, so the Lock is kept to one 64-byte size class; what only
// Lost, Request's context and child grants use lives in ext, allocated on
// first use.
type Lock struct {
	m     *Manager
	name  string
	token uint64
	state atomic.Uint64 // 1<<stateBits | flags | lock state
	ref   table.Ref     // the table grant (of a child: its outermost grant's)
	mode  uint8
	ext   atomic.Pointer[lockExt]
}

// lockExt is the part of a Lock that Lost, Request's context and child
// grants need. A child grant's lockExt is its identity on the heap (the
// child's Lock may live on its caller's stack): its parent's bookkeeping
// points to it, never to the Lock.
type lockExt struct {
	mu   sync.Mutex
	lost chan struct{} // created lazily by Lost or fn's ctx (mu)
	fn   *fnCtx        // the ctx of Request's fn, once its Done was asked for: cancelled at a loss (mu)
	bk   *backendGrant // the grant, on a Manager made by NewBackendManager

	// Child grants (reentrant.go). Of a child: the grant it is a child of
	// and its mode (both written before the child is published), and,
	// once that grant ended while the child was held, why (gone: the
	// parent's end, lockReleased, lockStolen or lockClosed). Of a grant
	// that has children: their bookkeeping (mu).
	parent *Lock
	mode   Mode
	gone   atomic.Uint64
	kids   *kinship

	// The state of the ctx of Request's fn (fnctx.go), made when its Done
	// is asked for or it first reports an error (mu).
	ctxDone     chan struct{}
	ctxErr      error // set once: then ctxDone, if made, is closed
	ctxStop     func() bool
	ctxByParent bool // ctxErr is the parent's
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

func (l *Lock) st() uint64 { return l.state.Load() & stateMask }

// heldNow reports whether l's grant is held: granted, not released, not
// taken away, and, for a child grant, its parent has not ended.
func (l *Lock) heldNow() bool {
	w := l.state.Load()
	if w&stateMask != lockHeld {
		return false
	}
	if w&flagChild != 0 {
		return l.ext.Load().gone.Load() == 0
	}
	return true
}

// lostNow reports whether l's grant was taken away: stolen, reaped,
// released by Close, lost by its backend, or, for a child grant, ended with
// its parent.
func (l *Lock) lostNow() bool {
	w := l.state.Load()
	if st := w & stateMask; st == lockStolen || st == lockClosed {
		return true
	}
	switch {
	case w&flagChild != 0:
		return l.ext.Load().gone.Load() != 0
	case w&flagBackend != 0:
		return l.ext.Load().bk.lostNow()
	}
	return false
}

// Name returns the lock's name ("" for a nil or zero Lock).
func (l *Lock) Name() string {
	if l == nil {
		return ""
	}
	return l.name
}

// Mode returns the lock's mode.
func (l *Lock) Mode() Mode {
	if l == nil {
		return Exclusive
	}
	return Mode(l.mode)
}

// Token returns the fencing token of this grant: strictly increasing per
// name, across agents, deaths, steals and reuse of table entries, for the
// life of the file. A child grant has its outermost grant's token.
func (l *Lock) Token() uint64 {
	if l == nil {
		return 0
	}
	return l.token
}

// Lost returns a channel that is closed when the lock is stolen or
// otherwise taken away (reaped, released by Close; for a child grant, also
// when the grant it is a child of ends). A nil or zero Lock, which holds
// nothing, returns a closed channel.
func (l *Lock) Lost() <-chan struct{} {
	if l == nil || l.m == nil {
		return closedChan
	}
	if l.state.Load()&flagChild != 0 {
		// A child's loss is decided by its parent's end (reentrant.go);
		// the outermost grant is watched since the first child came.
		e := l.ext.Load()
		e.mu.Lock()
		c := e.lostChan(e.gone.Load() != 0)
		e.mu.Unlock()
		return c
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
	st := l.st()
	return e.lostChan(st == lockStolen || st == lockClosed)
}

// lostChan returns e's lost channel, creating it (e.mu held): closedChan
// if lost already and none was made.
func (e *lockExt) lostChan(lost bool) chan struct{} {
	if e.lost == nil {
		if lost {
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
	for {
		if word&stateMask != lockHeld || word&(flagRegistered|flagBackend|flagChild) != 0 {
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
		if l.state.CompareAndSwap(word, word|flagRegistered) {
			break
		}
		m.leave()
		word = l.state.Load() // a flag set meanwhile (flagKids), or released
	}
	m := l.m
	defer m.leave()
	// A fault on the mapping (the file truncated under us) leaves l
	// registered: the bell loop's scans, guarded too, keep looking.
	var fault error
	defer table.EndGuard(table.BeginGuard(), &fault, m.wk.faultFn)
	e := m.held.store(l.ref.Slot, l.ref.Serial, l)
	if l.st() != lockHeld {
		// Released (or lost) between the CAS and the Store, too early for
		// Release to unregister it: do it here.
		m.held.dropEntry(l.ref.Slot, e)
		return
	}
	m.loseIfGone(l.ref.Slot, e)
}

// markLost moves l, whose state word was word, from held to to (lockStolen
// or lockClosed), closes its lost channel, cancels its fn's ctx and ends
// its children. It does nothing if l is no longer held.
func (l *Lock) markLost(word, to uint64) bool {
	for {
		if word&stateMask != lockHeld {
			return false
		}
		if l.state.CompareAndSwap(word, word&^stateMask|to) {
			break
		}
		word = l.state.Load() // a flag set meanwhile
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
	fn := e.fn
	e.mu.Unlock()
	if fn != nil {
		fn.cancel(context.Canceled, false)
	}
	if word&flagKids != 0 {
		e.endKids(to)
	}
	return true
}

// Release releases the lock. A second Release, or one after the lock was
// stolen or released by Close, returns an error (ErrReleased, ErrStolen or
// ErrClosed) and never touches another holder's grant. Releasing a grant
// that has child grants (see WithLock) first ends each of them as a loss.
// Releasing the Lock of Request's fn ends fn's ctx.
func (l *Lock) Release() error {
	if l == nil || l.m == nil {
		return fmt.Errorf("%w: nil lock", ErrReleased)
	}
	word := l.state.Load()
	for {
		if word&stateMask != lockHeld {
			return l.notHeldErr()
		}
		if l.state.CompareAndSwap(word, word&^stateMask|lockReleased) {
			break
		}
		word = l.state.Load() // a flag set meanwhile (Lost, a first child)
	}
	if word&(flagChild|flagKids|flagCtx) != 0 {
		return l.releaseKin(word)
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
	if m.life.closed.Load() {
		return fmt.Errorf("release %q: %w", l.name, ErrClosed) // Close released it
	}
	// No in-flight count here (the uncontended path saves two atomic adds):
	// a Close racing with this Release leaves the mapping valid (see Close)
	// and frees our slot, so the table finds it no longer ours and does nothing.
	poked, err := m.tableRelease(l.ref, m.cfg.bounded && m.turnDue(l.token))
	switch {
	case err == nil:
		if m.cfg.handOver { // one plain load on every Release; the rest is a call
			m.afterRelease(poked > 0) // hand the P to a sibling we granted (turns.go)
		}
		if l.token%yieldCheckOps == 0 && m.cfg.spin > 0 {
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
	case m.life.closed.Load():
		l.state.Store(word&^stateMask | lockClosed)
		return fmt.Errorf("release %q: %w", l.name, ErrClosed)
	case errors.Is(err, table.ErrStolen), errors.Is(err, table.ErrNotHeld):
		l.state.Store(word&^stateMask | lockStolen)
		m.noteLost(l)
		return fmt.Errorf("release %q: %w", l.name, ErrStolen)
	default:
		// The table could not be updated (a bucket latch held too long by a
		// live process, or corruption): the lock is still ours; keep it
		// releasable so that the caller can retry. Its children were ended
		// (the holder meant to release it); new ones may come again.
		if word&flagKids != 0 {
			(*lockExt)(*(*unsafe.Pointer)(unsafe.Pointer(&l.ext))).reopenKids()
		}
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
func (m *Manager) tableRelease(ref table.Ref, turn bool) (poked int, err error) {
	defer table.EndGuard(table.BeginGuard(), &err, m.wk.faultFn)
	var w table.Wakes
	if turn {
		err = m.life.t.ReleaseTurn(m.life.a, ref, &w) // turns.go
	} else {
		err = m.life.t.Release(m.life.a, ref, &w)
	}
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
