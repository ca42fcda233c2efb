//go:build unix

package stress

import (
	"context"
	"math/rand/v2"
	"slices"

	"github.com/shmlocks/shmlocks/manager"
)

// The all feature: AcquireAll (and its callback form RequestAll) of two or
// three names in one mode. Every name of the set is checked as a grant of
// its own (occupancy, counter, token) from the moment the set is granted
// until it is released, so a name given back early, or never held, while
// the set is reported held is an exclusion violation on that name.
//
// Records of goroutine g: k for the set's k-th name (in the order drawn).

// drawSet draws 2..allMax distinct names (fewer if there are fewer names).
func drawSet(rng *rand.Rand, names int) []int {
	k := min(2+rng.IntN(allMax-1), names)
	return rng.Perm(names)[:k]
}

// runAll makes goroutine g's multi-name requests until ctx ends or its ops
// are done.
func runAll(ctx context.Context, wc *workerConfig, hold Hold, r *Region, c *Checker, be backend, g int, st *gstats) {
	m := be.(*shmBackend).m
	rng := rand.New(rand.NewPCG(wc.Seed, uint64(wc.Slot)<<20|uint64(g)))
	slot := wc.Slot
	for i := 0; wc.Ops == 0 || i < wc.Ops; i++ {
		if ctx.Err() != nil {
			break
		}
		d := drawRequest(rng, wc)
		set := drawSet(rng, wc.Names)
		callback := rng.IntN(2) == 0
		h := hold.Sample(rng)
		rctx, cancel, deadline := d.ctx(ctx, wc)
		names := make([]string, len(set))
		qs := make([]*Request, len(set))
		for k, n := range set {
			names[k] = nameOf(n)
			qs[k] = c.begin(want{rec: r.rec(g, k), name: n, mode: d.mode, blocking: !d.ifAvailable, deadline: deadline, flags: waitMulti})
		}
		granted := false
		held := func(locks []*manager.Lock) {
			for _, q := range qs {
				q.End()
			}
			if len(locks) != len(set) {
				c.violation(kindExclusion, "AcquireAll of %q returned %d locks", names, len(locks))
				return
			}
			granted = true
			r.countGrant(slot, g, d.mode)
			r.addStat(slot, slSets, 1)
			// The locks come in byte order of their names.
			for _, l := range locks {
				k := slices.Index(names, l.Name())
				if k < 0 || l.Mode() != managerMode(d.mode) {
					c.violation(kindExclusion, "AcquireAll of %q in mode %s returned a lock of %q in mode %s", names, modeName(d.mode), l.Name(), l.Mode())
					continue
				}
				qs[k].Granted(l.Token())
				qs[k].Enter()
			}
			holdFor(h)
			for _, q := range qs {
				q.Exit()
				q.Release()
			}
		}
		var err error
		if callback {
			err = m.RequestAll(rctx, names, d.options(), func(_ context.Context, locks []*manager.Lock) error {
				if locks == nil {
					return manager.ErrNotAvailable
				}
				held(locks)
				return nil
			})
		} else {
			var locks []*manager.Lock
			locks, err = m.AcquireAll(rctx, names, d.options())
			if err == nil {
				held(locks)
				err = manager.ReleaseAll(locks)
			}
		}
		for _, q := range qs {
			q.End()
		}
		cancel()
		r.addStat(slot, slOps, 1)
		// A stolen set: which name was stolen is not said, so the steal is
		// not looked for (its stealer checked its own grant).
		if !outcome(r, slot, g, d.mode, st, granted, err, "AcquireAll", nil) {
			break
		}
	}
}
