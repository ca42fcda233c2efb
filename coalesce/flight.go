package coalesce

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/shmlocks/shmlocks/internal/seam"
	"github.com/shmlocks/shmlocks/manager"
)

// Inside a Manager, the callers of a key share one flight: a pilot
// goroutine runs the cross-process protocol for them, and runs the fn of
// one of them while it leads. Across processes, a flight is an exclusive
// hold of the key's flight lock (a reserved lock name, flightName):
//
//	pilot ─▶ flight lock (IfAvailable, else queue) ─▶ granted:
//	           outcome published since a caller arrived? ─▶ it gets it
//	           callers left (nothing new for them: the leader died or
//	           gave up, or they came after its outcome) ─▶ lead:
//	             run a caller's fn ─▶ publish (store, fenced by the lock) ─▶ release
//
// Only the holder of the flight lock publishes the key's outcome, with the
// flight lock's fencing token in it. A follower accepts only an outcome
// published after it arrived, so never the outcome of a flight that ended
// before it came; a leader that died or whose caller's ctx ended published
// nothing, and the follower that gets the lock next leads.

// crashPoints are the crash points of a flight's leader, in order (tests
// kill a leader at each; seam.Crash marks them, the second in the store).
var crashPoints = []string{
	"coalesce.ran",     // fn returned, nothing written
	"coalesce.written", // outcome written aside (the table's store: a temporary file), not published
	"coalesce.renamed", // outcome published, flight lock not yet released
}

// flightKey names the flight of one Manager on one key.
type flightKey struct {
	m   *manager.Manager
	key string
}

// mu guards flights and every flight's waiting and live, and delivers.
var (
	mu      sync.Mutex
	flights = map[flightKey]*flight{}
)

// flight is one Manager's part in a flight on a key.
type flight struct {
	fk     flightKey
	b      seam.Bucket
	ctx    context.Context // the pilot's: reserved names; cancelled when no caller is left
	cancel context.CancelFunc

	// mu:
	waiting []*member // callers without an outcome, in arrival order (the next to run fn first)
	live    int       // callers not yet returned
}

// member is one caller of Do in a flight.
type member struct {
	m    *manager.Manager
	key  string
	ctx  context.Context
	fn   func(ctx context.Context) ([]byte, error)
	gen0 gen // the outcome published when it arrived: never its outcome

	done   chan struct{} // closed when the fields below are set
	res    []byte
	err    error
	shared bool
	panic  any // its fn's panic, re-raised in its goroutine
}

// flightName is the reserved lock name of key's flights: "-c:"+key, or,
// when that is longer than maxName, "-c#" and a hash of key (two keys with
// one hash share a lock, never an outcome: the outcome names its key).
func flightName(key string, maxName int) (string, error) {
	if n := "-c:" + key; len(n) <= maxName {
		return n, nil
	}
	if maxName < 3+16 {
		return "", fmt.Errorf("%w: coalesce %q: MaxNameLen %d leaves no room for a flight lock name", manager.ErrNotSupported, key, maxName)
	}
	h := sha256.Sum256([]byte(key))
	x := hex.EncodeToString(h[:])
	return "-c#" + x[:min(len(x), maxName-3)], nil
}

// join adds mb to key's flight in m, starting one if none is in progress.
func join(m *manager.Manager, b seam.Bucket, key string, mb *member) *flight {
	mu.Lock()
	defer mu.Unlock()
	fk := flightKey{m, key}
	f := flights[fk]
	if f == nil {
		ctx, cancel := context.WithCancel(seam.Reserved(context.Background()))
		f = &flight{fk: fk, b: b, ctx: ctx, cancel: cancel}
		flights[fk] = f
		go f.pilot()
	}
	f.waiting = append(f.waiting, mb)
	f.live++
	return f
}

// leave removes mb, whose ctx ended, from f, unless it has its outcome
// already or is running its fn (false: the caller waits for the outcome,
// which comes once fn returns). The last caller to leave ends f's part in
// the protocol: the pilot gives up its place in the queue.
func (f *flight) leave(mb *member) bool {
	mu.Lock()
	defer mu.Unlock()
	i := slices.Index(f.waiting, mb)
	if i < 0 {
		return false // delivered, or running its fn
	}
	f.waiting = slices.Delete(f.waiting, i, i+1)
	f.live--
	if f.live == 0 {
		f.retire()
		f.cancel()
	}
	return true
}

// retire makes f no longer the flight a caller of its key joins (mu held).
func (f *flight) retire() {
	if flights[f.fk] == f {
		delete(flights, f.fk)
	}
}

// outcome is what Do returns to mb.
func (mb *member) outcome() ([]byte, bool, error) {
	if mb.panic != nil {
		panic(mb.panic)
	}
	return mb.res, mb.shared, mb.err
}

// deliver gives mb its outcome (mu held; mb no longer in f.waiting).
func (f *flight) deliver(mb *member, res []byte, err error, shared bool) {
	if shared && res != nil {
		res = slices.Clone(res)
	}
	mb.res, mb.err, mb.shared = res, err, shared
	f.live--
	close(mb.done)
}

// finish delivers an outcome to every waiting caller of f and retires f.
func (f *flight) finish(res []byte, err error) {
	mu.Lock()
	f.retire()
	for _, mb := range f.waiting {
		f.deliver(mb, res, err, true)
	}
	f.waiting = nil
	mu.Unlock()
	f.cancel()
}

// share delivers outcome o, published by another process, to the waiting
// callers of f that arrived before it was published, and reports whether
// any caller is left (one that arrived later: o is too old for it). With
// none left, f is retired.
func (f *flight) share(o *outcome) bool {
	res, err := o.result()
	mu.Lock()
	defer mu.Unlock()
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
		f.retire()
		return false
	}
	return true
}

// next takes the next caller of f to run fn: the longest waiting one whose
// ctx has not ended. With none left, f is retired (a caller arriving now
// starts a new flight) and next returns nil.
func (f *flight) next() *member {
	mu.Lock()
	defer mu.Unlock()
	for i, mb := range f.waiting {
		if mb.ctx.Err() == nil { // one whose ctx ended is about to leave
			f.waiting = slices.Delete(f.waiting, i, i+1)
			return mb
		}
	}
	f.retire()
	return nil
}

// pilot runs f's part in the cross-process protocol (see the comment at
// the top of this file).
func (f *flight) pilot() {
	defer f.cancel()
	m, key := f.fk.m, f.fk.key
	lname, _ := flightName(key, f.b.MaxNameLen) // checked by DoWithin
	l, err := m.Acquire(f.ctx, lname, manager.RequestOptions{IfAvailable: true})
	if errors.Is(err, manager.ErrNotAvailable) {
		l, err = m.Acquire(f.ctx, lname, manager.RequestOptions{})
	}
	if err != nil {
		f.finish(nil, fmt.Errorf("coalesce %q: %w", key, err))
		return
	}
	// Has a flight published since our callers arrived (the one we
	// queued behind, or one that ended between their arrival and our
	// grant)? A corrupt or missing outcome is none: we lead, and our
	// outcome replaces it.
	if o, rerr := load(f.b, key); rerr == nil && o != nil && !f.share(o) {
		l.Release()
		return
	}
	// Callers are left for whom nothing new was published (its leader
	// died or gave up, or they came after it): we lead.
	for {
		mb := f.next()
		if mb == nil {
			l.Release() // nobody left to run fn: publish nothing
			return
		}
		res, ferr, pv := runFn(mb)
		seam.Crash("coalesce.ran")
		if pv == nil && ferr != nil && mb.ctx.Err() != nil {
			// Its caller gave up and fn failed: publish nothing, the
			// next caller leads (still holding the lock).
			mu.Lock()
			f.deliver(mb, nil, fmt.Errorf("%w: coalesce %q: %w (fn: %w)", manager.ErrAborted, key, mb.ctx.Err(), ferr), false)
			mu.Unlock()
			continue
		}
		if pv != nil {
			ferr = fmt.Errorf("coalesce %q: fn panicked: %v", key, pv)
		}
		if ferr == nil && len(res) > MaxResultSize {
			ferr = fmt.Errorf("%w: coalesce %q: %d bytes, MaxResultSize %d", ErrResultTooLarge, key, len(res), MaxResultSize)
			res = nil
		}
		// Callers arriving from now on start a new flight: the outcome
		// is published before it is delivered, so it would be too old for
		// them.
		mu.Lock()
		f.retire()
		mu.Unlock()
		// A failed publish (the store not writable, the Manager closing)
		// costs sharing, not correctness: our callers get the outcome,
		// and a follower elsewhere finds nothing new and leads.
		_ = publish(f.b, l, key, res, ferr)
		l.Release()
		mu.Lock()
		mb.panic = pv
		f.deliver(mb, res, ferr, false)
		mu.Unlock()
		f.finish(res, ferr)
		return
	}
}

// flightCtx is the ctx of a flight's fn: its caller's ctx, marked as inside
// a flight on key, so that a Do on key from fn fails at once
// (ErrWouldDeadlock) instead of waiting for its own flight.
type flightCtx struct {
	context.Context
	m   *manager.Manager
	key string
}

type flightCtxKey struct{}

func (c *flightCtx) Value(key any) any {
	if _, ok := key.(flightCtxKey); ok {
		return c
	}
	return c.Context.Value(key)
}

// inFlight reports whether ctx is (derived from) the ctx of fn of m's flight on key.
func inFlight(ctx context.Context, m *manager.Manager, key string) bool {
	for v := ctx.Value(flightCtxKey{}); v != nil; {
		c, ok := v.(*flightCtx)
		if !ok {
			return false
		}
		if c.m == m && c.key == key {
			return true
		}
		v = c.Context.Value(flightCtxKey{})
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
	res, err = mb.fn(&flightCtx{Context: mb.ctx, m: mb.m, key: mb.key})
	return res, err, nil
}
