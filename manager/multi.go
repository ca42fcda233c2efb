package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/shmlocks/shmlocks/table"
)

// Several names at once (docs/multi-and-deadlock.md).
//
// AcquireAll sorts the names (byte order), drops duplicates and requests
// them one after another in that order, each by the single-name rules: FIFO
// per name, shared and exclusive as usual, Steal and IfAvailable per name.
// Every AcquireAll in every process takes its names in the same order, so
// two of them never wait for each other in a cycle, whatever order their
// callers listed the names in. A request that ends before it has every name
// (ctx, ErrNotAvailable, ErrDeadlock, a table error) releases the names it
// was granted, in reverse order; the one it was waiting for is withdrawn as
// any aborted request is, so every queue is as if it had never come.
//
// Fairness: a multi-name request is one single-name request per name in
// turn, each in its name's FIFO queue, so a stream of single-name requests
// cannot starve it: on each name it waits only for those queued before it.
// It holds the names it has while it waits for the next (it does not back
// off and retry, which could starve it); the deadlock detector sees those
// holds (the waiting request's ctx carries them), so a cycle with requests
// that take the same names in another order is found and broken.

// carriedKey is the context key under which a ctx says which grants the
// task making a request with it holds: Request's callback ctx (fnCtx),
// WithLock's ctx, the callback ctx of RequestAll and the ctx AcquireAll
// passes to its later requests. A request on a name one of them holds is a
// child of it (reentrant.go); the deadlock detector follows the wait-for
// graph from those holds to the request (deadlock.go).
type carriedKey struct{}

// holdsCarrier is what ctx.Value(carriedKey{}) returns: some grants
// (carried(i), nil past the last), and the ctx to look further up in
// (carrier, which may carry more).
type holdsCarrier interface {
	carried(i int) *Lock
	carrier() context.Context
}

// carriedSet is the carrier of AcquireAll's and RequestAll's contexts.
type carriedSet struct {
	locks  []*Lock
	parent context.Context
}

func (s *carriedSet) carried(i int) *Lock {
	if i < len(s.locks) {
		return s.locks[i]
	}
	return nil
}

func (s *carriedSet) carrier() context.Context { return s.parent }

// eachCarried calls f for every grant ctx carries, innermost carrier first,
// following at most depth ctx levels, until f returns false.
func eachCarried(ctx context.Context, depth int, f func(l *Lock) bool) {
	for ; ctx != nil && depth > 0; depth-- {
		c, ok := ctx.Value(carriedKey{}).(holdsCarrier)
		if !ok {
			return
		}
		for i := 0; ; i++ {
			l := c.carried(i)
			if l == nil {
				break
			}
			if !f(l) {
				return
			}
		}
		ctx = c.carrier()
	}
}

// carriedCtx is ctx carrying s.
type carriedCtx struct {
	context.Context
	s *carriedSet
}

func (c carriedCtx) Value(key any) any {
	if _, ok := key.(carriedKey); ok {
		return c.s
	}
	return c.Context.Value(key)
}

// carriedRefs returns the table references of the grants that ctx says its
// task holds now (a child grant stands for its outermost grant's hold; at
// most 64 ctx levels are followed). A grant that has ended is not among
// them: a Lock serves one grant, and the table tags a hold only if the
// slot still holds that grant (its serial).
func carriedRefs(ctx context.Context) []table.Ref {
	var refs []table.Ref
	eachCarried(ctx, 64, func(l *Lock) bool {
		if l.heldNow() && !slices.Contains(refs, l.ref) {
			refs = append(refs, l.ref)
		}
		return true
	})
	return refs
}

// sortedNames validates names (in the contract's order: closed, then each
// name and the options, then ctx) and returns them sorted, without duplicates.
func (m *Manager) sortedNames(ctx context.Context, names []string, opts RequestOptions) ([]string, error) {
	if m.life.closed.Load() {
		return nil, ErrClosed
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: no lock names", ErrNotSupported)
	}
	for _, name := range names {
		if err := m.validate(context.Background(), name, opts); err != nil {
			return nil, err
		}
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: locks %q: %w", ErrAborted, sorted, err)
	}
	return sorted, nil
}

// AcquireAll grants every name in names or none: the handle form of
// RequestAll. The Locks are returned in byte order of their names, without
// duplicates (names may repeat and come in any order); each has its own
// fencing token and is released on its own (or with ReleaseAll). opts apply
// to every name: with IfAvailable, if any name is not grantable at once,
// nothing is held and the error matches ErrNotAvailable; with Steal, every
// name is stolen. An empty names is ErrNotSupported. If ctx ends, or a
// request fails (ErrDeadlock among others), the names already granted are
// released before AcquireAll returns the error.
func (m *Manager) AcquireAll(ctx context.Context, names []string, opts RequestOptions) ([]*Lock, error) {
	sorted, err := m.sortedNames(ctx, names, opts)
	if err != nil {
		return nil, err
	}
	locks := make([]*Lock, 0, len(sorted))
	held := &carriedSet{parent: ctx}
	rctx := context.Context(carriedCtx{ctx, held})
	for _, name := range sorted {
		l, err := m.Acquire(rctx, name, opts)
		if err != nil {
			if rerr := ReleaseAll(locks); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return nil, err
		}
		locks = append(locks, l)
		held.locks = locks
	}
	return locks, nil
}

// ReleaseAll releases every lock in locks (in reverse order) and returns
// their errors joined; nil locks are skipped.
func ReleaseAll(locks []*Lock) error {
	var errs []error
	for i := len(locks) - 1; i >= 0; i-- {
		if locks[i] == nil {
			continue
		}
		if err := locks[i].Release(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RequestAll waits until every name in names is granted (see AcquireAll),
// runs fn while holding them all, releases them and returns fn's error.
// With IfAvailable and some name not grantable at once, fn runs with
// locks == nil and nothing held. fn's ctx is cancelled when any of the
// locks is stolen or lost; RequestAll then returns an error matching
// ErrStolen (joined with fn's own error). fn's ctx carries the locks: a
// request made with it on one of the names is a child grant (see
// WithLock), and is known to be made while holding them (deadlock
// detection). It is cancelled when RequestAll returns.
func (m *Manager) RequestAll(ctx context.Context, names []string, opts RequestOptions,
	fn func(ctx context.Context, locks []*Lock) error) error {
	locks, err := m.AcquireAll(ctx, names, opts)
	if err != nil {
		if errors.Is(err, ErrNotAvailable) {
			return fn(ctx, nil)
		}
		return err
	}
	fctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, l := range locks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-l.Lost():
				cancel()
			case <-fctx.Done():
			}
		}()
	}
	ferr := fn(carriedCtx{fctx, &carriedSet{locks: locks, parent: ctx}}, locks)
	cancel()
	wg.Wait()
	var errs []error
	for _, l := range locks {
		if rerr := l.Release(); rerr != nil && !errors.Is(rerr, ErrReleased) {
			errs = append(errs, rerr) // stolen, reaped or closed under fn
		}
	}
	if len(errs) == 0 {
		return ferr
	}
	return errors.Join(append(errs, ferr)...)
}
