//go:build unix

package stress

import (
	"context"
	"fmt"
	"math"
	"time"
)

// The supervisor's watchdog (stuck requests, ignored deadlines) and its
// progress line.

// watchdog reports waiters stuck on a free name: a request waiting longer
// than cfg.Stuck while no live process holds the name and nothing was
// granted or released on it for cfg.Stuck (for an AcquireAll, every name it
// waits for); and requests with a deadline still waiting cfg.Stuck after it.
func (s *supervisor) watchdog(ctx context.Context) {
	r := s.r
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	stuck := int64(s.cfg.Stuck)
	var lastGranted uint64
	lastGrant, gapReported := mono(), false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		nSlots := s.nextSlot
		s.mu.Unlock()
		if gap := int64(s.cfg.MaxGrantGap); gap > 0 && !r.Stopped() {
			var granted uint64
			for sl := 0; sl < nSlots; sl++ {
				granted += s.r.granted(sl)
			}
			if now := mono(); granted != lastGranted {
				lastGranted, lastGrant = granted, now
			} else if now-lastGrant > gap && !gapReported {
				gapReported = true
				r.violation(kindStuck, fmt.Sprintf("no grant anywhere for %v (limit %v)", time.Duration(now-lastGrant).Round(time.Millisecond), s.cfg.MaxGrantGap))
			}
		}
		held := make([]bool, 2*r.Names())
		var waits []record
		r.liveSlots(func(sl int) {
			if r.slotState(sl) != slotRunning {
				return
			}
			for i := 0; i < r.Records(); i++ {
				rec := r.readRecord(sl, i)
				if rec.holdName >= 0 && rec.holdName < len(held) {
					held[rec.holdName] = true
				}
				if rec.waitName >= 0 && rec.waitName < r.Names() {
					waits = append(waits, rec)
				}
			}
		})
		now := mono()
		// A goroutine's waits: one name, or the names of an AcquireAll (stuck
		// only if every one of them is free and quiet).
		type goroutine struct{ slot, g int }
		free := map[goroutine]bool{}
		// An exec request's wait includes starting the wrapper and its
		// command (seconds for race-enabled binaries on a busy machine):
		// it is judged with five times the bound.
		bound := func(w record) int64 {
			if w.waitFlags&waitExec != 0 {
				return 5 * stuck
			}
			return stuck
		}
		for _, w := range waits {
			n := w.waitName
			last := loadI64(r.ni64(n, nmLastChange))
			k := goroutine{w.slot, w.g(r)}
			f, seen := free[k]
			free[k] = (f || !seen) && !held[n] && now-w.waitFrom > bound(w) && now-last > stuck
		}
		for _, w := range waits {
			key := [3]uint64{uint64(w.slot), uint64(w.g(r)), w.ticket}
			if s.stuckSeen[key] {
				continue
			}
			n := w.waitName
			last := loadI64(r.ni64(n, nmLastChange))
			switch {
			case w.deadline != 0 && now-w.deadline > bound(w):
				s.stuckSeen[key] = true
				r.violation(kindStuck, fmt.Sprintf("request for %s (pid %d goroutine %d) still waiting %v after its deadline",
					nameOf(n), r.slotPID(w.slot), w.g(r), time.Duration(now-w.deadline).Round(time.Millisecond)))
			case free[goroutine{w.slot, w.g(r)}]:
				s.stuckSeen[key] = true
				what := "request"
				if w.waitFlags&waitMulti != 0 {
					what = "AcquireAll request"
				} else if w.waitFlags&waitExec != 0 {
					what = "exec request"
				}
				r.violation(kindStuck, fmt.Sprintf("stuck waiter: %s %s (pid %d goroutine %d) waiting %v while %s is free and unchanged for %v",
					modeName(w.waitMode), what, r.slotPID(w.slot), w.g(r), time.Duration(now-w.waitFrom).Round(time.Millisecond),
					nameOf(n), time.Duration(now-last).Round(time.Millisecond)))
			}
		}
	}
}

func (s *supervisor) totals() (ops uint64, viol int) {
	s.mu.Lock()
	n := s.nextSlot
	s.mu.Unlock()
	for sl := 0; sl < n; sl++ {
		ops += s.r.stat(sl, slOps)
	}
	viol, _ = s.r.Violations()
	return ops, viol
}

// progress prints a progress line (only with cfg.Progress): redrawn four
// times a second, or one line every cfg.ProgressEvery.
func (s *supervisor) progress(ctx context.Context) {
	if s.cfg.Progress == nil {
		return
	}
	every, format := 250*time.Millisecond, "\r\x1b[K%s %.1fs%s  requests %d (%.0f/s)  kills %d  violations %d"
	if s.cfg.ProgressEvery > 0 {
		every, format = s.cfg.ProgressEvery, "stress: %s %.1fs%s  requests %d (%.0f/s)  kills %d  violations %d\n"
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ops, viol := s.totals()
		el := time.Since(s.start).Seconds()
		kills := s.r.kills()
		total := ""
		if s.cfg.Ops == 0 {
			total = fmt.Sprintf("/%.0fs", s.cfg.Duration.Seconds())
		}
		fmt.Fprintf(s.cfg.Progress, format, s.cfg.Backend, el, total, ops, float64(ops)/math.Max(el, 1e-3), kills, viol)
	}
}
