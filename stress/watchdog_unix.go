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
// granted or released on it for cfg.Stuck; and requests with a deadline
// still waiting cfg.Stuck after it.
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
				granted += s.r.stat(sl, slGranted)
			}
			if now := mono(); granted != lastGranted {
				lastGranted, lastGrant = granted, now
			} else if now-lastGrant > gap && !gapReported {
				gapReported = true
				r.Violation(fmt.Sprintf("no grant anywhere for %v (limit %v)", time.Duration(now-lastGrant).Round(time.Millisecond), s.cfg.MaxGrantGap))
			}
		}
		held := make([]bool, r.Names())
		var waits []record
		for sl := 0; sl < nSlots; sl++ {
			if r.slotState(sl) != slotRunning {
				continue
			}
			for g := 0; g < r.Goroutines(); g++ {
				rec := r.readRecord(sl, g)
				if rec.holdName >= 0 && rec.holdName < len(held) {
					held[rec.holdName] = true
				}
				if rec.waitName >= 0 && rec.waitName < len(held) {
					waits = append(waits, rec)
				}
			}
		}
		now := mono()
		for _, w := range waits {
			key := [3]uint64{uint64(w.slot), uint64(w.g), w.ticket}
			if s.stuckSeen[key] {
				continue
			}
			n := w.waitName
			last := loadI64(r.ni64(n, nmLastChange))
			switch {
			case w.deadline != 0 && now-w.deadline > stuck:
				s.stuckSeen[key] = true
				r.Violation(fmt.Sprintf("request for %s (pid %d goroutine %d) still waiting %v after its deadline",
					nameOf(n), r.slotPID(w.slot), w.g, time.Duration(now-w.deadline).Round(time.Millisecond)))
			case !held[n] && now-w.waitFrom > stuck && now-last > stuck:
				s.stuckSeen[key] = true
				r.Violation(fmt.Sprintf("stuck waiter: %s request (pid %d goroutine %d) waiting %v while %s is free and unchanged for %v",
					modeName(w.waitMode), r.slotPID(w.slot), w.g, time.Duration(now-w.waitFrom).Round(time.Millisecond),
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
		s.mu.Lock()
		kills := s.kills
		s.mu.Unlock()
		total := ""
		if s.cfg.Ops == 0 {
			total = fmt.Sprintf("/%.0fs", s.cfg.Duration.Seconds())
		}
		fmt.Fprintf(s.cfg.Progress, format, s.cfg.Backend, el, total, ops, float64(ops)/math.Max(el, 1e-3), kills, viol)
	}
}
