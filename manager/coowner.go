package manager

import (
	"fmt"
	"os"

	"github.com/shmlocks/shmlocks/shm"
	"github.com/shmlocks/shmlocks/table"
)

// SetCoOwner makes process group pgid a co-owner of the Manager's agent:
// if this process dies (SIGKILL included) while a process of the group
// still runs, the Manager's locks stay held and its requests stay queued;
// once the last process of the group is gone they are reaped as after any
// death (a waiter's Manager notices within milliseconds: a pidfd on the
// group's leader, then a poll of the group every coOwnerPoll). pgid must
// name a group whose leader runs (its pid is pgid); its start time is
// recorded, so that a later group reusing the number is not taken for it.
// pgid 0 removes the co-owner.
//
// shmlocks exec makes the command's process group the co-owner of its
// agent, so that the lock lives exactly as long as the command and the
// processes it started in its group (docs/cli.md). A process that leaves
// the group (setsid, setpgid) no longer keeps the lock.
func (m *Manager) SetCoOwner(pgid int) error {
	if m.life.t == nil && m.life.be == nil {
		return errNeverOpened
	}
	if m.life.be != nil {
		return fmt.Errorf("co-owner process group %d: %w by this backend", pgid, ErrNotSupported)
	}
	var start uint64
	if pgid != 0 {
		if err := groupLeader(pgid); err != nil {
			return fmt.Errorf("co-owner process group %d: %w", pgid, err)
		}
		start = table.ProcessStart(pgid)
	}
	if !m.enter() {
		return ErrClosed
	}
	defer m.leave()
	err := table.Guard(func() error { return m.life.a.SetCoOwner(pgid, start) })
	if err != nil {
		return fmt.Errorf("co-owner process group %d: %w", pgid, err)
	}
	return nil
}

// KeepAliveFile returns an open file that keeps the Manager's agent, and
// so its locks and queued requests, alive for as long as any process holds
// it open, after this process is gone: pass it to a child process
// (exec.Cmd.ExtraFiles) and close this process's copy. The agent then
// lives while this process or any process that inherited the descriptor
// runs (the child and, unless they close it, its children), in any PID
// namespace: the kernel's word, as a lock of flock(1) held through an
// inherited descriptor. shmlocks exec hands one to its command. Linux
// only (elsewhere ErrNotSupported); one at a time per Manager.
func (m *Manager) KeepAliveFile() (*os.File, error) {
	if m.life.t == nil && m.life.be == nil {
		return nil, errNeverOpened
	}
	if m.life.be != nil || !shm.HasOFDLocks {
		return nil, fmt.Errorf("keep-alive file: %w here", ErrNotSupported)
	}
	if !m.enter() {
		return nil, ErrClosed
	}
	defer m.leave()
	var f *os.File
	err := table.Guard(func() (err error) { f, err = m.life.a.KeepAliveFile(); return err })
	if err != nil {
		return nil, fmt.Errorf("keep-alive file: %w", err)
	}
	return f, nil
}

// KeepAliveHeld reports whether a keep-alive file of the Manager's agent
// (KeepAliveFile) is still open in some process, this one included: the
// agent would then outlive this process.
func (m *Manager) KeepAliveHeld() bool {
	if m.life.t == nil || m.life.be != nil || !m.enter() {
		return false
	}
	defer m.leave()
	held := false
	table.Guard(func() error { held = m.life.a.KeepAliveHeld(); return nil })
	return held
}
