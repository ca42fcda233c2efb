package manager_test

import (
	"context"
	"encoding/binary"
	"github.com/shmlocks/shmlocks/futex"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/table"

	. "github.com/shmlocks/shmlocks/manager"
)

// deadGone asserts that nothing of pid remains: no held or pending request,
// no agent record; and that the checker passes.
func deadGone(t *testing.T, m *Manager, pid int) {
	t.Helper()
	snap, err := m.Query(context.Background())
	require.NoError(t, err)
	for _, li := range append(snap.Held, snap.Pending...) {
		require.NotEqual(t, pid, li.PID, "request of dead process %d still in the table: %+v", pid, li)
	}
	for _, ai := range m.Table().Agents() {
		require.NotEqual(t, pid, ai.PID, "agent record of dead process %d still in the table", pid)
	}
	check(t, m)
}

// A process dies holding locks and waiting for one, in each way a process
// can die; a waiter in another process is granted promptly and nothing of
// the dead process remains. The zombie case does not wait for the child
// before expecting the grant: a zombie counts as dead.
func TestReapDeadHolder(t *testing.T) {
	for _, how := range []string{"sigkill", "zombie", "exit", "panic"} {
		t.Run(how, func(t *testing.T) {
			path := tablePath(t)
			m := openM(t, path, nil)
			q := spawn(t, path, nil)
			q.Send("acquire x")
			tq := tokenOf(q.Expect("acquired x"))
			q.Send("acquire y shared")
			q.Expect("acquired y")
			m2 := openM(t, path, nil)
			ly, err := m2.Acquire(context.Background(), "z", RequestOptions{})
			require.NoError(t, err)
			q.Send("acquire z")
			waitPending(t, m, "z", 1)
			ctx := ctxT(t, eventually)
			wx := acquireAsync(ctx, m, "x", RequestOptions{})
			wy := acquireAsync(ctx, m, "y", RequestOptions{})
			waitPending(t, m, "x", 1)
			mustBlock(t, wx, "x held by the live child")
			start := time.Now()
			switch how {
			case "sigkill":
				q.Kill()
			case "zombie":
				q.Cmd.Process.Kill() // not waited for until cleanup: a zombie
			case "exit":
				q.Send("exit")
			case "panic":
				q.Send("panic")
			}
			lx := mustGrant(t, wx, "waiter after the holder died")
			t.Logf("%s: waiter granted %v after the kill", how, time.Since(start))
			require.Greater(t, lx.Token(), tq)
			mustGrant(t, wy, "second name").Release()
			deadGone(t, m, q.Pid)
			require.NoError(t, lx.Release())
			require.NoError(t, ly.Release())
			check(t, m)
		})
	}
}

// Hard case 4, on the kernel's word: an agent record whose lock byte is
// free is dead, whatever PID it names: a live, unrelated process's PID with
// another start time, or even with the right one. A record whose lock is
// held is alive, whatever its PID says.
func TestPIDReuseIsDead(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	ppid := os.Getppid()
	self := table.Self()
	for _, start := range []uint64{table.ProcessStart(ppid) + 12345, table.ProcessStart(ppid)} {
		forged, err := m.Table().Register(table.Identity{PID: ppid, Start: start, Boot: self.Boot}, 77)
		require.NoError(t, err)
		var w table.Wakes
		_, out, _, err := m.Table().Acquire(forged, "p", table.Hash("p"), 0, false, false, &w)
		require.NoError(t, err)
		require.Equal(t, table.Granted, out)
		forged.Abandon() // its process "died": the kernel dropped its lock
		l := mustGrant(t, acquireAsync(ctxT(t, eventually), m, "p", RequestOptions{}), "lock of a dead agent naming a live PID")
		require.NoError(t, l.Release())
		deadGone(t, m, ppid)
	}

	// A record naming a PID that does not exist, whose lock is held, is
	// alive and keeps its lock.
	real, err := m.Table().Register(table.Identity{PID: 1 << 22, Start: 1, Boot: self.Boot}, 78)
	require.NoError(t, err)
	var w table.Wakes
	_, out, _, err := m.Table().Acquire(real, "p", table.Hash("p"), 0, false, false, &w)
	require.NoError(t, err)
	require.Equal(t, table.Granted, out)
	mustBlock(t, acquireAsync(ctxT(t, eventually), m, "p", RequestOptions{}), "lock of a live agent")
	var w2 table.Wakes
	require.NoError(t, m.Table().Deregister(real, &w2))
	m.Table().Deliver(&w2, nil)
}

// Hard case 5: a table file whose boot id differs from the running kernel's
// is reset on Open: its agents are gone, and tokens continue.
func TestStaleBootResetsAgents(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	other := table.Identity{PID: os.Getpid(), Start: table.Self().Start, Boot: 0x5eed} // this very PID, another boot
	old, err := m.Table().Register(other, 99)
	require.NoError(t, err)
	var w table.Wakes
	_, out, tok, err := m.Table().Acquire(old, "b", table.Hash("b"), 0, false, false, &w)
	require.NoError(t, err)
	require.Equal(t, table.Granted, out)
	old.Abandon() // a reboot ends every process, and with it every lock
	require.NoError(t, m.Close())
	// Pretend the file outlived a reboot: another boot id in the header.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	var id [16]byte
	binary.NativeEndian.PutUint64(id[:], 0xdeadbeef)
	_, err = f.WriteAt(id[:], 128)
	require.NoError(t, err)
	f.Close()
	m2 := openM(t, path, nil)
	require.False(t, m2.Table().StaleBoot(), "Open records the running kernel's boot id")
	require.Len(t, m2.Table().Agents(), 1, "only the new agent remains")
	l, err := m2.Acquire(context.Background(), "b", RequestOptions{IfAvailable: true})
	require.NoError(t, err)
	require.Greater(t, l.Token(), tok, "tokens continue across the reset")
	require.NoError(t, l.Release())
	check(t, m2)
}

// A death word is a hint, never proof: a watcher told that an agent's
// sentinel thread died (the word marked owner-died and woken, as the kernel
// does) while the agent's lock byte is still held (a forked child kept it,
// a forged word) reaps nothing; the agent keeps its lock.
func TestDeathHintIsNoProof(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	m2 := openM(t, path, nil)
	l, err := m2.Acquire(ctxT(t, eventually), "k", RequestOptions{})
	require.NoError(t, err)
	w := acquireAsync(ctxT(t, eventually), m, "k", RequestOptions{})
	waitPending(t, m, "k", 1)
	dw := m2.Agent().DeathWord()
	atomic.OrUint32(dw, 1<<30)
	futex.Wake(dw, 1<<30)
	mustBlock(t, w, "a death word says nothing while the lock byte is held")
	require.NoError(t, l.Release())
	mustGrant(t, w, "after the release").Release()
	check(t, m)
}
