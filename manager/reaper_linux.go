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

// The reaper, a Manager's death watcher: while the Manager has waiting
// requests it watches every other agent of the table through a pidfd: a pidfd becomes readable when its process exits
// (also as a zombie), and Go's netpoller waits on it without a thread, so a
// death is noticed within microseconds, without polling. The set of watched
// agents is refreshed when a request starts waiting and every reapRefresh;
// every reapFull a full liveness pass runs as a safety net (for agents whose
// pidfd could not be opened).
//
// An agent whose process is gone but whose co-owner group still runs
// (SetCoOwner) is not reaped: it becomes an orphan, watched through a pidfd
// on its group's leader and looked at every coOwnerPoll (the other members
// of a group have no pidfd to watch them all), and reaped once the last
// process of its group is gone.
const (
	reapRefresh = 100 * time.Millisecond
	reapFull    = 1 * time.Second
	coOwnerPoll = 10 * time.Millisecond
)

type reaper struct {
	m     *Manager
	kickc chan struct{}
	done  chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	files   map[uint32]*agentFD
	orphans map[uint32]*agentFD // agents kept alive by their co-owner group; f: pidfd of the group's leader, or nil

	refreshed atomic.Int64 // m.mono() when the last refresh started
}

// kickEvery: a park asks for a refresh only if none started for this long,
// or if it is its Manager's only parked request. An agent that registered
// since and is in the way is then watched by the next park after kickEvery
// or by the periodic refresh (reapRefresh): a refresh per park costs much
// of the CPU when many goroutines park in turn (docs/experiments.md).
const kickEvery = time.Millisecond

// stale reports whether no refresh started for kickEvery (now: m.mono()).
func (r *reaper) stale(now int64) bool { return now-r.refreshed.Load() > int64(kickEvery) }

// agentFD is the pidfd of one watched agent's process (or, for an orphan,
// of its group's leader), with the record word it was opened for.
type agentFD struct {
	word   uint64
	f      *os.File
	closed bool
}

func newReaper(m *Manager) *reaper {
	r := &reaper{m: m, kickc: make(chan struct{}, 1), done: make(chan struct{}), files: map[uint32]*agentFD{},
		orphans: map[uint32]*agentFD{}}
	r.wg.Add(1)
	go r.loop()
	return r
}

// kick asks for a refresh (a request started waiting).
func (r *reaper) kick() {
	select {
	case r.kickc <- struct{}{}:
	default:
	}
}

func (r *reaper) stop() {
	close(r.done)
	r.mu.Lock()
	for idx, f := range r.files {
		f.closed = true
		f.f.Close()
		delete(r.files, idx)
	}
	for idx := range r.orphans {
		r.dropOrphanLocked(idx)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *reaper) loop() {
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
		polling := false
		select {
		case <-r.done:
			return
		case <-r.kickc:
		case <-tick.C:
			// The clock that stamps this process's grants made at once
			// (table.RefreshClock) keeps within a tick of the time.
			table.RefreshClock()
		case <-pollC:
			polling = true
		}
		r.m.mu.Lock()
		n := r.m.nwait
		r.m.mu.Unlock()
		if n == 0 && !r.m.watching() {
			if poll != nil { // nobody waits: no need to look at orphans
				poll.Stop()
				poll = nil
			}
			continue
		}
		if polling {
			r.pollOrphans()
		}
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
		if polling {
			continue
		}
		if !r.m.enter() {
			return
		}
		// Guarded: a table file truncated under us must not SIGBUS the
		// process from this background loop (TestTruncatedUnderUsOperations).
		r.refreshed.Store(r.m.mono())
		if table.Guard(func() error { r.refresh(); return nil }) != nil {
			r.m.noteFault()
		}
		r.m.leave()
		if time.Since(lastFull) >= reapFull {
			lastFull = time.Now()
			r.m.reap()
		}
	}
}

// refresh opens a pidfd for every live agent not yet watched and closes the
// ones of agents that left.
func (r *reaper) refresh() {
	m := r.m
	seen := map[uint32]bool{}
	for _, ai := range m.t.Agents() {
		if ai.Index == m.a.Idx || ai.State != table.AgentAlive {
			continue
		}
		seen[ai.Index] = true
		word := ai.Word()
		r.mu.Lock()
		cur, orphan := r.files[ai.Index], r.orphans[ai.Index]
		r.mu.Unlock()
		if cur != nil && cur.word == word || orphan != nil && orphan.word == word {
			continue
		}
		r.forget(ai.Index)
		fd, err := unix.PidfdOpen(ai.PID, unix.PIDFD_NONBLOCK)
		if err != nil {
			// No such process (or no pidfd support: the full pass covers it).
			r.exited(ai.Index, word, false)
			continue
		}
		// The pidfd pins the process: if the record still names a live
		// process now, it names this one.
		if m.t.AgentProcessDead(ai.Index) {
			unix.Close(fd)
			r.exited(ai.Index, word, false)
			continue
		}
		f := os.NewFile(uintptr(fd), "pidfd")
		wf := &agentFD{word: word, f: f}
		r.mu.Lock()
		r.files[ai.Index] = wf
		r.mu.Unlock()
		r.wg.Add(1)
		go r.wait(ai.Index, wf)
	}
	r.mu.Lock()
	for idx, f := range r.files {
		if !seen[idx] {
			f.closed = true
			f.f.Close()
			delete(r.files, idx)
		}
	}
	for idx := range r.orphans {
		if !seen[idx] {
			r.dropOrphanLocked(idx)
		}
	}
	r.mu.Unlock()
}

func (r *reaper) forget(idx uint32) {
	r.mu.Lock()
	if f := r.files[idx]; f != nil {
		f.closed = true
		f.f.Close()
		delete(r.files, idx)
	}
	r.mu.Unlock()
}

// wait blocks (in the netpoller) until the watched process exits, then reaps it.
func (r *reaper) wait(idx uint32, wf *agentFD) {
	defer r.wg.Done()
	rc, err := wf.f.SyscallConn()
	if err != nil {
		return
	}
	err = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(fds, 0)
		return n > 0
	})
	r.mu.Lock()
	closed := wf.closed
	r.mu.Unlock()
	if err != nil || closed {
		return
	}
	r.exited(idx, wf.word, true)
	r.forget(idx)
}

// exited handles the exit of agent idx's process, seen while its record
// held word (pinned: a pidfd opened on that process reported it): without
// a co-owner the agent is reaped at once, with one it is reaped if its
// group is gone too, and otherwise becomes an orphan.
func (r *reaper) exited(idx uint32, word uint64, pinned bool) {
	m := r.m
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
		if !r.reapOrphan(idx, word) {
			r.adopt(idx, word, pgid)
		}
	}
}

// reapOrphan reaps agent idx if it is dead (its group included) and
// reports whether its record no longer holds word.
func (r *reaper) reapOrphan(idx uint32, word uint64) (gone bool) {
	m := r.m
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
func (r *reaper) adopt(idx uint32, word uint64, pgid int) {
	r.mu.Lock()
	if o := r.orphans[idx]; o != nil && o.word == word {
		r.mu.Unlock()
		return
	}
	r.dropOrphanLocked(idx)
	o := &agentFD{word: word}
	r.orphans[idx] = o
	r.mu.Unlock()
	fd, err := unix.PidfdOpen(pgid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return // the leader is gone: polling only
	}
	r.mu.Lock()
	if r.orphans[idx] != o {
		r.mu.Unlock()
		unix.Close(fd)
		return
	}
	o.f = os.NewFile(uintptr(fd), "pidfd")
	r.mu.Unlock()
	r.wg.Add(1)
	go r.waitLeader(idx, o)
	r.kick() // start the poll
}

// waitLeader blocks until orphan idx's group leader exits, then looks at
// the group at once.
func (r *reaper) waitLeader(idx uint32, o *agentFD) {
	defer r.wg.Done()
	if !waitPidfd(o.f) {
		return
	}
	r.mu.Lock()
	closed := o.closed
	r.mu.Unlock()
	if closed {
		return
	}
	if r.reapOrphan(idx, o.word) {
		r.mu.Lock()
		if r.orphans[idx] == o {
			r.dropOrphanLocked(idx)
		}
		r.mu.Unlock()
	}
}

// pollOrphans looks at every orphan's group and reaps those that are gone.
func (r *reaper) pollOrphans() {
	r.mu.Lock()
	list := make(map[uint32]*agentFD, len(r.orphans))
	for idx, o := range r.orphans {
		list[idx] = o
	}
	r.mu.Unlock()
	for idx, o := range list {
		if r.reapOrphan(idx, o.word) {
			r.mu.Lock()
			if r.orphans[idx] == o {
				r.dropOrphanLocked(idx)
			}
			r.mu.Unlock()
		}
	}
}

// dropOrphanLocked forgets orphan idx (r.mu held).
func (r *reaper) dropOrphanLocked(idx uint32) {
	if o := r.orphans[idx]; o != nil {
		o.closed = true
		if o.f != nil {
			o.f.Close()
		}
		delete(r.orphans, idx)
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
