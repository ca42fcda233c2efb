//go:build linux

package table

import (
	"bufio"
	"fmt"
	"os/exec"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/proctest"
)

// gone waits (bounded) until pid no longer runs (a zombie nobody reaps
// counts as gone).
func gone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, _, exists := procStat(pid)
		if !exists || zombie(st) {
			return
		}
		require.True(t, time.Now().Before(deadline), "process %d still runs", pid)
		time.Sleep(time.Millisecond)
	}
}

// GroupAlive: while the leader runs; after it, while another member runs;
// a zombie does not count; a leader with another start time is a reused
// number (the old group is gone).
func TestGroupAlive(t *testing.T) {
	leader, member, closeLeader := proctest.Group(t)
	start := uint32(ProcessStart(leader))
	require.NotZero(t, start)
	require.True(t, GroupAlive(leader, start), "the leader runs")
	require.False(t, GroupAlive(leader, start+1), "another start time: not this group")
	require.True(t, GroupAlive(leader, 0), "start unknown: the leader counts")
	closeLeader()
	require.True(t, GroupAlive(leader, start), "the member runs")
	require.NoError(t, syscall.Kill(member, syscall.SIGKILL))
	gone(t, member)
	require.False(t, GroupAlive(leader, start), "every member gone (or a zombie)")
	for _, pgid := range []int{-1, 0, 1, maxCoPGID + 1} {
		require.False(t, GroupAlive(pgid, 0), "pgid %d", pgid)
	}
}

// An agent whose process is dead stays alive while its co-owner group
// runs: the reaper leaves its lock held; once the group is gone it is
// reaped and the lock goes to the waiter.
func TestCoOwnerKeepsAgentAlive(t *testing.T) {
	fake := installFakeLiveness(t)
	tb := newTestTable(t, smallGeometry)
	a, err := tb.Register(Identity{PID: 1001, Start: 7, Boot: selfIdentity.Boot}, 1)
	require.NoError(t, err)
	b, err := tb.Register(Identity{PID: 1002, Start: 7, Boot: selfIdentity.Boot}, 2)
	require.NoError(t, err)
	var w Wakes
	_, out, _, err := tb.Acquire(a, "x", Hash("x"), ModeExclusive, false, false, &w)
	require.NoError(t, err)
	require.Equal(t, Granted, out)
	_, out, _, err = tb.Acquire(b, "x", Hash("x"), ModeExclusive, false, false, &w)
	require.NoError(t, err)
	require.Equal(t, Queued, out)

	leader, member, closeLeader := proctest.Group(t)
	require.NoError(t, a.SetCoOwner(leader, ProcessStart(leader)))
	pg, err := tb.AgentCoOwner(a.Idx)
	require.NoError(t, err)
	require.Equal(t, leader, pg)

	fake.kill(1001)
	require.True(t, tb.AgentProcessDead(a.Idx))
	held := func() bool {
		h, _, err := tb.Snapshot(nil)
		require.NoError(t, err)
		for _, li := range h {
			if li.Agent == a.Idx {
				return true
			}
		}
		return false
	}
	for _, step := range []string{"leader runs", "member runs"} {
		require.False(t, tb.AgentDead(a.Idx), step)
		n, err := tb.ReapDead(b, &w)
		require.NoError(t, err)
		require.Zero(t, n, "%s: nothing to reap", step)
		require.True(t, held(), "%s: still held", step)
		ai := tb.Agents()[0]
		require.True(t, ai.Live(), step)
		closeLeader()
	}
	require.NoError(t, syscall.Kill(member, syscall.SIGKILL))
	gone(t, member)
	require.True(t, tb.AgentDead(a.Idx))
	n, err := tb.ReapDead(b, &w)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.False(t, held())
	require.NoError(t, tb.Check(b))
}

// A bucket latch left by a dead process is taken over even while its
// agent's co-owner group runs: only the process could release it.
func TestCoOwnerDoesNotKeepLatch(t *testing.T) {
	fake := installFakeLiveness(t)
	tb := newTestTable(t, smallGeometry)
	a, err := tb.Register(Identity{PID: 1001, Start: 7, Boot: selfIdentity.Boot}, 1)
	require.NoError(t, err)
	b, err := tb.Register(Identity{PID: 1002, Start: 7, Boot: selfIdentity.Boot}, 2)
	require.NoError(t, err)
	leader, _, _ := proctest.Group(t)
	require.NoError(t, a.SetCoOwner(leader, ProcessStart(leader)))
	fake.kill(1001)
	require.False(t, tb.AgentDead(a.Idx))
	require.True(t, tb.latchOwnerDead(b, a.Idx))
}

// The co-owner word is untrusted: a group id out of range is ErrCorrupt
// naming the field (Check, AgentCoOwner), and the agent is judged on its
// own process. Registration clears the word; SetCoOwner refuses bad ids.
func TestCoOwnerUntrusted(t *testing.T) {
	fake := installFakeLiveness(t)
	tb := newTestTable(t, smallGeometry)
	a, err := tb.Register(Identity{PID: 1001, Start: 7, Boot: selfIdentity.Boot}, 1)
	require.NoError(t, err)
	b, err := tb.Register(Identity{PID: 1002, Start: 7, Boot: selfIdentity.Boot}, 2)
	require.NoError(t, err)
	wp := tb.u64(tb.agentOff(a.Idx) + agCoOwner)
	for _, pgid := range []uint64{1, maxCoPGID + 1, 1<<32 - 1} {
		v := pgid<<32 | 5
		atomic.StoreUint64(wp, v)
		_, err := tb.AgentCoOwner(a.Idx)
		require.ErrorIs(t, err, ErrCorrupt)
		require.ErrorContains(t, err, "agent co-owner")
		require.ErrorContains(t, err, fmt.Sprintf("%#x", v))
		err = tb.Check(b)
		require.ErrorIs(t, err, ErrCorrupt)
		require.ErrorContains(t, err, "agent co-owner")
		require.Zero(t, tb.Agents()[0].CoOwner)
	}
	fake.kill(1001)
	require.True(t, tb.AgentDead(a.Idx), "a corrupt co-owner keeps nobody alive")

	for _, pgid := range []int{-5, 1, maxCoPGID + 1} {
		require.Error(t, b.SetCoOwner(pgid, 0), "pgid %d", pgid)
	}
	require.NoError(t, b.SetCoOwner(4242, 9))
	require.NoError(t, b.SetCoOwner(0, 0))
	pg, err := tb.AgentCoOwner(b.Idx)
	require.NoError(t, err)
	require.Zero(t, pg, "0 removes the co-owner")

	// Reaped, then the record reused: the new agent has no co-owner.
	atomic.StoreUint64(wp, maxCoPGID<<32|9) // valid, and above pid_max: no such group
	var w Wakes
	n, err := tb.ReapDead(b, &w)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	fake.mu.Lock()
	delete(fake.dead, 1001)
	fake.mu.Unlock()
	a2, err := tb.Register(Identity{PID: 1001, Start: 8, Boot: selfIdentity.Boot}, 3)
	require.NoError(t, err)
	require.Equal(t, a.Idx, a2.Idx, "the same record")
	pg, err = tb.AgentCoOwner(a2.Idx)
	require.NoError(t, err)
	require.Zero(t, pg)
	require.NoError(t, tb.Check(b))
}

// BenchmarkGroupAlive: the cost of one look at a co-owner group, while its
// leader runs, and after it (a kill(-pgid, 0) and a scan of /proc that
// stops at the first running member).
func BenchmarkGroupAlive(b *testing.B) {
	for _, leaderRuns := range []bool{true, false} {
		name := "leader"
		if !leaderRuns {
			name = "member"
		}
		b.Run(name, func(b *testing.B) {
			cmd := exec.Command("sh", "-c", "sleep 60 & echo $!; read x")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			in, _ := cmd.StdinPipe()
			out, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			bufio.NewReader(out).ReadString('\n')
			leader := cmd.Process.Pid
			start := uint32(ProcessStart(leader))
			defer func() { syscall.Kill(-leader, syscall.SIGKILL); in.Close(); cmd.Wait() }()
			if !leaderRuns {
				in.Close()
				cmd.Wait()
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if !GroupAlive(leader, start) {
					b.Fatal("group gone")
				}
			}
		})
	}
}
