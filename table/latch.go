package table

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/shmlocks/shmlocks/futex"
)

// The bucket latch serialises every change to the chain, entries, queues and
// held lists of one bucket. It is held for a few hundred nanoseconds at a
// time and never across a wait for a lock.
//
// Latch word (bucket offset 0, a futex word):
//
//	0                          free
//	owner+1 [| latchWaiters]   held by agent index owner; waiters bit set
//	                           by anyone about to sleep on the futex
//
// Written by: the acquirer (CAS 0 -> me), the holder (Swap -> 0, then a
// futex wake if the waiters bit was set), a sleeper (CAS to set the waiters
// bit), and a taker-over (CAS from a dead owner's value to itself, followed
// by a rebuild of the bucket from its slots: see repair).
const (
	latchSpins        = 64                     // Gosched spins before sleeping on the futex
	latchCheckAfter   = 1 * time.Millisecond   // owner liveness is checked once the wait is this long
	latchMaxSleep     = 16 * time.Millisecond  // futex sleeps grow up to this, re-checking the owner each time
	latchInitialSleep = 250 * time.Microsecond // first futex sleep
)

// LatchGiveUp bounds a wait for a bucket latch held by a live owner (a
// latch is normally held for well under a microsecond). Past it the
// operation fails with ErrCorrupt naming the bucket and the owner, and the
// latch is left alone: its owner may be a stopped process that will resume.
var LatchGiveUp = 10 * time.Second

// selfTakeoverAfter: how long a latch word naming our own agent must stay
// before it is treated as garbage (see latchOwnerDead).
func selfTakeoverAfter() time.Duration { return min(5*time.Second, LatchGiveUp/2) }

func (t *Table) latchWord(b uint32) *uint32 { return t.u32(t.bucketOff(b) + bkLatch) }

// latch acquires bucket b's latch for agent a. If the latch was left held by a
// dead agent it is taken over and the bucket is rebuilt (wakes collected in
// w). It fails only after LatchGiveUp behind a live owner.
func (t *Table) latch(a *Agent, b uint32, w *Wakes) error {
	lw := t.latchWord(b)
	me := a.Idx + 1
	if atomic.CompareAndSwapUint32(lw, 0, me) {
		crash("latch.acquired")
		return nil
	}
	if err := t.latchSlow(a, b, lw, me, w); err != nil {
		return err
	}
	crash("latch.acquired")
	return nil
}

func (t *Table) latchSlow(a *Agent, b uint32, lw *uint32, me uint32, w *Wakes) error {
	var begin, lastCheck time.Time
	sleep := latchInitialSleep
	for i := 0; ; i++ {
		v := atomic.LoadUint32(lw)
		if v&latchOwner == 0 {
			if atomic.CompareAndSwapUint32(lw, v, me|v&latchWaiters) {
				return nil
			}
			continue
		}
		if i < latchSpins {
			runtime.Gosched()
			continue
		}
		now := time.Now()
		if begin.IsZero() {
			begin, lastCheck = now, now
		}
		if now.Sub(begin) >= latchCheckAfter && now.Sub(lastCheck) >= sleep/2 {
			lastCheck = now
			owner := v&latchOwner - 1
			// Our own index is trusted for much longer: a Release of ours
			// racing with Close (not counted in flight) may hold a latch
			// and be descheduled; only a word that stays is garbage.
			if (owner != a.Idx || now.Sub(begin) >= selfTakeoverAfter()) && t.latchOwnerDead(a, owner) {
				if atomic.CompareAndSwapUint32(lw, v, me|v&latchWaiters) {
					t.repair(a, b, w)
					return nil
				}
				continue
			}
			if now.Sub(begin) > LatchGiveUp {
				return fmt.Errorf("%w: latch of bucket %d held by live agent %d for over %v (a stopped process, or a corrupt latch word)",
					ErrCorrupt, b, v&latchOwner-1, LatchGiveUp)
			}
		}
		if v&latchWaiters == 0 {
			if !atomic.CompareAndSwapUint32(lw, v, v|latchWaiters) {
				continue
			}
			v |= latchWaiters
		}
		futex.Wait(lw, v, sleep)
		if sleep < latchMaxSleep {
			sleep *= 2
		}
	}
}

// unlatch releases bucket b's latch and wakes its sleepers, if any.
func (t *Table) unlatch(a *Agent, b uint32) {
	lw := t.latchWord(b)
	old := atomic.SwapUint32(lw, 0)
	if old&latchWaiters != 0 {
		futex.Wake(lw, 1<<30)
	}
}

// latchOwnerDead decides whether a latch owner can be taken over: an owner
// index out of range is garbage; our own index is garbage only when no other
// operation of ours is in flight (so none can hold a latch); any other owner
// is dead when its identity no longer names a live process (its co-owner
// group does not count: only the process could release the latch). An owner whose
// record is free is not taken over: a Release racing with its Manager's
// Close may hold a latch for a moment after the record was freed (a latch
// word that stays so is given up on after LatchGiveUp).
func (t *Table) latchOwnerDead(a *Agent, owner uint32) bool {
	if owner >= uint32(t.l.MaxAgents) {
		return true
	}
	if owner == a.Idx {
		return a.InFlight != nil && a.InFlight.Load() <= 1
	}
	dead, _ := t.agentProcessDead(owner)
	return dead
}
