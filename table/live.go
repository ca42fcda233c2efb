package table

import (
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/shmlocks/shmlocks/futex"
	"github.com/shmlocks/shmlocks/shm"
)

// Liveness on the kernel's word (docs/design.md §6).
//
// Every agent holds an open-file-description (OFD) write lock on its own
// lock byte of the table file, LockBase + 2·index, through an open file of
// its own (Agent.lockF): the kernel drops it when the last reference to
// that open file goes, at the latest when the process exits, zombie or
// not, whatever PID, mount, network or user namespace it or its observer
// lives in, and whether /proc shows it or not. A record whose lock byte
// and keep-alive byte (LockBase + 2·index + 1, held by whatever the agent
// handed KeepAliveFile to: shmlocks exec's command) are both free names a
// dead agent. Nothing else is proof of death; the recorded PID, start time
// and boot id are hints for people and for the prompt death watcher.
//
// Registration takes both bytes of a free record first (a record whose
// bytes another open file holds is skipped), then claims the record by
// CAS, then drops the keep-alive byte: a claimed record's lock is held
// from its first instant, and a dead agent's record is never revived by a
// newcomer (its word is not 0, so nobody takes its bytes for it).
// Deregistration frees the record first and drops the lock after.
//
// A checker asks with F_OFD_GETLK through the table's probe descriptor,
// an open file that holds no agent lock (~1.6 µs). Where the kernel cannot
// answer (a file system without OFD locks, a closed table), the agent is
// taken for alive: doubt never reaps.
//
// Systems without OFD locks (other than Linux) judge by the PID, the start
// time and the boot id (ident_*.go), as formats before 8 did.

// LockBase is the offset of the first agent lock byte, beyond any table
// file's size (the locks are on byte ranges, not on data).
const LockBase = 1 << 40

func lifeByte(idx uint32) int64 { return LockBase + 2*int64(idx) }
func keepByte(idx uint32) int64 { return lifeByte(idx) + 1 }

// lockedBy reports whether another open file holds agent idx's lock byte
// (n = 1) or its lock or keep-alive byte (n = 2); known is false when the
// kernel could not tell.
func (t *Table) lockedBy(idx uint32, n int64) (locked, known bool) {
	fd := int(t.probe.Load())
	if !shm.HasOFDLocks || fd < 0 {
		return false, false
	}
	return shm.RangeLocked(fd, lifeByte(idx), n)
}

// byLocks reports whether liveness is judged by the lock bytes here (not
// by a test's liveness hook, nor on a system without OFD locks).
func byLocks() bool { return shm.HasOFDLocks && livenessHook.Load() == nil }

// openLockFile opens the table's file again: a new open file description,
// whose locks belong to it alone. It must be the file this Table maps.
func (t *Table) openLockFile() (*os.File, error) {
	if !byLocks() {
		return nil, nil // a test's liveness hook judges instead
	}
	f, err := shm.Reopen(t.path, t.fi)
	if err != nil {
		return nil, fmt.Errorf("table: open %s for an agent lock: %w", t.path, err)
	}
	return f, nil
}

// claimBytes takes agent idx's lock and keep-alive bytes through f: false
// if another open file holds either.
func claimBytes(f *os.File, idx uint32) bool {
	if f == nil {
		return true
	}
	ok, err := shm.LockRange(f, lifeByte(idx), 2)
	return ok && err == nil
}

// Abandon drops the agent's lock without deregistering, as the death of its
// process does: from now on the record names a dead agent, to be reaped by
// anyone. For tests and tools that simulate a crash.
func (a *Agent) Abandon() {
	if a.lockF != nil {
		a.lockF.Close()
		a.lockF = nil
	}
}

// KeepAliveFile returns an open file that keeps the agent alive for as long
// as any process holds it open, after this process is gone: it holds the
// agent's keep-alive byte. Pass it to a child process (exec.Cmd.ExtraFiles,
// as shmlocks exec does with its command) and close this process's copy:
// the agent, and everything it holds, then lives while this process or any
// process that inherited the descriptor (the child, its children) runs, as
// a lock of flock(1) does. ErrAgentGone if the agent is gone; an error if a
// keep-alive file of the agent is still open somewhere.
func (a *Agent) KeepAliveFile() (*os.File, error) {
	if !a.Valid() {
		return nil, ErrAgentGone
	}
	f, err := a.t.openLockFile()
	if err != nil || f == nil {
		return f, err
	}
	ok, err := shm.LockRange(f, keepByte(a.Idx), 1)
	if err != nil || !ok {
		f.Close()
		if err == nil {
			err = fmt.Errorf("table: agent %d: a keep-alive file of this agent is still open", a.Idx)
		}
		return nil, err
	}
	return f, nil
}

// DeathWord is the agent's death word (a futex word on the kernel's robust
// list of the agent's sentinel thread, see manager's death watcher).
func (a *Agent) DeathWord() *uint32 { return a.t.u32(a.t.agentOff(a.Idx) + agDeath) }

// DeathWord returns agent record idx's death word (nil out of range).
func (t *Table) DeathWord(idx uint32) *uint32 {
	if idx >= uint32(t.l.MaxAgents) {
		return nil
	}
	return t.u32(t.agentOff(idx) + agDeath)
}

// AgentsGen is the header word bumped (and woken) by every registration.
func (t *Table) AgentsGen() *uint32 { return t.u32(hdrAgentsGen) }

func (t *Table) bumpAgentsGen() {
	atomic.AddUint32(t.AgentsGen(), 1)
	futex.Wake(t.AgentsGen(), 1<<30)
}

// WaitLifeFree waits up to max for agent idx's lock byte to be released
// (a death watcher that heard the agent's sentinel thread die: the
// process's files and mapping go a little later) and reports whether it
// was. It polls, the first microseconds tightly.
func (t *Table) WaitLifeFree(idx uint32, max time.Duration) bool {
	if idx >= uint32(t.l.MaxAgents) {
		return false
	}
	deadline := time.Now().Add(max)
	sleep := 20 * time.Microsecond
	for {
		locked, known := t.lockedBy(idx, 1)
		if known && !locked {
			return true
		}
		if !known || time.Now().After(deadline) {
			return false
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, time.Millisecond)
	}
}

// samePidNS reports whether agent idx lives in this process's PID
// namespace (both known and equal).
func (t *Table) samePidNS(idx uint32) bool {
	ns := atomic.LoadUint64(t.u64(t.agentOff(idx) + agPidNS))
	return ns != 0 && ns == selfNS.pid
}

// SameNetNS reports whether agent idx lives in this process's network
// namespace (both known and equal): only then does its abstract-socket
// doorbell exist here.
func (t *Table) SameNetNS(idx uint32) bool {
	if idx >= uint32(t.l.MaxAgents) {
		return false
	}
	ns := atomic.LoadUint64(t.u64(t.agentOff(idx) + agNetNS))
	return ns != 0 && ns == selfNS.net
}

// pause sleeps a little, longer with each round (Open's replacement rounds).
func pause(round int) {
	time.Sleep(time.Duration(min(round+1, 20)) * 250 * time.Microsecond)
}

// XBell is the agent's cross-namespace bell word (see RingAcross).
func (a *Agent) XBell() *uint32 { return a.t.u32(a.t.agentOff(a.Idx) + agXBell) }

// RingAcross rings agent idx through the table itself: its cross-namespace
// bell word is bumped and futex-woken, which reaches the agent's sentinel
// thread in any network namespace (a shared futex is keyed by the file,
// not by a name).
func (t *Table) RingAcross(idx uint32) {
	if idx >= uint32(t.l.MaxAgents) {
		return
	}
	w := t.u32(t.agentOff(idx) + agXBell)
	atomic.AddUint32(w, 1)
	futex.Wake(w, 1)
}

// BumpAgentsGen tells the death watchers to look at the agents again (an
// agent's death word was just set).
func (t *Table) BumpAgentsGen() { t.bumpAgentsGen() }

// KeepAliveHeld reports whether a keep-alive file of the agent (see
// KeepAliveFile) is still open in some process: the kernel's word, through
// the probe descriptor.
func (a *Agent) KeepAliveHeld() bool {
	fd := int(a.t.probe.Load())
	if !shm.HasOFDLocks || fd < 0 {
		return false
	}
	locked, known := shm.RangeLocked(fd, keepByte(a.Idx), 1)
	return known && locked
}
