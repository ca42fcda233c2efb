package coalesce

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"

	"github.com/shmlocks/shmlocks/coalesce/internal/members"
	"github.com/shmlocks/shmlocks/internal/seam"
	"github.com/shmlocks/shmlocks/manager"
)

// Inside a Manager, the callers of a key share one flight: a pilot
// goroutine runs the cross-process protocol for them, and runs the fn of
// one of them while it leads. Across processes, a flight is an exclusive
// hold of the key's flight lock (a reserved lock name, flightName):
//
//	pilot ─▶ flight lock (IfAvailable, reading the outcome in place: the
//	         starting caller's arrival; else queue, following the store) ─▶
//	         granted:
//	           outcome published since a caller arrived? ─▶ it gets it
//	           callers left (nothing new for them: the leader died or
//	           gave up, or they came after its outcome) ─▶ lead:
//	             run a caller's fn ─▶ publish (store, fenced by the lock) ─▶ release
//
// A store that follows its records (seam.Follower: etcd's watch) hands a
// new outcome to the callers of a queued pilot without the lock.
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

func init() { members.Register(flightMembers) }

// flightMembers is the number of callers waiting in m's flight on key (the
// test kit's view, coalesce/internal/members).
func flightMembers(m *manager.Manager, key string) int {
	mu.Lock()
	defer mu.Unlock()
	if f := flights[flightKey{m, key}]; f != nil {
		return len(f.waiting)
	}
	return 0
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
	waiting   []*member // callers without an outcome, in arrival order (the next to run fn first)
	live      int       // callers not yet returned
	following bool      // the pilot waits for the lock and Follow may deliver
}

// member is one caller of Do in a flight.
type member struct {
	m    *manager.Manager
	key  string
	ctx  context.Context
	fn   func(ctx context.Context) ([]byte, error)
	gen0 gen // the outcome published when it arrived: never its outcome
	// arriving: gen0 is still to be read, by the pilot's first attempt at
	// the flight lock (mu); nothing is delivered to it before.
	arriving bool

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
// With first, it only starts one: nil if a flight is in progress (the
// caller reads the outcome in place, then joins); mb is then arriving, its
// gen0 read by the pilot's first attempt (flight.arrived).
func join(m *manager.Manager, b seam.Bucket, key string, mb *member, first bool) *flight {
	mu.Lock()
	defer mu.Unlock()
	fk := flightKey{m, key}
	f := flights[fk]
	if f != nil && first {
		return nil
	}
	mb.arriving = first
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
//
// followed says that o was learnt while waiting for the flight lock, not
// read under it: o need not be the latest outcome then, so it goes only to
// callers that saw an older one (or none) on arrival.
func (f *flight) share(o *outcome, followed bool) bool {
	res, err := o.result()
	mu.Lock()
	defer mu.Unlock()
	if followed && !f.following {
		return true // the pilot holds the lock now: it decides
	}
	return f.sift(func(mb *member) bool {
		if mb.gen0 == o.gen() || followed && mb.gen0.ok && o.token <= mb.gen0.token {
			return true // arrived after o was published
		}
		f.deliver(mb, res, err, true)
		return false
	})
}

// sift keeps the waiting callers of f for which keep reports true (keep
// has given the others their outcome) and retires f when none is left. It
// reports whether any is (mu held).
func (f *flight) sift(keep func(mb *member) bool) bool {
	rest := f.waiting[:0]
	for _, mb := range f.waiting {
		if keep(mb) {
			rest = append(rest, mb)
		}
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
	rk := recordKey(key)
	// A backend may read the outcome in the step of our first attempt at
	// the lock, granted or not (etcd: the same transaction): the outcome
	// in place then, as a load right after it would read while we hold.
	gr := &seam.GrantRead{Store: f.b.Store, Key: rk, Max: maxRecord(f.b.MaxNameLen)}
	l, err := m.Acquire(seam.WithGrantRead(f.ctx, gr), lname, manager.RequestOptions{IfAvailable: true})
	var o *outcome // the outcome in place, once read
	var rerr error
	if err == nil || errors.Is(err, manager.ErrNotAvailable) {
		// The outcome in place at our first attempt (read with it, or
		// now): the arriving caller's gen0 and, if we hold the lock, the
		// outcome to look at (nobody publishes while we hold it).
		if gr.Done {
			if rerr = fs.ErrNotExist; gr.Rec != nil {
				o, rerr = parseRecord(gr.Rec, rk, f.b.MaxNameLen, key)
			}
		} else {
			o, rerr = load(f.b, key)
		}
		if !f.arrived(o, rerr) {
			if l != nil {
				l.Release()
			}
			return
		}
	}
	if errors.Is(err, manager.ErrNotAvailable) {
		// While we wait, a store that can tell of a new outcome at once
		// (etcd: a watch, from the revision of our attempt) hands it to
		// our callers without the lock.
		if fw, ok := f.b.Store.(seam.Follower); ok {
			f.setFollowing(true)
			fw.Follow(f.ctx, rk, maxRecord(f.b.MaxNameLen), gr.Rev, f.followed)
		}
		l, err = m.Acquire(f.ctx, lname, manager.RequestOptions{})
		f.setFollowing(false)
		if err == nil {
			o, rerr = load(f.b, key)
		}
	}
	if err != nil {
		f.finish(nil, fmt.Errorf("coalesce %q: %w", key, err))
		return
	}
	// Has a flight published since our callers arrived (the one we
	// queued behind, or one that ended between their arrival and our
	// grant)? A corrupt or missing outcome is none: we lead, and our
	// outcome replaces it.
	if rerr == nil && o != nil && !f.share(o, false) {
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
		// and a follower elsewhere finds nothing new and leads. A result
		// the store refuses for its size (etcd's request limit) is
		// ErrResultTooLarge, published as such, as one over MaxResultSize.
		perr := publish(f.b, l, key, res, ferr)
		if errors.Is(perr, seam.ErrRecordTooLarge) && ferr == nil {
			ferr = fmt.Errorf("%w: coalesce %q: %d bytes, more than the bucket's store takes (%v)", ErrResultTooLarge, key, len(res), perr)
			res = nil
			_ = publish(f.b, l, key, res, ferr)
		}
		l.Release()
		mu.Lock()
		mb.panic = pv
		f.deliver(mb, res, ferr, false)
		mu.Unlock()
		f.finish(res, ferr)
		return
	}
}

// arrived sets the gen0 of the arriving callers of f to o, the outcome in
// place at the pilot's first attempt (none: rerr), or, when it could not
// be read, gives them the error. It reports whether any caller is left
// (none: f is retired).
func (f *flight) arrived(o *outcome, rerr error) bool {
	var failed error
	if rerr != nil && !errors.Is(rerr, fs.ErrNotExist) && !errors.Is(rerr, manager.ErrCorrupt) {
		failed = readErr(f.fk.key, rerr)
	}
	mu.Lock()
	defer mu.Unlock()
	return f.sift(func(mb *member) bool {
		if mb.arriving {
			mb.arriving = false
			if failed != nil {
				f.deliver(mb, nil, failed, false)
				return false
			}
			if o != nil {
				mb.gen0 = o.gen()
			}
		}
		return true
	})
}

// setFollowing turns the delivery of outcomes learnt by Follow on or off
// (off once the pilot holds the lock: then it alone decides, and its own
// publish must not reach its callers as another's).
func (f *flight) setFollowing(on bool) {
	mu.Lock()
	f.following = on
	mu.Unlock()
}

// followed is Follow's callback: a record just published under the key's
// store key. Callers that arrived before it was published get it (its
// token is above the one of the outcome they saw on arrival: tokens of
// the flight lock increase with each hold); with none left, the pilot
// leaves the queue.
func (f *flight) followed(rec []byte) {
	o, err := parseRecord(rec, recordKey(f.fk.key), f.b.MaxNameLen, f.fk.key)
	if err != nil || o == nil {
		return // not an outcome of our key: the lock path finds what there is
	}
	if !f.share(o, true) {
		f.cancel() // nobody left: give up our place in the queue
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
