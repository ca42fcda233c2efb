//go:build !linux || shmlocks_poll

package wake

import (
	"sync"
	"time"

	"github.com/shmlocks/shmlocks/table"
)

// The reaper, a Manager's death watcher. Without pidfds (or with the
// shmlocks_poll build tag) a Manager with waiting requests checks the
// liveness of every agent every reapPoll: a dead holder's waiters are
// granted within that interval.
const reapPoll = 5 * time.Millisecond

// Reaper is a Manager's death watcher (polling here).
type Reaper struct {
	h     Host
	kickc chan struct{}
	done  chan struct{}
	wg    sync.WaitGroup
}

// NewReaper starts the death watcher of agent a in table t.
func NewReaper(t *table.Table, a *table.Agent, bell *Bell, h Host) *Reaper {
	r := &Reaper{h: h, kickc: make(chan struct{}, 1), done: make(chan struct{})}
	r.wg.Add(1)
	go r.loop()
	return r
}

// Stale: the polling reaper's loop is cheap, every park may kick it.
func (r *Reaper) Stale(int64) bool { return true }

// Kick asks for a look now (a request started waiting).
func (r *Reaper) Kick() {
	select {
	case r.kickc <- struct{}{}:
	default:
	}
}

// Stop ends the reaper.
func (r *Reaper) Stop() {
	close(r.done)
	r.wg.Wait()
}

func (r *Reaper) loop() {
	defer r.wg.Done()
	tick := time.NewTicker(reapPoll)
	defer tick.Stop()
	for {
		select {
		case <-r.done:
			return
		case <-r.kickc:
		case <-tick.C:
			// The clock that stamps this process's grants made at once
			// (table.RefreshClock) keeps within a tick of the time.
			table.RefreshClock()
		}
		if r.h.Busy() {
			r.h.ReapAll()
		}
	}
}
