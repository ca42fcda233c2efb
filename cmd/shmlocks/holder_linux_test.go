//go:build linux

package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/proctest"
)

// The holder of an exec grant as it is, in every view: while the wrapper
// runs, the lock's PID is the command's and its wrapper is shown alive;
// once the wrapper is SIGKILLed, no view shows its PID as alive, every
// view names the command (pid, command line, group), and dump --check
// names the agent whose process is gone while its group holds the lock.
// (The reproducer: ../shared/repro/operators/dump_after_wrapper_kill.sh.)
func TestDumpShowsExecHolderAsItIs(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	a := startExecProc(t, "-t", tbl, "job", "sh", "-c", "echo $$; exec sleep 61.5")
	c := commandPID(t, a)
	wrapper := a.Pid
	cs, ws := strconv.Itoa(c), strconv.Itoa(wrapper)
	row := func(out string) string {
		m := regexp.MustCompile(`(?m)^\s+"job"\s+held\s+.*$`).FindString(out)
		require.NotEmpty(t, m, "a held line for job in %s", out)
		return m
	}

	// The wrapper runs.
	r := shm(t, nil, "dump", "-t", tbl)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `\s`+cs+`\s+sleep 61\.5\s+`+ws+` alive\s`, row(r.stdout), "the command holds; its wrapper is alive")

	// The wrapper is killed; the command holds on.
	killWait(t, wrapper)
	a.Wait()
	r = shm(t, nil, "dump", "-t", tbl)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `\s`+cs+`\s+sleep 61\.5\s+`+ws+` gone\s`, row(r.stdout))
	require.Regexp(t, `(?m)^\s+\d+\s+`+ws+`\s+wrapper-gone\s+-\s+`+cs+`\s`, r.stdout, "the agent's state says its process is gone")
	require.NotRegexp(t, `(?m)\s`+ws+`\s+alive\b`, r.stdout, "the dead wrapper is never shown alive")

	r = shm(t, nil, "dump", "-t", tbl, "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	var doc struct {
		Held   []map[string]any `json:"held"`
		Agents []map[string]any `json:"agents"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc))
	require.Len(t, doc.Held, 1)
	h := doc.Held[0]
	require.EqualValues(t, wrapper, h["pid"], "pid: the process that made the request (Query's field)")
	require.Equal(t, "gone", h["process"], "a dead PID is never shown as alive")
	require.Equal(t, false, h["dead"], "the agent lives on in its command's group")
	require.EqualValues(t, c, h["holderPid"])
	require.EqualValues(t, c, h["group"])
	require.Equal(t, "gone", h["wrapper"])
	require.Equal(t, "sleep 61.5", h["command"])
	require.Len(t, doc.Agents, 1)
	ag := doc.Agents[0]
	require.Equal(t, "wrapper-gone", ag["state"])
	require.Equal(t, "", ag["command"], "no command for a PID that names nobody")
	require.EqualValues(t, c, ag["holderPid"])
	require.Equal(t, "sleep 61.5", ag["holderCommand"])

	// --watch --json: the same, refresh after refresh.
	cmd := exec.Command(binary, "dump", "-t", tbl, "--watch", "--json", "--interval", "50ms")
	cmd.Env = cleanEnv()
	w := proctest.Start(t, cmd, proctest.Options{CaptureStderr: true, Within: within})
	for range 2 {
		var frame struct {
			Held []map[string]any `json:"held"`
		}
		require.NoError(t, json.Unmarshal([]byte(w.Next()), &frame))
		require.Len(t, frame.Held, 1)
		require.Equal(t, "gone", frame.Held[0]["process"])
		require.EqualValues(t, c, frame.Held[0]["holderPid"])
		require.Equal(t, "sleep 61.5", frame.Held[0]["command"])
	}
	require.NoError(t, w.Cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, exitOK, exitCode(w), w.Stderr())

	r = shm(t, nil, "dump", "-t", tbl, "--check")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "its process "+ws+" (a shmlocks exec wrapper) is gone; its command's process group "+cs+" holds its locks (pid "+cs+": sleep 61.5)")

	// The group gone, the agent is dead and its PID marked so.
	require.NoError(t, syscall.Kill(-c, syscall.SIGKILL))
	waitFor(t, func() bool {
		r := shm(t, nil, "dump", "-t", tbl)
		return r.code == exitOK && (strings.Contains(r.stdout, "locks: none") || strings.Contains(r.stdout, ws+" (dead)"))
	}, "the lock to be freed or its holder shown dead")
}
