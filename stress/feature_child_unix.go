//go:build unix

package stress

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

// The child feature: a Request whose fn hands its ctx to goroutines
// (errgroup style) that each make a request of the same name with it, some
// of which make one more from inside their own fn (a nested request). Those
// are child grants (docs/multi-and-deadlock.md): children of one grant must
// exclude each other as requests of the name would, a nested request is a
// child of the child that made it (granted at once), and a ctx whose grant
// has ended carries nothing.
//
// Records of goroutine g: 0 the Request, 1+2k child k, 2+2k child k's
// nested request, and the last one a request made with the ctx of a grant
// that had ended (recStale).

const childStale = 0.15 // fraction of grants whose ctx is used again after Request returned

// childPlan is what one grant's children do, drawn before the grant (the
// rng is the goroutine's).
type childPlan struct {
	n      int
	modes  [childFanout]uint32
	nested [childFanout]bool
	nmodes [childFanout]uint32
	holds  [childFanout]time.Duration
	stale  bool
	delay  time.Duration // before the stale request
}

func drawChildPlan(rng *rand.Rand, hold Hold, outer uint32) childPlan {
	p := childPlan{n: 1 + rng.IntN(childFanout)}
	for k := 0; k < p.n; k++ {
		p.modes[k], p.nmodes[k] = modeShared, modeShared
		if outer == modeExclusive && rng.Float64() < 0.7 {
			p.modes[k] = modeExclusive
			if rng.Float64() < 0.5 {
				p.nmodes[k] = modeExclusive
			}
		}
		p.nested[k] = rng.Float64() < 0.5
		p.holds[k] = hold.Sample(rng)
	}
	p.stale = rng.Float64() < childStale
	p.delay = time.Duration(rng.Int64N(int64(time.Millisecond)))
	return p
}

// runChild makes goroutine g's Requests with children until ctx ends or its
// ops are done.
func runChild(ctx context.Context, wc *workerConfig, hold Hold, r *Region, c *Checker, be backend, g int, st *gstats) {
	m := be.(*shmBackend).m
	rng := rand.New(rand.NewPCG(wc.Seed, uint64(wc.Slot)<<20|uint64(g)))
	slot := wc.Slot
	var stale sync.WaitGroup // a request through an ended grant's ctx, at most one at a time
	defer stale.Wait()
	for i := 0; wc.Ops == 0 || i < wc.Ops; i++ {
		if ctx.Err() != nil {
			break
		}
		d := drawRequest(rng, wc)
		plan := drawChildPlan(rng, hold, d.mode)
		h0 := hold.Sample(rng)
		rctx, cancel, deadline := d.ctx(ctx, wc)
		q := c.begin(want{rec: r.rec(g, 0), name: d.name, mode: d.mode, blocking: !d.ifAvailable, deadline: deadline})
		var fnCtx context.Context
		granted := false
		err := m.Request(rctx, nameOf(d.name), d.options(), func(fctx context.Context, l *manager.Lock) error {
			q.End()
			if l == nil {
				return manager.ErrNotAvailable
			}
			granted = true
			r.countGrant(slot, g, d.mode)
			q.Granted(l.Token())
			q.Enter()
			holdFor(h0)
			children(fctx, m, wc, r, c, g, q, &plan, st)
			q.Exit()
			q.Release()
			fnCtx = fctx
			return nil
		})
		q.End()
		cancel()
		r.addStat(slot, slOps, 1)
		if !outcome(r, slot, g, d.mode, st, granted, err, "request", q.LostAtRelease) {
			break
		}
		if plan.stale && fnCtx != nil {
			stale.Wait()
			stale.Add(1)
			go func() {
				defer stale.Done()
				staleRequest(fnCtx, m, r, c, g, d.name, plan.delay, st)
			}()
		}
	}
}

// children runs one grant's children (fan-out with fn's ctx) and waits for them.
func children(fctx context.Context, m *manager.Manager, wc *workerConfig, r *Region, c *Checker, g int,
	parent *Request, plan *childPlan, st *gstats) {
	var section atomic.Uint64 // the grant's own non-atomic counter of exclusive child sections
	var wg sync.WaitGroup
	for k := 0; k < plan.n; k++ {
		wg.Add(1)
		go func(k int) {
			defer wg.Done()
			mode := plan.modes[k]
			err := m.Request(fctx, nameOf(parent.name), manager.RequestOptions{Mode: managerMode(mode)},
				func(cctx context.Context, cl *manager.Lock) error {
					cq := c.GrantedChild(parent, r.rec(g, 1+2*k), mode, cl.Token())
					v := section.Load()
					holdFor(plan.holds[k])
					if plan.nested[k] {
						nested(cctx, m, wc, r, c, g, k, cq, plan.nmodes[k], st)
					}
					// A grant stolen from ends its children as a loss: their
					// sections are fenced off, as the name's counter's are.
					if mode == modeExclusive && !parent.stolen() {
						if now := section.Load(); now != v {
							c.violation(kindChild, "exclusive children of one grant overlapped on %s (token %d): the grant's section counter changed from %d to %d during an exclusive child's section",
								nameOf(parent.name), parent.token, v, now)
						}
						section.Store(v + 1)
					}
					cq.Release()
					return nil
				})
			childOutcome(fctx, r, c.slot, st, err, "child request")
		}(k)
	}
	wg.Wait()
}

// nested makes a request from inside child k's fn with its ctx: a child of
// that child, granted at once (it can wait only for its own siblings, and
// it has none); Stuck without a grant is a violation (a nested request
// queued behind its own parent never gets it).
func nested(cctx context.Context, m *manager.Manager, wc *workerConfig, r *Region, c *Checker, g, k int,
	parent *Request, mode uint32, st *gstats) {
	nctx, cancel := context.WithTimeout(cctx, wc.Stuck)
	defer cancel()
	start := time.Now()
	err := m.Request(nctx, nameOf(parent.name), manager.RequestOptions{Mode: managerMode(mode)},
		func(_ context.Context, gl *manager.Lock) error {
			gq := c.GrantedChild(parent, r.rec(g, 2+2*k), mode, gl.Token())
			gq.Release()
			return nil
		})
	if errors.Is(err, context.DeadlineExceeded) && cctx.Err() == nil {
		c.violation(kindChild, "a nested request on %s made with a child grant's ctx was not granted in %v (it waits for its own parent?)",
			nameOf(parent.name), time.Since(start).Round(time.Millisecond))
		return
	}
	childOutcome(cctx, r, c.slot, st, err, "nested request")
}

// childOutcome checks how a child request ended: granted, or refused
// because its parent's ctx ended (the parent was stolen, or the run ended);
// anything else is an error. (A child is part of its parent's request: it
// is not counted among the requests.)
func childOutcome(pctx context.Context, r *Region, slot int, st *gstats, err error, what string) {
	switch {
	case err == nil:
	case errors.Is(err, manager.ErrStolen), errors.Is(err, manager.ErrAborted) && pctx.Err() != nil:
	default:
		r.addStat(slot, slErrors, 1)
		st.addErr(what + ": " + err.Error())
	}
}

// staleRequest makes an IfAvailable request with the ctx of a grant that
// has ended (a goroutine that kept fn's ctx): it carries nothing, so it is
// refused (the ctx is done) or granted as an ordinary request, never as a
// child of another grant that happens to hold the name.
func staleRequest(fctx context.Context, m *manager.Manager, r *Region, c *Checker, g, name int, delay time.Duration, st *gstats) {
	time.Sleep(delay) // let the goroutine's next Request be granted
	r.addStat(c.slot, slStale, 1)
	rec := r.rec(g, childRecords-1)
	q := c.begin(want{rec: rec, name: name, mode: modeExclusive})
	l, err := m.Acquire(fctx, nameOf(name), manager.RequestOptions{IfAvailable: true})
	q.End()
	switch {
	case err == nil:
	case errors.Is(err, manager.ErrAborted), errors.Is(err, manager.ErrNotAvailable):
		return
	case errors.Is(err, manager.ErrWouldDeadlock):
		// Decided as a reentrant request: the ctx still carries a grant.
		c.violation(kindChild, "a request on %s made with the ctx of an ended grant was treated as a child of a live one: %v", nameOf(name), err)
		return
	default:
		r.addStat(c.slot, slErrors, 1)
		st.addErr("request with an ended grant's ctx: " + err.Error())
		return
	}
	q.flags = recStale
	q.Granted(l.Token())
	q.Release()
	if err := l.Release(); err != nil && !errors.Is(err, manager.ErrStolen) {
		// Its own grant cannot have been released by anyone else: it was
		// made a child of another grant.
		c.violation(kindChild, "release of a grant on %s made with the ctx of an ended grant: %v", nameOf(name), err)
	}
}
