package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"
)

// Backend is a lock service other than the table file that a Manager can
// run on (the nested module github.com/shmlocks/shmlocks/etcd is one). It is
// for backend implementors: programs get a Manager from the backend's own
// Open, which calls NewBackendManager, and use only the Manager.
//
// The Manager keeps the parts of the contract that do not depend on where
// the locks live: it validates every request first (closed, then name and
// options against MaxNameLen, then ctx), makes the Lock handles, runs
// Request's callback with a context cancelled when the grant is lost, and
// turns a second Release into ErrReleased. The Backend does the rest:
//
//   - Acquire is called only with a valid request and a live ctx. It blocks
//     until the request is granted (Web Locks order: FIFO per name, a shared
//     request never overtakes a queued exclusive one, Steal first) or fails:
//     ErrNotAvailable for an IfAvailable request that was not grantable at
//     once (nothing left behind), ErrAborted joined with ctx.Err() when ctx
//     ended first (the request withdrawn, and a grant that raced with the
//     cancellation given back), ErrClosed after Close, or its own error. A
//     backend's errors should wrap the manager sentinels where one applies.
//   - Query reports every client's held and pending requests, pending per
//     name in queue order, with Held and Pending never nil.
//   - Close releases every grant of this client (their Lost channels close
//     and their Release returns an error wrapping ErrClosed), fails its
//     pending Acquires with ErrClosed, and frees the backend's resources.
//     The Manager calls it once.
type Backend interface {
	// ClientID is unique per Backend (per Manager) and stable for its life.
	ClientID() string
	// MaxNameLen is the longest name, in bytes, that Acquire accepts.
	MaxNameLen() int
	Acquire(ctx context.Context, name string, opts RequestOptions) (BackendGrant, error)
	Query(ctx context.Context) (Snapshot, error)
	Close() error
}

// BackendGrant is one granted request of a Backend.
type BackendGrant struct {
	// Token is the fencing token: strictly increasing per name.
	Token uint64
	// Lost is closed by the backend when the grant is taken away: stolen,
	// lost with the backend's session, or released by Close. Never nil; the
	// Manager only receives from it.
	Lost chan struct{}
	// Release gives the grant up. The Manager calls it at most once per
	// successful call (a failed call, whose error wraps neither ErrStolen
	// nor ErrClosed, leaves the grant held and may be retried). After the
	// grant was lost it returns an error wrapping ErrStolen (or ErrClosed)
	// and touches no other grant.
	Release func() error
	// Watch, when not nil, is called once, the first time the grant's loss
	// must be observed asynchronously (Lost, or the Done of Request's
	// context): a backend may start watching for the loss only then, so
	// that a grant nobody watches costs no watch. A loss found otherwise
	// (Release, the end of a session) still closes Lost.
	Watch func()
}

// NewBackendManager returns a Manager whose locks live in b instead of a
// table file: the same Request, Acquire, Query, Close and Lock behaviour,
// per the contract, with b's semantics for what the table does itself
// (liveness, tokens, queues). It is for backend implementors (see Backend);
// Open remains the default. Path of such a Manager returns "", and Check
// returns nil.
func NewBackendManager(b Backend) *Manager {
	return &Manager{life: lifecycle{
		be:       b,
		clientID: b.ClientID(),
		maxName:  b.MaxNameLen(),
		closing:  make(chan struct{}),
	}}
}

// backendGrant is a BackendGrant held by a Lock (in its lockExt).
type backendGrant struct {
	BackendGrant
	watchOnce sync.Once
}

// watch calls the backend's Watch once.
func (g *backendGrant) watch() {
	if g.Watch != nil {
		g.watchOnce.Do(g.Watch)
	}
}

// lostNow reports whether the grant has been taken away.
func (g *backendGrant) lostNow() bool {
	select {
	case <-g.Lost:
		return true
	default:
		return false
	}
}

// acquireBackend is acquireNew on a backend: *lp becomes the handle of the
// grant, or nil. Like acquireNew it does not retain the Lock (its grant
// lives in the lockExt, which the Lock points to, not the other way).
func (m *Manager) acquireBackend(ctx context.Context, name string, opts RequestOptions, lp **Lock) error {
	if err := m.validate(ctx, name, opts); err != nil {
		*lp = nil
		return err
	}
	for !opts.Steal { // the name may be held through ctx (reentrant.go), as on the table
		err := m.reenter(ctx, name, opts.Mode)
		if err == nil {
			break
		}
		if r, ok := err.(*reentry); ok {
			var kid *lockExt
			kid, err = m.enterChild(ctx, r.parent, name, opts)
			if err == errParentGone {
				continue // ctx's grant ended first: it carries nothing now
			}
			if err == nil {
				kid.fill(*lp)
				return nil
			}
		}
		*lp = nil
		return err
	}
	g, err := m.life.be.Acquire(ctx, name, opts)
	if err != nil {
		*lp = nil
		return err
	}
	l := *lp
	l.m, l.name, l.token, l.mode = m, name, g.Token, uint8(opts.Mode)
	// lost is the backend's channel: Lost and the Request context use it
	// as they use a table lock's, and markLost never runs on it (a backend
	// Lock is never registered with the bell loop). Nobody else can reach
	// l yet, so both words are written plainly: an atomic store would make
	// the compiler move every Acquire's Lock to the heap.
	*(**lockExt)(unsafe.Pointer(&l.ext)) = &lockExt{bk: &backendGrant{BackendGrant: g}, lost: g.Lost}
	*(*uint64)(unsafe.Pointer(&l.state)) = 1<<stateBits | flagBackend | lockHeld
	return nil
}

// requestBackend is Request on a backend.
func (m *Manager) requestBackend(ctx context.Context, name string, opts RequestOptions,
	fn func(ctx context.Context, l *Lock) error) error {
	g := new(grant)
	l := &g.Lock
	if err := m.acquireBackend(ctx, name, opts, &l); err != nil {
		if errors.Is(err, ErrNotAvailable) {
			return fn(ctx, nil)
		}
		return err
	}
	return g.run(ctx, fn)
}

// releaseBackend gives up the backend grant of l, whose state word was word
// (held) and is now l's alone to set.
func (l *Lock) releaseBackend(word uint64) error {
	m := l.m
	if m.life.closed.Load() {
		return fmt.Errorf("release %q: %w", l.name, ErrClosed) // Close released it
	}
	// ext was set before the Lock was handed out and never changes: a
	// plain load (an atomic one would move every Acquire's Lock to the heap).
	g := (*(**lockExt)(unsafe.Pointer(&l.ext))).bk
	err := g.Release()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrClosed) || m.life.closed.Load():
		l.state.Store(word&^stateMask | lockClosed)
		return fmt.Errorf("release %q: %w", l.name, err)
	case errors.Is(err, ErrStolen):
		l.state.Store(word&^stateMask | lockStolen)
		return fmt.Errorf("release %q: %w", l.name, err)
	default:
		// The backend could not be reached: the grant is still ours (or
		// will be lost with the session); keep it releasable.
		l.state.Store(word)
		return fmt.Errorf("release %q: %w", l.name, err)
	}
}

// closeBackend is Close on a backend Manager (closed already set).
func (m *Manager) closeBackend() error {
	close(m.life.closing)
	return m.life.be.Close()
}

// queryBackend is Query on a backend Manager (closed and ctx checked).
func (m *Manager) queryBackend(ctx context.Context) (Snapshot, error) {
	snap, err := m.life.be.Query(ctx)
	if snap.Held == nil {
		snap.Held = []LockInfo{}
	}
	if snap.Pending == nil {
		snap.Pending = []LockInfo{}
	}
	if err != nil {
		return snap, fmt.Errorf("query: %w", err)
	}
	return snap, nil
}

// tableOnly is nil on the table backend (errNeverOpened on a zero Manager) and, on a Manager made by
// NewBackendManager, ErrClosed once closed, else ErrNotSupported naming op:
// the capabilities that live in the table file (the table's statistics,
// and the record stores of the packages built on the Manager unless the
// backend is a seam.StoreProvider) have no backend form yet. Acquire,
// Request, AcquireAll, RequestAll, Query, Locker, Close and child grants
// work on every backend; State, WaitUnlocked, Watch and WaitGraph on a
// backend that implements BackendObserver and BackendWaitGrapher.
func (m *Manager) tableOnly(op string) error {
	if m.life.be == nil {
		if m.life.t == nil {
			return errNeverOpened
		}
		return nil
	}
	if m.life.closed.Load() {
		return ErrClosed
	}
	return fmt.Errorf("%w: %s needs the table backend", ErrNotSupported, op)
}

// BackendObserver is implemented by a Backend that can observe a name
// without requesting it: State, WaitUnlocked and Watch of a Manager made by
// NewBackendManager call it after the Manager's validation (closed, then
// name and mode, then ctx), with the contract of the Manager's methods
// (Held and Pending never nil; WaitUnlocked woken by changes, not by
// polling; Watch's channel holding the latest state, closed when ctx ends,
// the Manager closes or the watch is lost). Without it those methods
// return ErrNotSupported.
type BackendObserver interface {
	State(ctx context.Context, name string) (NameState, error)
	WaitUnlocked(ctx context.Context, name string, mode Mode) error
	Watch(ctx context.Context, name string) (<-chan NameState, error)
}

// BackendWaitGrapher is implemented by a Backend that can read its
// wait-for graph (WaitGraph of its Manager; without it ErrNotSupported).
type BackendWaitGrapher interface {
	WaitGraph(ctx context.Context) (WaitGraph, error)
}

// BackendHold is a grant of a Backend held by the task that makes a request.
type BackendHold struct {
	Name  string
	Token uint64
}

// CarriedHolds returns the grants of b, still held, that ctx says its task
// holds while it makes a request with it: the lock of Request's or
// RequestAll's callback ctx, the names an AcquireAll has already been
// granted, the locks added with WithLock. A Backend that detects deadlocks
// records them with the request: the task will not release them while the
// request waits, so a cycle of waits may go through them
// (docs/multi-and-deadlock.md).
func CarriedHolds(ctx context.Context, b Backend) []BackendHold {
	var out []BackendHold
	eachCarried(ctx, 64, func(l *Lock) bool {
		if l.m == nil || l.m.life.be != b || !l.heldNow() {
			return true
		}
		if h := (BackendHold{Name: l.name, Token: l.token}); !slices.Contains(out, h) {
			out = append(out, h)
		}
		return true
	})
	return out
}

// observer returns the BackendObserver of a backend Manager, or why not.
func (m *Manager) observer(op string) (BackendObserver, error) {
	if m.life.closed.Load() {
		return nil, ErrClosed
	}
	o, ok := m.life.be.(BackendObserver)
	if !ok {
		return nil, fmt.Errorf("%w: %s: the backend cannot observe names", ErrNotSupported, op)
	}
	return o, nil
}

// stateBackend is State on a backend Manager.
func (m *Manager) stateBackend(ctx context.Context, name string) (NameState, error) {
	st := NameState{Name: name, Held: []RequestState{}, Pending: []RequestState{}}
	o, err := m.observer("State")
	if err != nil {
		return st, err
	}
	if err := m.validate(ctx, name, RequestOptions{}); err != nil {
		return st, err
	}
	got, err := o.State(ctx, name)
	if err != nil {
		return st, err
	}
	if got.Held == nil {
		got.Held = []RequestState{}
	}
	if got.Pending == nil {
		got.Pending = []RequestState{}
	}
	return got, nil
}

// waitUnlockedBackend is WaitUnlocked on a backend Manager.
func (m *Manager) waitUnlockedBackend(ctx context.Context, name string, mode Mode) error {
	o, err := m.observer("WaitUnlocked")
	if err != nil {
		return err
	}
	if err := m.validate(ctx, name, RequestOptions{Mode: mode}); err != nil {
		return err
	}
	return o.WaitUnlocked(ctx, name, mode)
}

// watchBackend is Watch on a backend Manager.
func (m *Manager) watchBackend(ctx context.Context, name string) (<-chan NameState, error) {
	o, err := m.observer("Watch")
	if err != nil {
		return nil, err
	}
	if err := m.validate(ctx, name, RequestOptions{}); err != nil {
		return nil, err
	}
	return o.Watch(ctx, name)
}

// waitGraphBackend is WaitGraph on a backend Manager.
func (m *Manager) waitGraphBackend(ctx context.Context) (WaitGraph, error) {
	wg := WaitGraph{Waits: []WaitInfo{}, Cycles: [][]WaitNode{}}
	if m.life.closed.Load() {
		return wg, ErrClosed
	}
	g, ok := m.life.be.(BackendWaitGrapher)
	if !ok {
		return wg, fmt.Errorf("%w: WaitGraph: the backend has no wait-for graph", ErrNotSupported)
	}
	if err := ctx.Err(); err != nil {
		return wg, fmt.Errorf("%w: wait graph: %w", ErrAborted, err)
	}
	got, err := g.WaitGraph(ctx)
	if err != nil {
		return wg, fmt.Errorf("wait graph: %w", err)
	}
	if got.Waits == nil {
		got.Waits = []WaitInfo{}
	}
	if got.Cycles == nil {
		got.Cycles = [][]WaitNode{}
	}
	return got, nil
}
