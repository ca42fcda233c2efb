//go:build !linux || shmlocks_poll

package manager

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

type reaper struct {
	m     *Manager
	kickc chan struct{}
	done  chan struct{}
	wg    sync.WaitGroup
}

func newReaper(m *Manager) *reaper {
	r := &reaper{m: m, kickc: make(chan struct{}, 1), done: make(chan struct{})}
	r.wg.Add(1)
	go r.loop()
	return r
}

// stale: the polling reaper's loop is cheap, every park may kick it.
func (r *reaper) stale(int64) bool { return true }

func (r *reaper) kick() {
	select {
	case r.kickc <- struct{}{}:
	default:
	}
}

func (r *reaper) stop() {
	close(r.done)
	r.wg.Wait()
}

func (r *reaper) loop() {
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
		r.m.mu.Lock()
		n := r.m.nwait
		r.m.mu.Unlock()
		if n > 0 || r.m.watching() {
			r.m.reap()
		}
	}
}
