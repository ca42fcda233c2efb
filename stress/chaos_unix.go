//go:build unix

package stress

import (
	"context"
	mrand "math/rand/v2"
	"time"
)

// The supervisor's chaos: SIGKILL a random worker, start its replacement,
// and time each kill to the next grant on the names the victim held.

// chaos SIGKILLs a random worker cfg.Chaos times a second and starts a
// replacement at its position. Before the signal it marks the victim's slot
// killed (so the checkers ignore its records from then on) and arms a reap
// watch on every name the victim holds exclusively.
func (s *supervisor) chaos(ctx context.Context) {
	rng := mrand.New(mrand.NewPCG(s.cfg.Seed, 0xc4a05))
	interval := time.Duration(float64(time.Second) / s.cfg.Chaos)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if s.r.Stopped() {
			return
		}
		s.collectReaps()
		s.mu.Lock()
		if s.nextSlot >= s.r.Slots() {
			if !s.noSlots {
				s.noSlots = true
			}
			s.mu.Unlock()
			continue
		}
		var cands []*worker
		for p, w := range s.current {
			if w != nil && !s.posDone[p] && !w.killed && s.r.slotState(w.slot) == slotRunning && !isDone(w) {
				cands = append(cands, w)
			}
		}
		if len(cands) == 0 {
			s.mu.Unlock()
			continue
		}
		// Prefer a worker that holds a lock right now: killing holders is
		// what exercises reaping.
		var holders []*worker
		for _, w := range cands {
			for g := 0; g < s.r.Goroutines(); g++ {
				if s.r.readRecord(w.slot, g).holdName >= 0 {
					holders = append(holders, w)
					break
				}
			}
		}
		if len(holders) > 0 {
			cands = holders
		}
		v := cands[rng.IntN(len(cands))]
		s.kill(v)
		ops := 0
		if s.cfg.Ops > 0 {
			var done uint64
			for _, w := range s.all {
				if w.pos == v.pos {
					done += s.r.stat(w.slot, slOps)
				}
			}
			total := uint64(s.cfg.Ops * s.cfg.Goroutines)
			if done >= total {
				s.posDone[v.pos] = true
				s.checkAllDone()
				s.mu.Unlock()
				continue
			}
			ops = int((total - done + uint64(s.cfg.Goroutines) - 1) / uint64(s.cfg.Goroutines))
		}
		if err := s.spawn(v.pos, ops); err != nil {
			s.failures = append(s.failures, "could not start a replacement worker: "+err.Error())
			s.posDone[v.pos] = true
			s.checkAllDone()
		}
		s.mu.Unlock()
	}
}

// kill marks v killed, arms the reap watches and sends SIGKILL. s.mu held.
func (s *supervisor) kill(v *worker) {
	r := s.r
	v.killed = true
	r.setSlotState(v.slot, slotKilled)
	var names []int
	now := mono()
	for g := 0; g < r.Goroutines(); g++ {
		rec := r.readRecord(v.slot, g)
		if rec.holdName < 0 {
			continue
		}
		names = append(names, rec.holdName)
		n := rec.holdName
		if rec.holdMode != modeExclusive || atomic32(r.nu32(n, nmReapState)) != 0 {
			continue
		}
		storeU32(r.nu32(n, nmReapSlot), uint32(v.slot))
		storeU32(r.nu32(n, nmReapG), uint32(g))
		storeU64(r.nu64(n, nmReapToken), rec.token)
		storeI64(r.ni64(n, nmReapKill), now)
		storeU32(r.nu32(n, nmReapState), 1)
	}
	r.AddKill()
	v.cmd.Process.Kill()
	s.kills++
	// The watchdog measures "nothing happened on the name" from here.
	for _, n := range names {
		storeI64(r.ni64(n, nmLastChange), mono())
	}
}

// collectReaps takes the reap samples of the grants that followed kills.
func (s *supervisor) collectReaps() {
	r := s.r
	for n := 0; n < r.Names(); n++ {
		switch atomic32(r.nu32(n, nmReapState)) {
		case 2:
			recordNS(s.reap, loadI64(r.ni64(n, nmReapGrant))-loadI64(r.ni64(n, nmReapKill)))
			storeU32(r.nu32(n, nmReapState), 0)
		case 3:
			storeU32(r.nu32(n, nmReapState), 0)
		}
	}
}
