//go:build linux && !shmlocks_poll

package manager

import (
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shmlocks/shmlocks/table"
)

// While a Manager has waiting requests it watches every other agent of the
// table through a pidfd: a pidfd becomes readable when its process exits
// (also as a zombie), and Go's netpoller waits on it without a thread, so a
// death is noticed within microseconds, without polling. The set of watched
// agents is refreshed when a request starts waiting and every watchRefresh;
// every watchFull a full liveness pass runs as a safety net (for agents whose
// pidfd could not be opened).
const (
	watchRefresh = 100 * time.Millisecond
	watchFull    = 1 * time.Second
)

type watcher struct {
	m     *Manager
	kickc chan struct{}
	done  chan struct{}
	wg    sync.WaitGroup

	mu    sync.Mutex
	files map[uint32]*watched

	refreshed atomic.Int64 // m.mono() when the last refresh started
}

// kickEvery: a park asks for a refresh only if none started for this long,
// or if it is its Manager's only parked request. An agent that registered
// since and is in the way is then watched by the next park after kickEvery
// or by the periodic refresh (watchRefresh); before, every park kicked a
// refresh, which cost 18% of the CPU with 64 goroutines parking in turn.
const kickEvery = time.Millisecond

// stale reports whether no refresh started for kickEvery (now: m.mono()).
func (w *watcher) stale(now int64) bool { return now-w.refreshed.Load() > int64(kickEvery) }

type watched struct {
	word   uint64
	f      *os.File
	closed bool
}

func newWatcher(m *Manager) *watcher {
	w := &watcher{m: m, kickc: make(chan struct{}, 1), done: make(chan struct{}), files: map[uint32]*watched{}}
	w.wg.Add(1)
	go w.loop()
	return w
}

// kick asks for a refresh (a request started waiting).
func (w *watcher) kick() {
	select {
	case w.kickc <- struct{}{}:
	default:
	}
}

func (w *watcher) stop() {
	close(w.done)
	w.mu.Lock()
	for idx, f := range w.files {
		f.closed = true
		f.f.Close()
		delete(w.files, idx)
	}
	w.mu.Unlock()
	w.wg.Wait()
}

func (w *watcher) loop() {
	defer w.wg.Done()
	tick := time.NewTicker(watchRefresh)
	defer tick.Stop()
	lastFull := time.Now()
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
		if n == 0 && !w.m.watching() {
			continue
		}
		if !w.m.enter() {
			return
		}
		// Guarded: a table file truncated under us must not SIGBUS the
		// process from this background loop (TestTruncatedUnderUsOperations).
		w.refreshed.Store(w.m.mono())
		if table.Guard(func() error { w.refresh(); return nil }) != nil {
			w.m.noteFault()
		}
		w.m.leave()
		if time.Since(lastFull) >= watchFull {
			lastFull = time.Now()
			w.m.reap()
		}
	}
}

// refresh opens a pidfd for every live agent not yet watched and closes the
// ones of agents that left.
func (w *watcher) refresh() {
	m := w.m
	seen := map[uint32]bool{}
	for _, ai := range m.t.Agents() {
		if ai.Index == m.a.Idx || ai.State != table.AgentAlive {
			continue
		}
		seen[ai.Index] = true
		word := ai.Word()
		w.mu.Lock()
		cur := w.files[ai.Index]
		w.mu.Unlock()
		if cur != nil && cur.word == word {
			continue
		}
		w.unwatch(ai.Index)
		fd, err := unix.PidfdOpen(ai.PID, unix.PIDFD_NONBLOCK)
		if err != nil {
			m.reapOne(ai.Index) // no such process (or no pidfd support: the full pass covers it)
			continue
		}
		// The pidfd pins the process: if the record still names a live
		// process now, it names this one.
		if m.t.AgentDead(ai.Index) {
			unix.Close(fd)
			m.reapOne(ai.Index)
			continue
		}
		f := os.NewFile(uintptr(fd), "pidfd")
		wf := &watched{word: word, f: f}
		w.mu.Lock()
		w.files[ai.Index] = wf
		w.mu.Unlock()
		w.wg.Add(1)
		go w.wait(ai.Index, wf)
	}
	w.mu.Lock()
	for idx, f := range w.files {
		if !seen[idx] {
			f.closed = true
			f.f.Close()
			delete(w.files, idx)
		}
	}
	w.mu.Unlock()
}

func (w *watcher) unwatch(idx uint32) {
	w.mu.Lock()
	if f := w.files[idx]; f != nil {
		f.closed = true
		f.f.Close()
		delete(w.files, idx)
	}
	w.mu.Unlock()
}

// wait blocks (in the netpoller) until the watched process exits, then reaps it.
func (w *watcher) wait(idx uint32, wf *watched) {
	defer w.wg.Done()
	rc, err := wf.f.SyscallConn()
	if err != nil {
		return
	}
	err = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(fds, 0)
		return n > 0
	})
	w.mu.Lock()
	closed := wf.closed
	w.mu.Unlock()
	if err != nil || closed {
		return
	}
	w.m.reapExited(idx, wf.word)
	w.unwatch(idx)
}
