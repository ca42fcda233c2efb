//go:build linux && !shmlocks_poll

package wake

import (
	"sync"
	"time"

	"github.com/shmlocks/shmlocks/table"
)

// The reaper, a Manager's death watcher. Who is dead is asked of the
// kernel (table/live.go: an agent whose lock bytes no open file holds);
// when to ask, the kernel tells too, in any PID or network namespace:
//
//   - Every agent's sentinel thread (deathwatch_linux.go) has the agent's
//     death word on its robust futex list; when the thread dies (the
//     process is killed, exits or execs) the kernel marks the word
//     owner-died and wakes a waiter. Every Manager's watcher threads wait
//     on the death words of all other agents at once (futex_waitv), a
//     fixed number of threads (one per 125 agents) without polling; the
//     one the kernel wakes wakes the others.
//   - Woken, a watcher waits for the dead agent's lock byte to be released
//     (the process's files go a little after its threads), then reaps it.
//   - An agent whose process is gone but whose keep-alive byte is held
//     (shmlocks exec's command holds it) is an orphan: it is looked at
//     every coOwnerPoll and reaped once nothing keeps it alive.
//   - While the Manager has waiting requests, a full liveness pass runs
//     every reapFull as a safety net (an agent whose death word was never
//     set, a kernel without futex_waitv).
const (
	reapRefresh = 100 * time.Millisecond
	reapFull    = 1 * time.Second
	coOwnerPoll = 10 * time.Millisecond
	// deathLockWait bounds the wait for a dead agent's lock byte after its
	// sentinel died (longer: the full pass).
	deathLockWait = 200 * time.Millisecond
)

// Reaper is a Manager's death watcher.
type Reaper struct {
	t     *table.Table
	a     *table.Agent
	h     Host
	bell  *Bell
	kickc chan struct{}
	done  chan struct{}
	wg    sync.WaitGroup
	dw    *deathWatch

	mu      sync.Mutex
	orphans map[uint32]uint64 // agents alive through their keep-alive or co-owner group: index -> record word
	hinted  map[uint32]uint64 // agents whose sentinel died, being handled: index -> record word
}

// NewReaper starts the death watcher of agent a (whose doorbell is bell)
// in table t.
func NewReaper(t *table.Table, a *table.Agent, bell *Bell, h Host) *Reaper {
	r := &Reaper{t: t, a: a, h: h, bell: bell, kickc: make(chan struct{}, 1), done: make(chan struct{}),
		orphans: map[uint32]uint64{}, hinted: map[uint32]uint64{}}
	startDeathWatch(r) // sets r.dw
	r.wg.Add(1)
	go r.loop()
	return r
}

// Stale reports whether a park should kick the reaper: the watch is not
// armed (it is armed until a rebuild finds the Manager without waiters).
func (r *Reaper) Stale(int64) bool { return !r.dw.armed.Load() }

// Kick arms the watch and asks for a look at the orphans and a liveness
// pass (a request started waiting).
func (r *Reaper) Kick() {
	r.dw.arm()
	select {
	case r.kickc <- struct{}{}:
	default:
	}
}

// Stop ends the reaper and its threads.
func (r *Reaper) Stop() {
	close(r.done)
	r.dw.stop()
	r.wg.Wait()
}

func (r *Reaper) loop() {
	defer r.wg.Done()
	tick := time.NewTicker(reapRefresh)
	defer tick.Stop()
	var poll *time.Ticker // runs while there are orphans
	defer func() {
		if poll != nil {
			poll.Stop()
		}
	}()
	lastFull := time.Now()
	for {
		var pollC <-chan time.Time
		if poll != nil {
			pollC = poll.C
		}
		select {
		case <-r.done:
			return
		case <-r.kickc:
		case <-tick.C:
			// The clock that stamps this process's grants made at once
			// (table.RefreshClock) keeps within a tick of the time.
			table.RefreshClock()
		case <-pollC:
		}
		r.pollOrphans()
		r.mu.Lock()
		orphans := len(r.orphans)
		r.mu.Unlock()
		switch {
		case orphans > 0 && poll == nil:
			poll = time.NewTicker(coOwnerPoll)
		case orphans == 0 && poll != nil:
			poll.Stop()
			poll = nil
		}
		if r.h.Busy() && time.Since(lastFull) >= reapFull {
			lastFull = time.Now()
			r.h.ReapAll()
		}
	}
}

// hint handles the death of agent idx's sentinel thread, seen while its
// record held word: once its lock byte is free, it is reaped, or adopted
// as an orphan if something still keeps it alive.
func (r *Reaper) hint(idx uint32, word uint64) {
	r.mu.Lock()
	if w, ok := r.hinted[idx]; ok && w == word {
		r.mu.Unlock()
		return
	}
	r.hinted[idx] = word
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer func() {
			r.mu.Lock()
			if r.hinted[idx] == word {
				delete(r.hinted, idx)
			}
			r.mu.Unlock()
		}()
		if !r.h.Enter() {
			return
		}
		table.Guard(func() error {
			r.t.WaitLifeFree(idx, deathLockWait)
			return nil
		})
		r.h.Leave()
		r.exited(idx, word)
	}()
}

// exited reaps agent idx (record word word) if it is dead, and adopts it
// as an orphan if its process is gone but something keeps it alive.
func (r *Reaper) exited(idx uint32, word uint64) {
	if r.reapOrphan(idx, word) {
		return
	}
	if !r.h.Enter() {
		return
	}
	processGone := false
	table.Guard(func() error { processGone = r.t.AgentProcessDead(idx); return nil })
	r.h.Leave()
	if processGone {
		r.mu.Lock()
		r.orphans[idx] = word
		r.mu.Unlock()
		r.Kick() // start the poll
	}
}

// reapOrphan reaps agent idx if it is dead and reports whether its record
// no longer holds word.
func (r *Reaper) reapOrphan(idx uint32, word uint64) (gone bool) {
	r.h.ReapOne(idx)
	if !r.h.Enter() {
		return true
	}
	defer r.h.Leave()
	table.Guard(func() error { gone = r.t.AgentWord(idx) != word; return nil })
	return gone
}

// pollOrphans looks at every orphan and reaps those that are dead.
func (r *Reaper) pollOrphans() {
	r.mu.Lock()
	list := make(map[uint32]uint64, len(r.orphans))
	for idx, w := range r.orphans {
		list[idx] = w
	}
	r.mu.Unlock()
	for idx, w := range list {
		if r.reapOrphan(idx, w) {
			r.mu.Lock()
			if r.orphans[idx] == w {
				delete(r.orphans, idx)
			}
			r.mu.Unlock()
		}
	}
}

// handling reports whether the reaper is already handling agent idx.
func (r *Reaper) handling(idx uint32, word uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.orphans[idx]; ok && w == word {
		return true
	}
	w, ok := r.hinted[idx]
	return ok && w == word
}
