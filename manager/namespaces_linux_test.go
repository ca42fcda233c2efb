//go:build linux

package manager_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/shmlocks/shmlocks/internal/proctest"
	. "github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/table"
)

// Processes in other namespaces (containers sharing the table's directory,
// sandboxes without /proc): one holder at a time, and a dead one reaped as
// promptly as at home. The children run in new PID, network and mount
// namespaces made by the kernel for this test (CLONE_NEW*: root, as CI
// runs); where the kernel refuses, the test skips and says why.

// hideProc detaches /proc from this process's mount namespace (which must
// be its own: CLONE_NEWNS), after making every mount private so that
// nothing propagates back to the parent's namespace.
func hideProc() error {
	if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	if err := unix.Unmount("/proc", unix.MNT_DETACH); err != nil {
		return err
	}
	if _, err := os.Stat("/proc/self"); err == nil {
		return errors.New("/proc is still there")
	}
	return nil
}

type nsKind int

const (
	nsHost   nsKind = iota
	nsPID           // a new PID namespace
	nsPIDNet        // new PID and network namespaces (another container)
	nsNoProc        // a new mount namespace without /proc
)

func (k nsKind) String() string {
	return [...]string{"host", "pid-namespace", "pid+net-namespace", "no-proc"}[k]
}

// spawnIn starts an agent child in namespace kind k.
func spawnIn(t *testing.T, path string, k nsKind) *child {
	t.Helper()
	if k == nsHost {
		return spawn(t, path, nil)
	}
	cmd := proctest.CommandWith(proctest.Options{Within: eventually}, "agent", path, "", "")
	switch k {
	case nsPID:
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	case nsPIDNet:
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNET}
	case nsNoProc:
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
		cmd.Env = append(cmd.Env, noProcEnv+"=1")
	}
	requireNamespaces(t, cmd.SysProcAttr.Cloneflags)
	c := &child{Child: proctest.Start(t, cmd, proctest.Options{Within: eventually}), t: t}
	c.ready()
	return c
}

// requireNamespaces skips the test where this process may not create
// namespaces of the given kinds (not root, a sandbox forbidding it).
func requireNamespaces(t *testing.T, flags uintptr) {
	t.Helper()
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot create namespaces %#x here (%v): run as root to test containers", flags, err)
	}
}

// One holder at a time whatever namespace the holder and the contender
// live in: on main ee19971 each of these contenders was granted the name a
// live process held, and the holder lost it.
func TestNamespacesOneHolder(t *testing.T) {
	for _, c := range []struct{ holder, contender nsKind }{
		{nsPID, nsHost}, {nsHost, nsPID}, {nsPID, nsPID}, {nsHost, nsNoProc}, {nsNoProc, nsHost},
		{nsPIDNet, nsPIDNet},
	} {
		t.Run(c.holder.String()+"/"+c.contender.String(), func(t *testing.T) {
			path := tablePath(t)
			h := spawnIn(t, path, c.holder)
			h.Send("acquire x")
			h.Expect("acquired x")
			o := spawnIn(t, path, c.contender)
			o.Send("acquire x ifavailable")
			o.Expect("notavailable x")
			// and the holder still holds it: a host Manager is refused too
			m := openM(t, path, nil)
			_, err := m.Acquire(ctxT(t, eventually), "x", RequestOptions{IfAvailable: true})
			require.ErrorIs(t, err, ErrNotAvailable)
			h.Send("release x")
			h.Expect("released x")
			o.Send("acquire x ifavailable")
			o.Expect("acquired x")
			check(t, m)
		})
	}
}

// A holder SIGKILLed in another PID namespace (or without /proc) is
// reaped, and its waiter granted, as promptly as one at home: the death
// watch is the kernel's robust futex list, the proof the lock byte.
func TestNamespacesKilledHolderReaped(t *testing.T) {
	for _, k := range []nsKind{nsHost, nsPID, nsPIDNet, nsNoProc} {
		t.Run(k.String(), func(t *testing.T) {
			path := tablePath(t)
			h := spawnIn(t, path, k)
			h.Send("acquire x")
			tok := tokenOf(h.Expect("acquired x"))
			w := spawnIn(t, path, nsHost)
			w.Send("acquire x")
			m := openM(t, path, nil)
			waitPending(t, m, "x", 1)
			start := time.Now()
			h.Kill()
			got := tokenOf(w.Expect("acquired x"))
			t.Logf("%s: waiter granted %v after the SIGKILL", k, time.Since(start))
			require.Greater(t, got, tok)
			check(t, m)
		})
	}
}

// A release in one network namespace wakes a waiter parked in another
// (whose abstract doorbell does not exist here) through the table, not the
// safety scan: both ways.
func TestNamespacesReleaseWakesAcrossNetworks(t *testing.T) {
	for _, c := range []struct{ holder, waiter nsKind }{{nsHost, nsPIDNet}, {nsPIDNet, nsHost}} {
		t.Run(c.holder.String()+"->"+c.waiter.String(), func(t *testing.T) {
			path := tablePath(t)
			h := spawnIn(t, path, c.holder)
			w := spawnIn(t, path, c.waiter)
			m := openM(t, path, nil)
			agentOf := func(pid int) table.AgentInfo {
				for _, ai := range m.Table().Agents() {
					if ai.PID == pid {
						return ai
					}
				}
				return table.AgentInfo{}
			}
			wpid := w.Pid
			if c.waiter != nsHost {
				wpid = 1 // the PID it records is its own namespace's
			}
			var worst time.Duration
			for i := 0; i < 5; i++ {
				h.Send("acquire x")
				h.Expect("acquired x")
				w.Send("acquire x")
				waitPending(t, m, "x", 1)
				// The waiter asleep on its bell: its grant must ring it.
				require.Eventually(t, func() bool { return agentOf(wpid).Parked > 0 }, eventually, time.Millisecond, "the waiter to park")
				before := agentOf(wpid).XBell
				start := time.Now()
				h.Send("release x")
				w.Expect("acquired x")
				worst = max(worst, time.Since(start))
				require.Greater(t, agentOf(wpid).XBell, before, "rung through the table's cross-namespace bell")
				w.Send("release x")
				w.Expect("released x")
			}
			t.Logf("%s -> %s: slowest release-to-grant of 5: %v", c.holder, c.waiter, worst)
		})
	}
}

// becomeUser: see asUserEnv.
func becomeUser(as string) error {
	var uid, gid int
	var hide string
	if n, _ := fmt.Sscanf(strings.ReplaceAll(as, ":", " "), "%d %d %s", &uid, &gid, &hide); n < 2 {
		return fmt.Errorf("bad %q", as)
	}
	if hide == "hidepid" {
		if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return err
		}
		if err := unix.Mount("proc", "/proc", "proc", 0, "hidepid=invisible"); err != nil {
			return err
		}
	}
	if err := syscall.Setgroups([]int{gid}); err != nil {
		return err
	}
	if err := syscall.Setgid(gid); err != nil {
		return err
	}
	return syscall.Setuid(uid)
}

// Two users share a table through their group; one of them sees /proc
// with hidepid=invisible (the other's processes are absent from it): one
// holder at a time, and the contender that cannot see the holder is not
// granted its lock. Root only (it makes the users' processes).
func TestNamespacesHidepidTwoUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it runs agents as two other users")
	}
	requireNamespaces(t, syscall.CLONE_NEWNS)
	const gid = 54321
	dir, err := os.MkdirTemp("", "shmlocks-hidepid-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chown(dir, 0, gid))
	require.NoError(t, os.Chmod(dir, 0o770))
	path := filepath.Join(dir, "shared.tbl")
	opts := `{"MaxResources":16,"MaxRequests":64,"MaxAgents":16,"MaxNameLen":64,"FileMode":432}` // 0660
	as := func(env string, ns uintptr) *child {
		cmd := proctest.CommandWith(proctest.Options{Within: eventually}, "agent", path, opts, "")
		cmd.Env = append(cmd.Env, asUserEnv+"="+env)
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: ns}
		c := &child{Child: proctest.Start(t, cmd, proctest.Options{Within: eventually}), t: t}
		c.ready()
		return c
	}
	h := as(fmt.Sprintf("5001:%d", gid), 0)
	h.Send("acquire x")
	h.Expect("acquired x")
	o := as(fmt.Sprintf("5002:%d:hidepid", gid), syscall.CLONE_NEWNS)
	o.Send("acquire x ifavailable")
	o.Expect("notavailable x")
	h.Kill()
	o.Send("acquire x")
	o.Expect("acquired x")
}
