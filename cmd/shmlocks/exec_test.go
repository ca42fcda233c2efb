//go:build unix

package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/proctest"
	"github.com/shmlocks/shmlocks/manager"
)

func TestExecExitStatus(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	r := shm(t, nil, "exec", "--table", tbl, "job", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
	require.Equal(t, 7, r.code, r.stderr)
	require.Equal(t, "out\n", r.stdout)
	require.Equal(t, "err\n", r.stderr)

	r = shm(t, nil, "exec", "--table", tbl, "job", "--", "sh", "-c", "kill -TERM $$")
	require.Equal(t, 128+int(syscall.SIGTERM), r.code, r.stderr)

	r = shm(t, nil, "exec", "--table", tbl, "job", "--", "/nonexistent/command")
	require.Equal(t, 127, r.code)

	// The command runs while the lock is held: it sees itself (its parent) in the table.
	r = shm(t, nil, "exec", "--table", tbl, "--shared", "job", "--", binary, "dump", "--json", "--table", tbl)
	require.Equal(t, exitOK, r.code, r.stderr)
	var snap manager.Snapshot
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &snap))
	require.Len(t, snap.Held, 1)
	require.Equal(t, "job", snap.Held[0].Name)
	require.Equal(t, manager.Shared, snap.Held[0].Mode)

	// And released afterwards.
	m := openManager(t, tbl)
	q, err := m.Query(ctxFor(t, 10*time.Second))
	require.NoError(t, err)
	require.Empty(t, q.Held)
}

func openManager(t *testing.T, path string) *manager.Manager {
	m, err := manager.Open(path, nil)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

func TestExecConflicts(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	m := openManager(t, tbl)
	l, err := m.Acquire(ctxFor(t, 10*time.Second), "busy", manager.RequestOptions{})
	require.NoError(t, err)
	defer l.Release()

	r := shm(t, nil, "exec", "--table", tbl, "--if-available", "busy", "--", "echo", "ran")
	require.Equal(t, exitFailure, r.code)
	require.Empty(t, r.stdout, "the command must not run")
	require.Empty(t, r.stderr, "not available is silent, as in flock (cron mails every line)")
	r = shm(t, nil, "exec", "--table", tbl, "--if-available", "--verbose", "busy", "--", "echo", "ran")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "not available", "--verbose says why")

	r = shm(t, nil, "exec", "--table", tbl, "--if-available", "--conflict-exit-code", "75", "busy", "--", "echo", "ran")
	require.Equal(t, 75, r.code)
	r = shm(t, nil, "exec", "--table", tbl, "-E", "0", "--if-available", "busy", "--", "echo", "ran")
	require.Equal(t, 0, r.code)
	require.Empty(t, r.stdout)

	r = shm(t, nil, "exec", "--table", tbl, "--timeout", "200ms", "--verbose", "busy", "--", "echo", "ran")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "timed out")
	require.GreaterOrEqual(t, r.took, 200*time.Millisecond)
	require.Empty(t, r.stdout)

	// A shared request is not available under an exclusive holder either,
	// while another name is.
	r = shm(t, nil, "exec", "--table", tbl, "--shared", "--if-available", "busy", "--", "true")
	require.Equal(t, exitFailure, r.code)
	r = shm(t, nil, "exec", "--table", tbl, "--if-available", "idle", "--", "true")
	require.Equal(t, exitOK, r.code, r.stderr)

	q, err := m.Query(ctxFor(t, 10*time.Second))
	require.NoError(t, err)
	require.Empty(t, q.Pending, "nothing left waiting")
	require.Len(t, q.Held, 1)
}

// startExec starts an exec process. With pending it waits (bounded) until
// the table shows its request waiting; otherwise until the command printed
// its first line (the lock is held and the command runs).
func startExec(t *testing.T, m *manager.Manager, pending bool, args ...string) *proctest.Child {
	t.Helper()
	c := startExecProc(t, args...)
	if !pending {
		c.Next()
		return c
	}
	waitFor(t, func() bool {
		q, err := m.Query(ctxFor(t, 10*time.Second))
		if err != nil {
			return false
		}
		for _, li := range q.Pending {
			if li.PID == c.Pid {
				return true
			}
		}
		return false
	}, "the exec process's request to queue")
	return c
}

func TestExecInterruptWhileWaiting(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	m := openManager(t, tbl)
	l, err := m.Acquire(ctxFor(t, 10*time.Second), "busy", manager.RequestOptions{})
	require.NoError(t, err)
	defer l.Release()

	// Every signal that would end the process withdraws the request and
	// exits 128+N, as a shell reports a process killed by it (flock is
	// killed by it); --verbose says so.
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGUSR1} {
		c := startExec(t, m, true, "--table", tbl, "--verbose", "busy", "--", "echo", "ran")
		require.NoError(t, c.Cmd.Process.Signal(sig))
		require.Equal(t, 128+int(sig), exitCode(c), c.Stderr())
		require.Contains(t, c.Stderr(), sig.String())
		require.Contains(t, c.Stderr(), "withdrawn")

		q, err := m.Query(ctxFor(t, 10*time.Second))
		require.NoError(t, err)
		require.Empty(t, q.Pending, "the request was withdrawn")
		require.Len(t, q.Held, 1)
	}
}

func TestExecForwardsSignalsAndStolen(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	m := openManager(t, tbl)

	// SIGTERM to exec reaches the command (sleep dies of it).
	c := startExec(t, m, false, "--table", tbl, "job", "--", "sh", "-c", "echo ready; exec sleep 30")
	require.NoError(t, c.Cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 128+int(syscall.SIGTERM), exitCode(c), c.Stderr())

	// A steal: exec warns and terminates the command.
	c = startExec(t, m, false, "--table", tbl, "job", "--", "sh", "-c", "echo ready; exec sleep 30")
	l, err := m.Acquire(ctxFor(t, 10*time.Second), "job", manager.RequestOptions{Steal: true})
	require.NoError(t, err)
	defer l.Release()
	require.Equal(t, exitLost, exitCode(c), c.Stderr())
	require.True(t, strings.Contains(c.Stderr(), "was stolen"), c.Stderr())
	require.NoError(t, l.Release())

	// A command that answers the steal's SIGTERM by exiting 0: exec still
	// says the lock was lost.
	c = startExec(t, m, false, "--table", tbl, "job", "--", "sh", "-c", `trap "exit 0" TERM; echo ready; while :; do sleep 0.05; done`)
	l, err = m.Acquire(ctxFor(t, 10*time.Second), "job", manager.RequestOptions{Steal: true})
	require.NoError(t, err)
	require.Equal(t, exitLost, exitCode(c), c.Stderr())
	require.Contains(t, c.Stderr(), "was lost while the command ran (its status 0)")
}
