//go:build linux

package manager_test

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/proctest"

	. "github.com/shmlocks/shmlocks/manager"
)

// An agent whose process was SIGKILLed keeps its lock while its co-owner
// group runs, leader or not; the waiter's Manager grants it as soon as the
// last process of the group is gone.
//
//	C: acquire x; coowner G.   P: SIGKILL C.
//	W: acquire x (queues; quiet).   P: G's leader exits; W still quiet.
//	P: SIGKILL G's last member.   W: acquired x.
func TestCoOwnerKeepsLockAfterDeath(t *testing.T) {
	path := tablePath(t)
	p := openM(t, path, smallTable)
	leader, member, endLeader := proctest.Group(t)
	c := spawn(t, path, smallTable)
	c.Send("acquire x")
	c.Expect("acquired x")
	c.Send("coowner %d", leader)
	c.Expect("coowned")
	c.Kill()

	w := spawn(t, path, smallTable)
	w.Send("acquire x")
	w.Quiet("acquired", quietPeriod)
	snap, err := p.Query(ctxT(t, eventually))
	require.NoError(t, err)
	require.Len(t, snap.Held, 1)
	require.Equal(t, c.Pid, snap.Held[0].PID, "held by the dead agent, kept by its group")

	endLeader()
	w.Quiet("acquired", quietPeriod)
	require.NoError(t, syscall.Kill(member, syscall.SIGKILL))
	w.Expect("acquired x")
	require.NoError(t, p.Check())
}

// SetCoOwner refuses what is not a running group leader.
func TestSetCoOwnerValidates(t *testing.T) {
	m := openM(t, tablePath(t), smallTable)
	leader, member, _ := proctest.Group(t)
	require.NoError(t, m.SetCoOwner(leader))
	require.NoError(t, m.SetCoOwner(0))
	for _, pgid := range []int{-1, 1, member, 1 << 22} {
		require.ErrorIs(t, m.SetCoOwner(pgid), ErrNotSupported, "pgid %d", pgid)
	}
	m.Close()
	require.ErrorIs(t, m.SetCoOwner(leader), ErrClosed)
}
