//go:build unix

package stress

import (
	"context"
	mrand "math/rand/v2"
	"slices"
	"sync/atomic"
	"time"
)

// The supervisor's chaos: SIGKILL a process of each feature in turn, at the
// moment the feature is most fragile, start the replacement of a killed
// worker, and time each kill of a holder to the next grant on its names.

// chaos sends cfg.Chaos SIGKILLs a second, each to the feature killed least
// so far that has a victim at that moment:
//
//   - plain: a worker holding a lock (any worker if none holds);
//   - child: a worker inside a child grant (else one of the feature's);
//   - coalesce: a worker whose fn leads a flight (else one of the feature's);
//   - all: a worker holding several names of an AcquireAll (else one of the feature's);
//   - exec: the wrapper, the command or the wrapper's process group of an
//     exec command that has checked in (none running: no kill).
//
// Before it kills a worker the supervisor marks its slot killed (so the
// checkers ignore its records from then on), arms a reap watch on every
// name the victim holds exclusively, and starts a replacement at its
// position. An exec kill is asked of the wrapper's parent or of the
// command (exec feature, feature_exec_unix.go).
func (s *supervisor) chaos(ctx context.Context) {
	rng := mrand.New(mrand.NewPCG(s.cfg.Seed, 0xc4a05))
	interval := time.Duration(float64(time.Second) / s.cfg.Chaos)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	feats := s.cfg.Features
	if len(feats) == 0 {
		feats = []string{FeaturePlain}
	}
	order := append([]string(nil), feats...)
	start, sent := time.Now(), 0
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
		// Kills owed at this rate since the start: a tick that came late (a
		// replacement is slow to start on a busy machine) is made up, a few
		// at a time.
		owed := min(int(time.Since(start).Seconds()*s.cfg.Chaos)-sent, 4)
		for ; owed > 0; owed-- {
			// The feature killed least so far goes first (an exec command
			// is not always running when its turn comes).
			slices.SortStableFunc(order, func(a, b string) int {
				return s.r.featureKills(featureIndex(a)) - s.r.featureKills(featureIndex(b))
			})
			for _, f := range order {
				if s.chaosOne(rng, f) {
					break
				}
			}
			sent++ // a tick without a victim is not made up
		}
	}
}

// chaosOne kills one process of feature f, if it has a victim now.
func (s *supervisor) chaosOne(rng *mrand.Rand, f string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f == FeatureExec {
		return s.killExec(rng)
	}
	if s.nextSlot >= s.r.Slots() {
		s.noSlots = true
		return false
	}
	var cands, fragile []*worker
	for p, w := range s.current {
		if w == nil || s.role(p) != f || s.posDone[p] || w.killed || s.r.slotState(w.slot) != slotRunning || isDone(w) {
			continue
		}
		cands = append(cands, w)
		if s.fragile(w, f) {
			fragile = append(fragile, w)
		}
	}
	if len(cands) == 0 {
		return false
	}
	if len(fragile) > 0 {
		cands = fragile
	}
	v := cands[rng.IntN(len(cands))]
	s.kill(v, featureIndex(f))
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
			return true
		}
		ops = int((total - done + uint64(s.cfg.Goroutines) - 1) / uint64(s.cfg.Goroutines))
	}
	if err := s.spawn(v.pos, ops); err != nil {
		s.failures = append(s.failures, "could not start a replacement worker: "+err.Error())
		s.posDone[v.pos] = true
		s.checkAllDone()
	}
	return true
}

// fragile reports whether worker w of feature f is where a kill hurts most.
func (s *supervisor) fragile(w *worker, f string) bool {
	r := s.r
	held := 0
	for i := 0; i < r.Records(); i++ {
		o := r.readRecord(w.slot, i)
		if o.holdName < 0 {
			continue
		}
		switch {
		case f == FeatureChild && o.flags&recChild != 0:
			return true
		case f == FeatureCoalesce && r.isFlight(o.holdName):
			return true
		case f == FeaturePlain:
			return true
		}
		held++
	}
	return f == FeatureAll && held >= 2
}

// killExec asks for the SIGKILL of an exec command's wrapper, of the
// command itself or of the wrapper's process group (6:2:2), for a command
// that has checked in and is still running. s.mu held.
func (s *supervisor) killExec(rng *mrand.Rand) bool {
	r := s.r
	type cand struct {
		slot, rec int
		seq       uint64
	}
	var cands []cand
	for p, w := range s.current {
		if w == nil || s.role(p) != FeatureExec || r.slotState(w.slot) != slotRunning {
			continue
		}
		for g := 0; g < r.Goroutines(); g++ {
			rec := r.rec(g, 0)
			o := r.readRecord(w.slot, rec)
			if o.holdName < 0 || o.flags&recExec == 0 || !processAlive(int(o.pid), o.pstart) {
				continue
			}
			seq := atomic.LoadUint64(r.u64(r.recOff(w.slot, rec) + rcSeq))
			if atomic.LoadUint64(r.u64(r.recOff(w.slot, rec)+rcCtl)) == seq<<8 {
				cands = append(cands, cand{w.slot, rec, seq})
			}
		}
	}
	if len(cands) == 0 {
		return false
	}
	c := cands[rng.IntN(len(cands))]
	target := execKillWrapper
	switch x := rng.IntN(10); {
	case x >= 8:
		target = execKillGroup
	case x >= 6:
		target = execKillCommand
	}
	// Tagged with the command's seq: if the goroutine has moved on to its
	// next command, nobody acts on it.
	return atomic.CompareAndSwapUint64(r.u64(r.recOff(c.slot, c.rec)+rcCtl), c.seq<<8, c.seq<<8|uint64(target))
}

// kill marks v killed, arms the reap watches and sends SIGKILL. s.mu held.
func (s *supervisor) kill(v *worker, feature int) {
	r := s.r
	v.killed = true
	r.setSlotState(v.slot, slotKilled)
	var names []int
	now := mono()
	for i := 0; i < r.Records(); i++ {
		rec := r.readRecord(v.slot, i)
		if rec.holdName < 0 || rec.holdName >= r.Names() {
			continue
		}
		names = append(names, rec.holdName)
		n := rec.holdName
		if rec.holdMode != modeExclusive || rec.flags&(recChild|recStale) != 0 || atomic32(r.nu32(n, nmReapState)) != 0 {
			continue
		}
		storeU32(r.nu32(n, nmReapSlot), uint32(v.slot))
		storeU32(r.nu32(n, nmReapG), uint32(i))
		storeU64(r.nu64(n, nmReapToken), rec.token)
		storeI64(r.ni64(n, nmReapKill), now)
		storeU32(r.nu32(n, nmReapState), 1)
	}
	r.addKill(feature)
	v.cmd.Process.Kill()
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
