package manager

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shmlocks/shmlocks/table"
)

// Coalesce: one run of fn for all the callers of a name that overlap in
// time, in every process of the table (docs/coalesce.md).
//
// Inside a Manager, the callers of a name share one flight: a pilot
// goroutine runs the cross-process protocol for them, and runs the fn of
// one of them while it leads. Across processes, a flight is an exclusive
// hold of the name's flight lock (an internal lock name, flightName):
//
//	pilot ─▶ flight lock (IfAvailable, else queue) ─▶ granted:
//	           outcome published since a caller arrived? ─▶ it gets it
//	           callers left (nothing new for them: the leader died or
//	           gave up, or they came after its outcome) ─▶ lead:
//	             run a caller's fn ─▶ write temp ─▶ rename ─▶ release
//
// Only the holder of the flight lock writes the name's outcome file, and it
// writes the flight lock's fencing token into it. A follower accepts only an
// outcome published after it arrived, so never the outcome of a flight that
// ended before it came; a leader that died or whose caller's ctx ended
// published nothing, and the follower that gets the lock next leads.

// CoalesceCrashPoints are the crash points of a flight's leader, in order
// (tests kill a leader at each; see TestCoalesceCrashPoints).
var CoalesceCrashPoints = []string{
	"coalesce.ran",     // fn returned, nothing written
	"coalesce.written", // outcome in a temporary file, not renamed
	"coalesce.renamed", // outcome published, flight lock not yet released
}

// coalesceCrashHook is called at every coalesce crash point (tests only).
var coalesceCrashHook atomic.Pointer[func(point string)]

func coalesceCrash(point string) {
	if f := coalesceCrashHook.Load(); f != nil {
		(*f)(point)
	}
}

// coalescer is a Manager's flights in progress, by name.
type coalescer struct {
	mu      sync.Mutex
	flights map[string]*flight
}

// flight is one Manager's part in a flight on a name.
type flight struct {
	name   string
	ctx    context.Context // the pilot's: cancelled when no caller is left
	cancel context.CancelFunc

	// m.co.mu:
	waiting []*member // callers without an outcome, in arrival order (the next to run fn first)
	live    int       // callers not yet returned
}

// member is one caller of Coalesce in a flight.
type member struct {
	m    *Manager
	name string
	ctx  context.Context
	fn   func(ctx context.Context) ([]byte, error)
	gen0 gen // the outcome published when it arrived: never its outcome

	done   chan struct{} // closed when the fields below are set
	res    []byte
	err    error
	shared bool
	panic  any // its fn's panic, re-raised in its goroutine
}

type internalKey struct{}

// internalCtx reports whether ctx may request internal lock names (they
// start with '-', which user names may not).
func internalCtx(ctx context.Context) bool { return ctx.Value(internalKey{}) != nil }

// flightName is the internal lock name of name's flights: "-c:"+name, or,
// when that is longer than MaxNameLen, "-c#" and a hash of name (two names
// with one hash share a lock, never an outcome: the outcome names its name).
func (m *Manager) flightName(name string) (string, error) {
	max := m.t.Geometry().MaxNameLen
	if n := "-c:" + name; len(n) <= max {
		return n, nil
	}
	if max < 3+16 {
		return "", fmt.Errorf("%w: coalesce %q: MaxNameLen %d leaves no room for a flight lock name", ErrNotSupported, name, max)
	}
	h := sha256.Sum256([]byte(name))
	x := hex.EncodeToString(h[:])
	return "-c#" + x[:min(len(x), max-3)], nil
}

// Coalesce runs fn once for all callers of name that overlap in time, in any
// process of the table: one caller (the leader) runs fn, the others wait and
// get its result or error (shared == true). A flight ends when its outcome
// is published; a caller gets the outcome of a flight that ended after it
// arrived, never an older one: one arriving after a flight ended starts a
// new one. Nothing is cached (see CoalesceWithin for reusing a recent
// result).
//
// If the leader's process dies, or its ctx ends and fn fails, a waiting
// caller leads instead (in the same process, with its own fn and ctx; a
// successful result is kept even if its caller's ctx ended). A caller whose
// ctx ends returns ErrAborted at once and leaves the flight intact.
//
// Followers in the same process get the leader's error value; followers in
// other processes an error matching ErrLeaderFailed with its text. A result
// longer than MaxResultSize is ErrResultTooLarge for the leader and its
// followers. A follower's result is its own copy. Names follow the rules of
// Request (ErrNotSupported); the flight's lock shows in Query as "-c:" and
// the name (see docs/coalesce.md).
func (m *Manager) Coalesce(ctx context.Context, name string,
	fn func(ctx context.Context) ([]byte, error)) (result []byte, shared bool, err error) {
	return m.CoalesceWithin(ctx, name, 0, fn)
}

// CoalesceWithin is Coalesce that first accepts a successful result
// published for name at most maxAge ago (by any process), returning it with
// shared == true without waiting; maxAge 0 is Coalesce.
func (m *Manager) CoalesceWithin(ctx context.Context, name string, maxAge time.Duration,
	fn func(ctx context.Context) ([]byte, error)) (result []byte, shared bool, err error) {
	if err := m.tableOnly("Coalesce"); err != nil {
		return nil, false, err
	}
	if err := m.validate(ctx, name, RequestOptions{}); err != nil {
		return nil, false, err
	}
	if fn == nil {
		return nil, false, fmt.Errorf("%w: coalesce %q: nil fn", ErrNotSupported, name)
	}
	if maxAge < 0 {
		return nil, false, fmt.Errorf("%w: coalesce %q: negative maxAge %v", ErrNotSupported, name, maxAge)
	}
	if _, err := m.flightName(name); err != nil {
		return nil, false, err
	}
	if inFlight(ctx, m, name) {
		// Called from fn of a flight on name: it would wait for itself.
		return nil, false, fmt.Errorf("%w: coalesce %q called from its own flight's fn", ErrWouldDeadlock, name)
	}
	mb := &member{m: m, name: name, ctx: ctx, fn: fn, done: make(chan struct{})}
	if o, err := m.store().read(name); err == nil && o != nil {
		if maxAge > 0 && o.fresh(maxAge, time.Now()) {
			return o.data, true, nil
		}
		mb.gen0 = o.gen()
	}
	f := m.join(name, mb)
	select {
	case <-mb.done:
		return mb.outcome()
	case <-ctx.Done():
	}
	if m.leaveFlight(f, mb) {
		return nil, false, fmt.Errorf("%w: coalesce %q: %w", ErrAborted, name, ctx.Err())
	}
	<-mb.done // delivered while we left: the outcome wins
	return mb.outcome()
}

// store is the outcome store of m's table.
func (m *Manager) store() resultStore {
	return newResultStore(m.path, m.t.Geometry().MaxNameLen)
}

// join adds mb to name's flight in m, starting one if none is in progress.
func (m *Manager) join(name string, mb *member) *flight {
	m.co.mu.Lock()
	defer m.co.mu.Unlock()
	if m.co.flights == nil {
		m.co.flights = map[string]*flight{}
	}
	f := m.co.flights[name]
	if f == nil {
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), internalKey{}, true))
		f = &flight{name: name, ctx: ctx, cancel: cancel}
		m.co.flights[name] = f
		go m.pilot(f)
	}
	f.waiting = append(f.waiting, mb)
	f.live++
	return f
}

// leaveFlight removes mb, whose ctx ended, from f, unless it has its outcome
// already or is running its fn (false: the caller waits for the outcome,
// which comes once fn returns). The last caller to leave ends f's part in
// the protocol: the pilot gives up its place in the queue.
func (m *Manager) leaveFlight(f *flight, mb *member) bool {
	m.co.mu.Lock()
	defer m.co.mu.Unlock()
	i := slices.Index(f.waiting, mb)
	if i < 0 {
		return false // delivered, or running its fn
	}
	f.waiting = slices.Delete(f.waiting, i, i+1)
	f.live--
	if f.live == 0 {
		m.retire(f)
		f.cancel()
	}
	return true
}

// retire makes f no longer the flight a caller of its name joins (m.co.mu held).
func (m *Manager) retire(f *flight) {
	if m.co.flights[f.name] == f {
		delete(m.co.flights, f.name)
	}
}

// outcome is what Coalesce returns to mb.
func (mb *member) outcome() ([]byte, bool, error) {
	if mb.panic != nil {
		panic(mb.panic)
	}
	return mb.res, mb.shared, mb.err
}

// deliver gives mb its outcome (m.co.mu held; mb no longer in f.waiting).
func (f *flight) deliver(mb *member, res []byte, err error, shared bool) {
	if shared && res != nil {
		res = slices.Clone(res)
	}
	mb.res, mb.err, mb.shared = res, err, shared
	f.live--
	close(mb.done)
}

// finish delivers an outcome to every waiting caller of f and retires f.
func (m *Manager) finish(f *flight, res []byte, err error) {
	m.co.mu.Lock()
	m.retire(f)
	for _, mb := range f.waiting {
		f.deliver(mb, res, err, true)
	}
	f.waiting = nil
	m.co.mu.Unlock()
	f.cancel()
}

// share delivers outcome o, published by another process, to the waiting
// callers of f that arrived before it was published, and reports whether
// any caller is left (one that arrived later: o is too old for it). With
// none left, f is retired.
func (m *Manager) share(f *flight, o *outcome) bool {
	res, err := o.result(f.name)
	m.co.mu.Lock()
	defer m.co.mu.Unlock()
	rest := f.waiting[:0]
	for _, mb := range f.waiting {
		if mb.gen0 == o.gen() {
			rest = append(rest, mb) // arrived after o was published
			continue
		}
		f.deliver(mb, res, err, true)
	}
	clear(f.waiting[len(rest):])
	f.waiting = rest
	if len(rest) == 0 {
		m.retire(f)
		return false
	}
	return true
}

// next takes the next caller of f to run fn: the longest waiting one whose
// ctx has not ended. With none left, f is retired (a caller arriving now
// starts a new flight) and next returns nil.
func (m *Manager) next(f *flight) *member {
	m.co.mu.Lock()
	defer m.co.mu.Unlock()
	for i, mb := range f.waiting {
		if mb.ctx.Err() == nil { // one whose ctx ended is about to leave
			f.waiting = slices.Delete(f.waiting, i, i+1)
			return mb
		}
	}
	m.retire(f)
	return nil
}

// pilot runs f's part in the cross-process protocol (see the file comment).
func (m *Manager) pilot(f *flight) {
	defer f.cancel()
	name := f.name
	lname, _ := m.flightName(name) // checked by CoalesceWithin
	st := m.store()
	l, err := m.Acquire(f.ctx, lname, RequestOptions{IfAvailable: true})
	if errors.Is(err, ErrNotAvailable) {
		l, err = m.Acquire(f.ctx, lname, RequestOptions{})
	}
	if err != nil {
		m.finish(f, nil, fmt.Errorf("coalesce %q: %w", name, err))
		return
	}
	// Has a flight published since our callers arrived (the one we
	// queued behind, or one that ended between their arrival and our
	// grant)? A corrupt or missing outcome is none: we lead, and our
	// outcome replaces it.
	if o, rerr := st.read(name); rerr == nil && o != nil && !m.share(f, o) {
		l.Release()
		return
	}
	// Callers are left for whom nothing new was published (its leader
	// died or gave up, or they came after it): we lead.
	st.removeTemps(name)
	for {
		mb := m.next(f)
		if mb == nil {
			l.Release() // nobody left to run fn: publish nothing
			return
		}
		res, ferr, pv := runFn(mb)
		coalesceCrash("coalesce.ran")
		if pv == nil && ferr != nil && mb.ctx.Err() != nil {
			// Its caller gave up and fn failed: publish nothing, the
			// next caller leads (still holding the lock).
			m.co.mu.Lock()
			f.deliver(mb, nil, fmt.Errorf("%w: coalesce %q: %w (fn: %w)", ErrAborted, name, mb.ctx.Err(), ferr), false)
			m.co.mu.Unlock()
			continue
		}
		if pv != nil {
			ferr = fmt.Errorf("coalesce %q: fn panicked: %v", name, pv)
		}
		if ferr == nil && len(res) > MaxResultSize {
			ferr = fmt.Errorf("%w: coalesce %q: %d bytes, MaxResultSize %d", ErrResultTooLarge, name, len(res), MaxResultSize)
			res = nil
		}
		// Callers arriving from now on start a new flight: the outcome
		// is published before it is delivered, so it would be too old for
		// them.
		m.co.mu.Lock()
		m.retire(f)
		m.co.mu.Unlock()
		// A failed publish (the directory not writable, the Manager
		// closing) costs sharing, not correctness: our callers get the
		// outcome, and a follower elsewhere finds nothing new and leads.
		_ = m.publish(l, name, res, ferr)
		l.Release()
		m.co.mu.Lock()
		mb.panic = pv
		f.deliver(mb, res, ferr, false)
		m.co.mu.Unlock()
		m.finish(f, res, ferr)
		return
	}
}

// flightCtx is the ctx of a flight's fn: its caller's ctx, marked as inside
// a flight on name, so that a Coalesce on name from fn fails at once
// (ErrWouldDeadlock) instead of waiting for its own flight.
type flightCtx struct {
	context.Context
	m    *Manager
	name string
}

type flightKey struct{}

func (c *flightCtx) Value(key any) any {
	if _, ok := key.(flightKey); ok {
		return c
	}
	return c.Context.Value(key)
}

// inFlight reports whether ctx is (derived from) the ctx of fn of m's flight on name.
func inFlight(ctx context.Context, m *Manager, name string) bool {
	for v := ctx.Value(flightKey{}); v != nil; {
		c, ok := v.(*flightCtx)
		if !ok {
			return false
		}
		if c.m == m && c.name == name {
			return true
		}
		v = c.Context.Value(flightKey{})
	}
	return false
}

// runFn runs mb's fn, turning a panic into a value.
func runFn(mb *member) (res []byte, err error, pv any) {
	defer func() {
		if r := recover(); r != nil {
			pv = r
		}
	}()
	res, err = mb.fn(&flightCtx{Context: mb.ctx, m: mb.m, name: mb.name})
	return res, err, nil
}

// publish writes the outcome of the flight whose lock is l. It writes only
// while l is held and its Manager cannot close (Close releases l only after
// the operations in flight are done), so no outcome is ever written by
// anyone but the flight lock's holder.
func (m *Manager) publish(l *Lock, name string, res []byte, ferr error) error {
	o := &outcome{kind: kindResult, token: l.Token(), name: name, data: res}
	if ferr != nil {
		o.kind, o.data = kindError, []byte(ferr.Error())
		if errors.Is(ferr, ErrResultTooLarge) {
			o.kind = kindTooLarge
		}
		if len(o.data) > MaxResultSize {
			o.data = o.data[:MaxResultSize]
		}
	}
	st := m.store()
	o.at = time.Now().UnixNano()
	tmp, err := st.writeTemp(o)
	if err != nil {
		return err
	}
	coalesceCrash("coalesce.written")
	if !m.enter() {
		return ErrClosed // the temporary file is removed by the next leader
	}
	defer m.leave()
	held := false
	if err := table.Guard(func() error { held = m.t.Holds(m.a, l.ref); return nil }); err != nil {
		return err
	}
	if l.st() != lockHeld || !held {
		return fmt.Errorf("coalesce %q: flight lock: %w", name, ErrStolen)
	}
	if err := os.Rename(tmp, st.path(name)); err != nil {
		return err
	}
	coalesceCrash("coalesce.renamed")
	return nil
}

// result is what a follower in another process gets from outcome o.
func (o *outcome) result(name string) ([]byte, error) {
	switch o.kind {
	case kindResult:
		return o.data, nil
	case kindTooLarge:
		return nil, fmt.Errorf("%w: coalesce %q (leader token %d): %s", ErrResultTooLarge, name, o.token, o.data)
	}
	return nil, fmt.Errorf("%w: coalesce %q (leader token %d): %s", ErrLeaderFailed, name, o.token, o.data)
}

// CheckCoalesce validates the outcome store of the table (every result file
// parses and is filed under its name); tests run it beside Check.
func (m *Manager) CheckCoalesce() error {
	if err := m.tableOnly("CheckCoalesce"); err != nil {
		return err
	}
	if m.closed.Load() {
		return ErrClosed
	}
	err := m.store().check()
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
