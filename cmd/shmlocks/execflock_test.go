//go:build unix

package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/manager"
)

// exec takes flock(1)'s options with their meanings; every case runs a real
// command (or must not run it) against a table where this process holds
// "busy" exclusively and "config" shared.
func TestExecFlockOptions(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	m := openManager(t, tbl)
	ctx := ctxFor(t, 30*time.Second)
	busy, err := m.Acquire(ctx, "busy", manager.RequestOptions{})
	require.NoError(t, err)
	defer busy.Release()
	cfg, err := m.Acquire(ctx, "config", manager.RequestOptions{Mode: manager.Shared})
	require.NoError(t, err)
	defer cfg.Release()

	type tc struct {
		args   []string
		code   int
		stdout string
	}
	for _, c := range []tc{
		// The -- before the command is optional.
		{[]string{"idle", "echo", "a", "b"}, 0, "a b\n"},
		{[]string{"idle", "--", "echo", "a"}, 0, "a\n"},
		{[]string{"--", "idle", "echo", "a"}, 0, "a\n"},
		// The command's status passes through.
		{[]string{"idle", "sh", "-c", "exit 5"}, 5, ""},
		// -n and its spellings: exit 1 (or -E's code) without running.
		{[]string{"-n", "busy", "echo", "ran"}, 1, ""},
		{[]string{"--nb", "busy", "echo", "ran"}, 1, ""},
		{[]string{"--nonblock", "busy", "echo", "ran"}, 1, ""},
		{[]string{"-nb", "busy", "echo", "ran"}, 1, ""},
		{[]string{"-n", "-E", "75", "busy", "echo", "ran"}, 75, ""},
		{[]string{"-nE75", "busy", "echo", "ran"}, 75, ""},
		{[]string{"-n", "--conflict-exit-code=0", "busy", "echo", "ran"}, 0, ""},
		{[]string{"-n", "idle", "echo", "ran"}, 0, "ran\n"},
		// -w 0 is -n; -n wins over -w, as in flock.
		{[]string{"-w", "0", "busy", "echo", "ran"}, 1, ""},
		{[]string{"-n", "-w", "30", "busy", "echo", "ran"}, 1, ""},
		{[]string{"-w", "30", "--nonblock", "busy", "echo", "ran"}, 1, ""},
		{[]string{"-n", "-w", "30", "idle", "echo", "ran"}, 0, "ran\n"},
		{[]string{"-w0", "-E", "9", "busy", "echo", "ran"}, 9, ""},
		// -s / -x / -e: shared is compatible with the shared holder of
		// config, exclusive is not; the last of them wins.
		{[]string{"-s", "-n", "config", "echo", "ran"}, 0, "ran\n"},
		{[]string{"--shared", "-n", "config", "echo", "ran"}, 0, "ran\n"},
		{[]string{"-x", "-n", "config", "echo", "ran"}, 1, ""},
		{[]string{"-e", "-n", "config", "echo", "ran"}, 1, ""},
		{[]string{"--exclusive", "-n", "config", "echo", "ran"}, 1, ""},
		{[]string{"-sxn", "config", "echo", "ran"}, 1, ""},
		{[]string{"-xsn", "config", "echo", "ran"}, 0, "ran\n"},
		// -c STRING, after NAME (flock's place) or among the options, run
		// by the shell.
		{[]string{"idle", "-c", "echo $((1+2)); exit 3"}, 3, "3\n"},
		{[]string{"idle", "--command", "echo x"}, 0, "x\n"},
		{[]string{"-c", "echo pre", "idle"}, 0, "pre\n"},
		{[]string{"-n", "busy", "-c", "echo ran"}, 1, ""},
		// -o is accepted (always in effect).
		{[]string{"-o", "idle", "echo", "o"}, 0, "o\n"},
		{[]string{"--close", "-n", "idle", "true"}, 0, ""},
		// The first exec's spellings still work.
		{[]string{"-shared", "--if-available", "config", "--", "echo", "ok"}, 0, "ok\n"},
		{[]string{"--table", tbl, "-n", "busy", "true"}, 1, ""},
	} {
		args := append([]string{"exec", "--table", tbl}, c.args...)
		r := shm(t, []string{"SHELL=/bin/sh"}, args...)
		require.Equal(t, c.code, r.code, "shmlocks %q: stderr %q", args, r.stderr)
		require.Equal(t, c.stdout, r.stdout, "shmlocks %q", args)
		if c.code != 0 && c.stdout == "" && strings.Contains(strings.Join(c.args, " "), "ran") {
			require.Empty(t, r.stderr, "shmlocks %q is silent when not available, as flock", args)
		}
	}
	q, err := m.Query(ctx)
	require.NoError(t, err)
	require.Len(t, q.Held, 2, "only our own locks remain")
	require.Empty(t, q.Pending)
}

// -w SECONDS takes fractions (and Go durations); a timeout exits 1 or -E's
// code after at least that long, without running the command.
func TestExecFlockWait(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	m := openManager(t, tbl)
	l, err := m.Acquire(ctxFor(t, 30*time.Second), "busy", manager.RequestOptions{})
	require.NoError(t, err)
	defer l.Release()
	for _, c := range []struct {
		args []string
		code int
		min  time.Duration
	}{
		{[]string{"-w", "0.2"}, 1, 200 * time.Millisecond},
		{[]string{"-w.15", "-E", "42"}, 42, 150 * time.Millisecond},
		{[]string{"--wait", "0.1"}, 1, 100 * time.Millisecond},
		{[]string{"--timeout=100ms"}, 1, 100 * time.Millisecond},
	} {
		args := append(append([]string{"exec", "--table", tbl, "--verbose"}, c.args...), "busy", "echo", "ran")
		r := shm(t, nil, args...)
		require.Equal(t, c.code, r.code, "shmlocks %q: %s", args, r.stderr)
		require.Empty(t, r.stdout)
		require.Contains(t, r.stderr, "timed out", "--verbose says why")
		require.GreaterOrEqual(t, r.took, c.min)
	}
}

// --verbose reports the time taken and the command; -u and -F are refused
// with a reason.
func TestExecFlockVerboseAndRefused(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	r := shm(t, nil, "exec", "--table", tbl, "--verbose", "v", "true")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `getting lock "v" took [0-9]+\.[0-9]{6} seconds`, r.stderr)
	require.Contains(t, r.stderr, "executing true")
	for _, opt := range []string{"-u", "--unlock", "-F", "--no-fork"} {
		r := shm(t, nil, "exec", "--table", tbl, opt, "v", "true")
		require.Equal(t, exitUsage, r.code, opt)
		require.Contains(t, r.stderr, "not supported", opt)
	}
}
