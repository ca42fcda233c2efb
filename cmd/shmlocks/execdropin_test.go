//go:build unix

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/manager"
)

// shmlocks exec as a drop-in for flock(1)'s common use (issue 38): silence
// on a busy name, the command's environment, every signal passed on, the
// SIGKILL after a steal, and exit codes that tell a busy name from a table
// that cannot be used.

func TestExecSilentUnlessVerbose(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	m := openManager(t, tbl)
	l, err := m.Acquire(ctxFor(t, within), "busy", manager.RequestOptions{})
	require.NoError(t, err)
	defer l.Release()
	for _, args := range [][]string{{"-n"}, {"-w", "0.05"}, {"-n", "-w", "5"}, {"-nE", "75"}} {
		a := append(append([]string{"exec", "-t", tbl}, args...), "busy", "echo", "ran")
		r := shm(t, nil, a...)
		require.NotEqual(t, 0, r.code, "%q", a)
		require.Empty(t, r.stdout, "%q", a)
		require.Empty(t, r.stderr, "%q: nothing on stderr without --verbose", a)
		r = shm(t, nil, append([]string{"exec", "--verbose"}, a[1:]...)...)
		require.Len(t, strings.Split(strings.TrimSpace(r.stderr), "\n"), 1, "%q --verbose: one line", a)
	}
}

// The command's environment names the lock and its fencing token (decimal,
// increasing); an inherited value is replaced.
func TestExecEnvironment(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	var last uint64
	for i := 0; i < 3; i++ {
		r := shm(t, []string{envLockToken + "=999999999999", envLockName + "=stale"},
			"exec", "-t", tbl, "job one", "sh", "-c", `echo "$SHMLOCKS_NAME|$SHMLOCKS_TOKEN"`)
		require.Equal(t, 0, r.code, r.stderr)
		name, tok, ok := strings.Cut(strings.TrimSpace(r.stdout), "|")
		require.True(t, ok, r.stdout)
		require.Equal(t, "job one", name)
		v, err := strconv.ParseUint(tok, 10, 64)
		require.NoError(t, err, "a decimal token: %q", tok)
		require.Greater(t, v, last, "tokens increase")
		require.Less(t, v, uint64(999999999999), "the inherited value is replaced")
		last = v
	}
}

// Every catchable signal sent to the wrapper reaches the command (its
// group): here USR1, USR2, HUP, ALRM and WINCH, each trapped by the
// command, then TERM, which ends it.
func TestExecForwardsEverySignal(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	script := `for s in USR1 USR2 HUP ALRM WINCH; do trap "echo got $s" $s; done; echo $$; while :; do sleep 0.02; done`
	a := startExecProc(t, "-t", tbl, "job", "sh", "-c", script)
	commandPID(t, a)
	sigs := []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP, syscall.SIGALRM, syscall.SIGWINCH}
	if signal.Ignored(syscall.SIGHUP) {
		// Under nohup the exec wrapper inherits SIGHUP ignored and leaves
		// it so (exec_unix.go), as the user asked: it is not forwarded.
		t.Log("SIGHUP is ignored (nohup?): not sent")
		sigs = slices.DeleteFunc(sigs, func(s syscall.Signal) bool { return s == syscall.SIGHUP })
	}
	for _, sig := range sigs {
		require.NoError(t, a.Cmd.Process.Signal(sig))
		require.Equal(t, "got "+sigName(sig), a.Next(), "%v reaches the command", sig)
	}
	require.NoError(t, a.Cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 128+int(syscall.SIGTERM), exitCode(a), a.Stderr())
}

func sigName(s syscall.Signal) string {
	return map[syscall.Signal]string{syscall.SIGUSR1: "USR1", syscall.SIGUSR2: "USR2", syscall.SIGHUP: "HUP",
		syscall.SIGALRM: "ALRM", syscall.SIGWINCH: "WINCH"}[s]
}

// After a steal the command gets SIGTERM, then SIGKILL after --kill-after
// if it ignores SIGTERM.
func TestExecStealThenKillAfter(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	m := openManager(t, tbl)
	a := startExecProc(t, "-t", tbl, "--kill-after", "0.3", "job", "sh", "-c", `trap "" TERM; echo $$; exec sleep 60`)
	commandPID(t, a)
	l, err := m.Acquire(ctxFor(t, within), "job", manager.RequestOptions{Steal: true})
	require.NoError(t, err)
	defer l.Release()
	start := time.Now()
	require.Equal(t, exitLost, exitCode(a), a.Stderr())
	require.Contains(t, a.Stderr(), "its status 137", "killed by SIGKILL")
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "SIGKILL only after the grace period")
	require.Contains(t, a.Stderr(), "was stolen")
	require.Contains(t, a.Stderr(), "SIGKILL")
}

// Exit codes tell a busy name (1) from a usage error (64), a file that is
// not a table (65), a table that cannot be opened (66) and a full table (75).
func TestExecExitCodes(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"exec", "--bogus", "x", "true"}, exitUsage, "unknown option --bogus"},
		{[]string{"exec", "-t", "", "x", "true"}, exitUsage, "non-empty"},
		{[]string{"exec", "--table=", "x", "true"}, exitUsage, "non-empty"},
		{[]string{"exec", "-t", filepath.Join(dir, "missing", "x.tbl"), "x", "true"}, exitNoTable, "directory " + filepath.Join(dir, "missing") + " does not exist"},
		{[]string{"exec", "-t", dir, "x", "true"}, exitNoTable, ""},
	} {
		r := shm(t, nil, c.args...)
		require.Equal(t, c.code, r.code, "%q: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.says, "%q", c.args)
	}
	garbage := filepath.Join(dir, "garbage.tbl")
	require.NoError(t, os.WriteFile(garbage, []byte(strings.Repeat("not a table ", 1000)), 0o600))
	r := shm(t, nil, "exec", "-t", garbage, "x", "echo", "ran")
	require.Equal(t, exitCorrupt, r.code, r.stderr)
	require.Empty(t, r.stdout)

	full := filepath.Join(dir, "full.tbl")
	m, err := manager.Open(full, &manager.OpenOptions{MaxAgents: 1})
	require.NoError(t, err)
	defer m.Close()
	r = shm(t, nil, "exec", "-t", full, "x", "echo", "ran")
	require.Equal(t, exitTempFail, r.code, r.stderr)
	require.Contains(t, r.stderr, "full")
}

// A table another user planted in a world-writable directory is refused,
// with exit status 66 and the reason.
func TestExecRefusesPlantedTable(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("planting a file owned by another user needs root")
	}
	dir := filepath.Join(t.TempDir(), "shared")
	require.NoError(t, os.Mkdir(dir, 0o777))
	require.NoError(t, os.Chmod(dir, 0o777|os.ModeSticky))
	tbl := filepath.Join(dir, "t.tbl")
	m, err := manager.Open(tbl, &manager.OpenOptions{FileMode: 0o666})
	require.NoError(t, err)
	m.Close()
	require.NoError(t, os.Lchown(tbl, 4242, 4242))
	r := shm(t, nil, "exec", "-t", tbl, "x", "echo", "ran")
	require.Equal(t, exitNoTable, r.code, r.stderr)
	require.Empty(t, r.stdout)
	require.Contains(t, r.stderr, "owned by uid 4242")
	require.Contains(t, r.stderr, "world-writable")
	require.Equal(t, 1, strings.Count(r.stderr, "shmlocks"), "one 'shmlocks exec:' prefix, no 'shmlocks:' after it: %s", r.stderr)

	// Shared on purpose: a group directory nobody else can write to.
	team := filepath.Join(t.TempDir(), "team")
	require.NoError(t, os.Mkdir(team, 0o770))
	shared := filepath.Join(team, "t.tbl")
	r = shm(t, nil, "exec", "-t", shared, "--mode", "0660", "x", "true")
	require.Equal(t, 0, r.code, r.stderr)
	fi, err := os.Stat(shared)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o660), fi.Mode().Perm(), "--mode sets the created file's mode")
	require.NoError(t, os.Lchown(shared, 4242, 4242))
	r = shm(t, nil, "exec", "-t", shared, "x", "echo", "shared")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "shared\n", r.stdout)
}

func TestVersionAndHelpCommand(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}, {"-V"}} {
		r := shm(t, nil, args...)
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Regexp(t, `^shmlocks \S+.*go1\.\d+.*table format \d+\)\n$`, r.stdout)
	}
	for _, c := range []string{"dump", "exec", "serve", "stress", "demo", "path", "version"} {
		r := shm(t, nil, "help", c)
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, "usage: shmlocks "+c, "help %s prints %s's help", c, c)
		direct := shm(t, nil, c, "--help")
		require.Equal(t, direct.stdout, r.stdout)
	}
	r := shm(t, nil, "help")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "commands:")
	r = shm(t, nil, "help", "bogus")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "unknown command")
}

// Every subcommand takes its options GNU style, reports errors GNU style and
// lists its options GNU style, short letters included.
func TestSubcommandFlagsGNU(t *testing.T) {
	for cmd, short := range shortOptions {
		r := shm(t, nil, cmd, "--help")
		require.Equal(t, exitOK, r.code, r.stderr)
		for c, long := range short {
			require.Contains(t, r.stdout, fmt.Sprintf("-%c, --%s", c, long), "%s --help lists -%c", cmd, c)
		}
		require.NotContains(t, r.stdout, "\n  -table", "%s: no Go-flag style left", cmd)

		r = shm(t, nil, cmd, "--bogus")
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, "unknown option --bogus", cmd)
		require.NotContains(t, r.stderr, "flag provided but not defined")

		r = shm(t, nil, cmd, "--table", "")
		require.Equal(t, exitUsage, r.code, "%s --table '': %s", cmd, r.stderr)
		require.Contains(t, r.stderr, "non-empty")
	}
	r := shm(t, nil, "serve", "--help")
	require.Contains(t, r.stdout, "--[no-]names")
	r = shm(t, nil, "path", "--bogus")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "unknown option --bogus")

	// The short forms work: a dump as JSON of a live table.
	tbl := filepath.Join(t.TempDir(), "t.tbl")
	m := openManager(t, tbl)
	_, err := m.Acquire(ctxFor(t, 10*time.Second), "x", manager.RequestOptions{})
	require.NoError(t, err)
	for _, args := range [][]string{{"-jt", tbl}, {"-j", "-t" + tbl}, {"--js", "--tab=" + tbl}, {"-json", "-table", tbl}} {
		r := shm(t, nil, append([]string{"dump"}, args...)...)
		require.Equal(t, exitOK, r.code, "%q: %s", args, r.stderr)
		var snap manager.Snapshot
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &snap), "%q", args)
		require.Len(t, snap.Held, 1)
	}
}
