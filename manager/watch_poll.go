//go:build !linux || shmlocks_poll

package manager

import (
	"sync"
	"time"

	"github.com/shmlocks/shmlocks/table"
)

// Without pidfds (or with the shmlocks_poll build tag) a Manager with
// waiting requests checks the liveness of every agent every watchPoll: a
// dead holder's waiters are granted within that interval.
const watchPoll = 5 * time.Millisecond

type watcher struct {
	m     *Manager
	kickc chan struct{}
	done  chan struct{}
	wg    sync.WaitGroup
}

func newWatcher(m *Manager) *watcher {
	w := &watcher{m: m, kickc: make(chan struct{}, 1), done: make(chan struct{})}
	w.wg.Add(1)
	go w.loop()
	return w
}

// stale: the polling watcher's loop is cheap, every park may kick it.
func (w *watcher) stale(int64) bool { return true }

func (w *watcher) kick() {
	select {
	case w.kickc <- struct{}{}:
	default:
	}
}

func (w *watcher) stop() {
	close(w.done)
	w.wg.Wait()
}

func (w *watcher) loop() {
	defer w.wg.Done()
	tick := time.NewTicker(watchPoll)
	defer tick.Stop()
	for {
		select {
		case <-w.done:
			return
		case <-w.kickc:
		case <-tick.C:
			// The clock that stamps this process's grants made at once
			// (table.RefreshClock) keeps within a tick of the time.
			table.RefreshClock()
		}
		w.m.mu.Lock()
		n := w.m.nwait
		w.m.mu.Unlock()
		if n > 0 || w.m.watching() {
			w.m.reap()
		}
	}
}
