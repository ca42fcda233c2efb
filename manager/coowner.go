package manager

import (
	"fmt"

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
	if m.t == nil && m.be == nil {
		return errNeverOpened
	}
	if m.be != nil {
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
	err := table.Guard(func() error { return m.a.SetCoOwner(pgid, start) })
	if err != nil {
		return fmt.Errorf("co-owner process group %d: %w", pgid, err)
	}
	return nil
}
