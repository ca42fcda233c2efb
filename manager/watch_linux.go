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
//
// An agent whose process is gone but whose co-owner group still runs
// (SetCoOwner) is not reaped: it becomes an orphan, watched through a pidfd
// on its group's leader and looked at every coOwnerPoll (the other members
// of a group have no pidfd to watch them all), and reaped once the last
// process of its group is gone.
const (
	watchRefresh = 100 * time.Millisecond
	watchFull    = 1 * time.Second
	coOwnerPoll  = 10 * time.Millisecond
)

type watcher struct {
	m     *Manager
	kickc chan struct{}
	done  chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	files   map[uint32]*watched
	orphans map[uint32]*watched // agents kept alive by their co-owner group; f: pidfd of the group's leader, or nil

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
	w := &watcher{m: m, kickc: make(chan struct{}, 1), done: make(chan struct{}), files: map[uint32]*watched{},
		orphans: map[uint32]*watched{}}
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
	for idx := range w.orphans {
		w.dropOrphanLocked(idx)
	}
	w.mu.Unlock()
	w.wg.Wait()
}

func (w *watcher) loop() {
	defer w.wg.Done()
	tick := time.NewTicker(watchRefresh)
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
		polling := false
		select {
		case <-w.done:
			return
		case <-w.kickc:
		case <-tick.C:
			// The clock that stamps this process's grants made at once
			// (table.RefreshClock) keeps within a tick of the time.
			table.RefreshClock()
		case <-pollC:
			polling = true
		}
		w.m.mu.Lock()
		n := w.m.nwait
		w.m.mu.Unlock()
		if n == 0 && !w.m.watching() {
			if poll != nil { // nobody waits: no need to look at orphans
				poll.Stop()
				poll = nil
			}
			continue
		}
		if polling {
			w.pollOrphans()
		}
		w.mu.Lock()
		orphans := len(w.orphans)
		w.mu.Unlock()
		switch {
		case orphans > 0 && poll == nil:
			poll = time.NewTicker(coOwnerPoll)
		case orphans == 0 && poll != nil:
			poll.Stop()
			poll = nil
		}
		if polling {
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
		cur, orphan := w.files[ai.Index], w.orphans[ai.Index]
		w.mu.Unlock()
		if cur != nil && cur.word == word || orphan != nil && orphan.word == word {
			continue
		}
		w.unwatch(ai.Index)
		fd, err := unix.PidfdOpen(ai.PID, unix.PIDFD_NONBLOCK)
		if err != nil {
			// No such process (or no pidfd support: the full pass covers it).
			w.exited(ai.Index, word, false)
			continue
		}
		// The pidfd pins the process: if the record still names a live
		// process now, it names this one.
		if m.t.AgentProcessDead(ai.Index) {
			unix.Close(fd)
			w.exited(ai.Index, word, false)
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
	for idx := range w.orphans {
		if !seen[idx] {
			w.dropOrphanLocked(idx)
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
	w.exited(idx, wf.word, true)
	w.unwatch(idx)
}

// exited handles the exit of agent idx's process, seen while its record
// held word (pinned: a pidfd opened on that process reported it): without
// a co-owner the agent is reaped at once, with one it is reaped if its
// group is gone too, and otherwise becomes an orphan.
func (w *watcher) exited(idx uint32, word uint64, pinned bool) {
	m := w.m
	if !m.enter() {
		return
	}
	var pgid int
	table.Guard(func() error {
		var err error
		if m.t.AgentWord(idx) == word {
			pgid, err = m.t.AgentCoOwner(idx)
			m.noteErr("co-owner", err)
		}
		return nil
	})
	m.leave()
	switch {
	case pgid == 0 && pinned:
		m.reapExited(idx, word)
	case pgid == 0:
		m.reapOne(idx)
	default:
		if !w.reapOrphan(idx, word) {
			w.adopt(idx, word, pgid)
		}
	}
}

// reapOrphan reaps agent idx if it is dead (its group included) and
// reports whether its record no longer holds word.
func (w *watcher) reapOrphan(idx uint32, word uint64) (gone bool) {
	m := w.m
	m.reapOne(idx)
	if !m.enter() {
		return true
	}
	defer m.leave()
	table.Guard(func() error { gone = m.t.AgentWord(idx) != word; return nil })
	return gone
}

// adopt makes agent idx (record word, co-owner group pgid) an orphan: its
// group's leader is watched through a pidfd, if it still runs, and the
// group is polled every coOwnerPoll by the loop.
func (w *watcher) adopt(idx uint32, word uint64, pgid int) {
	w.mu.Lock()
	if o := w.orphans[idx]; o != nil && o.word == word {
		w.mu.Unlock()
		return
	}
	w.dropOrphanLocked(idx)
	o := &watched{word: word}
	w.orphans[idx] = o
	w.mu.Unlock()
	fd, err := unix.PidfdOpen(pgid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return // the leader is gone: polling only
	}
	w.mu.Lock()
	if w.orphans[idx] != o {
		w.mu.Unlock()
		unix.Close(fd)
		return
	}
	o.f = os.NewFile(uintptr(fd), "pidfd")
	w.mu.Unlock()
	w.wg.Add(1)
	go w.waitLeader(idx, o)
	w.kick() // start the poll
}

// waitLeader blocks until orphan idx's group leader exits, then looks at
// the group at once.
func (w *watcher) waitLeader(idx uint32, o *watched) {
	defer w.wg.Done()
	if !waitPidfd(o.f) {
		return
	}
	w.mu.Lock()
	closed := o.closed
	w.mu.Unlock()
	if closed {
		return
	}
	if w.reapOrphan(idx, o.word) {
		w.mu.Lock()
		if w.orphans[idx] == o {
			w.dropOrphanLocked(idx)
		}
		w.mu.Unlock()
	}
}

// pollOrphans looks at every orphan's group and reaps those that are gone.
func (w *watcher) pollOrphans() {
	w.mu.Lock()
	list := make(map[uint32]*watched, len(w.orphans))
	for idx, o := range w.orphans {
		list[idx] = o
	}
	w.mu.Unlock()
	for idx, o := range list {
		if w.reapOrphan(idx, o.word) {
			w.mu.Lock()
			if w.orphans[idx] == o {
				w.dropOrphanLocked(idx)
			}
			w.mu.Unlock()
		}
	}
}

// dropOrphanLocked forgets orphan idx (w.mu held).
func (w *watcher) dropOrphanLocked(idx uint32) {
	if o := w.orphans[idx]; o != nil {
		o.closed = true
		if o.f != nil {
			o.f.Close()
		}
		delete(w.orphans, idx)
	}
}

// waitPidfd blocks (in the netpoller) until the pidfd f reports its
// process exited; false if f was closed first.
func waitPidfd(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	err = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(fds, 0)
		return n > 0
	})
	return err == nil
}
