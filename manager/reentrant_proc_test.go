package manager_test

import (
	"context"
	"errors"
	"strings"
	"sync"

	. "github.com/shmlocks/shmlocks/manager"
)

// Child-side commands of the reentrancy tests (see proc_test.go for the
// protocol):
//
//	reenter NAME MODE   -> "reentered NAME outer=TOK child=TOK nested=TOK reentries=N upgrade=KIND":
//	                       outer = Acquire(NAME), child = Acquire through WithLock(outer),
//	                       nested = a shared Request through WithLock(child) and a helper's
//	                       Acquire with its fn's ctx; upgrade = an exclusive IfAvailable sibling
//	                       of child
//	releasechild NAME   -> "childreleased NAME errkind=KIND"
//	releaseouter NAME   -> "outerreleased NAME errkind=KIND"
var (
	childLocksMu sync.Mutex
	childOuter   = map[string]*Lock{}
	childChild   = map[string]*Lock{}
)

func errKind(err error) string {
	switch {
	case err == nil:
		return "none"
	case errors.Is(err, ErrWouldDeadlock):
		return "wouldDeadlock"
	case errors.Is(err, ErrAborted):
		return "aborted"
	case errors.Is(err, ErrNotAvailable):
		return "notavailable"
	case errors.Is(err, ErrStolen):
		return "stolen"
	case errors.Is(err, ErrReleased):
		return "released"
	}
	return "other:" + strings.ReplaceAll(err.Error(), " ", "_")
}

func childReentrant(m *Manager, f []string) {
	switch f[0] {
	case "reenter":
		name, mode := f[1], Exclusive
		if f[2] == "shared" {
			mode = Shared
		}
		ctx, cancel := context.WithTimeout(context.Background(), eventually)
		defer cancel()
		outer, err := m.Acquire(ctx, name, RequestOptions{Mode: mode})
		if err != nil {
			say("error reenter %v", err)
			return
		}
		lctx := WithLock(ctx, outer)
		child, err := m.Acquire(lctx, name, RequestOptions{Mode: mode})
		if err != nil {
			say("error reenter child %v", err)
			return
		}
		var nested uint64
		err = m.Request(WithLock(ctx, child), name, RequestOptions{Mode: Shared}, func(ctx context.Context, l *Lock) error {
			// A helper that requests its caller's lock again, through
			// the ctx it was given.
			l2, err := m.Acquire(ctx, name, RequestOptions{Mode: Shared})
			if err != nil {
				return err
			}
			nested = l2.Token()
			return l2.Release()
		})
		if err != nil {
			say("error reenter nested %v", err)
			return
		}
		reentries := outer.Reentries()
		ul, uerr := m.Acquire(lctx, name, RequestOptions{IfAvailable: true})
		if uerr == nil {
			ul.Release()
		}
		childLocksMu.Lock()
		childOuter[name], childChild[name] = outer, child
		childLocksMu.Unlock()
		say("reentered %s outer=%d child=%d nested=%d reentries=%d upgrade=%s", name, outer.Token(), child.Token(), nested, reentries, errKind(uerr))
	case "releasechild", "releaseouter":
		childLocksMu.Lock()
		l := childChild[f[1]]
		if f[0] == "releaseouter" {
			l = childOuter[f[1]]
		}
		childLocksMu.Unlock()
		if l == nil {
			say("error %s not held", f[1])
			return
		}
		what := strings.TrimPrefix(f[0], "release")
		say("%sreleased %s errkind=%s", what, f[1], errKind(l.Release()))
	}
}
