//go:build unix

package stress

import (
	"context"
	"errors"
	"math/rand/v2"

	"github.com/shmlocks/shmlocks/manager"
)

// What the feature roles share: drawing a request, and counting how a
// request made through the manager's callback and multi-name forms ended.

// draw is one request's random choices, drawn from the goroutine's rng.
type draw struct {
	name        int
	mode        uint32
	ifAvailable bool
	timed       bool
}

func drawRequest(rng *rand.Rand, wc *workerConfig) draw {
	d := draw{name: rng.IntN(wc.Names), mode: modeExclusive}
	if rng.Float64() < wc.Shared {
		d.mode = modeShared
	}
	d.ifAvailable = rng.Float64() < wc.IfAvailable
	d.timed = !d.ifAvailable && rng.Float64() < wc.Timeout
	return d
}

// ctx returns the request's ctx (with the run's deadline when timed) and
// its deadline in monotonic ns (0 none).
func (d draw) ctx(ctx context.Context, wc *workerConfig) (context.Context, context.CancelFunc, int64) {
	if !d.timed {
		return ctx, func() {}, 0
	}
	c, cancel := context.WithTimeout(ctx, wc.Deadline)
	return c, cancel, mono() + int64(wc.Deadline)
}

func (d draw) options() manager.RequestOptions {
	o := manager.RequestOptions{IfAvailable: d.ifAvailable}
	if d.mode == modeShared {
		o.Mode = manager.Shared
	}
	return o
}

func managerMode(m uint32) manager.Mode {
	if m == modeShared {
		return manager.Shared
	}
	return manager.Exclusive
}

// outcome counts how a request that was not granted ended, or how a grant
// (granted: Region.countGrant counted it) ended badly, so that each request has
// one outcome (results_unix.go); it returns false when the run is over
// (the request was aborted by the end of the run).
func outcome(r *Region, slot, g int, mode uint32, st *gstats, granted bool, err error, what string, lost func()) bool {
	switch {
	case err == nil:
	case errors.Is(err, manager.ErrStolen):
		if !granted { // granted, then stolen before fn saw it: a grant all the same
			r.countGrant(slot, g, mode)
		}
		r.addStat(slot, slStolen, 1)
		if granted {
			r.addStat(slot, slLostRel, 1)
		}
		if lost != nil {
			lost()
		}
	case granted:
		r.addStat(slot, slErrors, 1)
		r.addStat(slot, slRelErrors, 1)
		st.addErr(what + " (after its grant): " + err.Error())
	case errors.Is(err, manager.ErrNotAvailable):
		r.addStat(slot, slNotAvail, 1)
	case errors.Is(err, manager.ErrAborted) && errors.Is(err, context.DeadlineExceeded):
		r.addStat(slot, slTimedOut, 1)
	case errors.Is(err, manager.ErrAborted):
		r.addStat(slot, slAborted, 1)
		return false
	default:
		r.addStat(slot, slErrors, 1)
		st.addErr(what + ": " + err.Error())
	}
	return true
}

// nopBackend is the backend of a process that makes no request itself (the
// exec feature's workers: their wrappers do).
type nopBackend struct{}

func (nopBackend) acquire(context.Context, int, int, uint32, bool, bool) (any, uint64, error) {
	return nil, 0, errors.New("no backend")
}
func (nopBackend) release(any) error { return nil }
func (nopBackend) close() error      { return nil }
