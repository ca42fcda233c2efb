//go:build unix

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/table"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// liveTable creates a table where this process holds "jobs" exclusively and
// "config" shared, and a second agent of this process waits for "jobs".
func liveTable(t *testing.T) (path string, holder, waiter *manager.Manager) {
	path = filepath.Join(t.TempDir(), "live.tbl")
	var err error
	holder, err = manager.Open(path, nil)
	require.NoError(t, err)
	t.Cleanup(func() { holder.Close() })
	waiter, err = manager.Open(path, nil)
	require.NoError(t, err)
	t.Cleanup(func() { waiter.Close() })
	ctx := ctxFor(t, 30*time.Second)
	_, err = holder.Acquire(ctx, "jobs", manager.RequestOptions{})
	require.NoError(t, err)
	_, err = holder.Acquire(ctx, "config", manager.RequestOptions{Mode: manager.Shared})
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l, err := waiter.Acquire(wctx, "jobs", manager.RequestOptions{Mode: manager.Shared})
		if err == nil {
			l.Release()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, func() bool {
		s, err := holder.Query(ctx)
		return err == nil && len(s.Pending) == 1
	}, "the waiter to queue")
	return path, holder, waiter
}

// waitFor polls cond (bounded: 10s) — for states another process reaches.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDumpLive(t *testing.T) {
	path, holder, waiter := liveTable(t)
	r := shm(t, nil, "dump", "--table", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	out := r.stdout
	pid := strconv.Itoa(os.Getpid())
	require.Contains(t, out, "table     "+path)
	require.Contains(t, out, "SHMLOCK1 version "+strconv.Itoa(table.FormatVersion))
	require.Contains(t, out, "(this boot)")
	require.Contains(t, out, "agents: 2")
	require.Regexp(t, `"jobs"\s+held\s+exclusive\s+\d+\s+`+pid+`\s+`+holder.ClientID(), out)
	require.Regexp(t, `\s+waiting\s+shared\s+-\s+`+pid+`\s+`+waiter.ClientID(), out)
	require.Regexp(t, `"config"\s+held\s+shared`, out)
	require.Regexp(t, `usage\s+names 2/\d+, requests 3/\d+ \(held 2, waiting 1\), agents 2/\d+`, out)
	require.Regexp(t, `\nfairness\s+fifo \(strict arrival order\)\n`, out)
}

// TestDumpFairness: dump names the fairness a table was created with.
func TestDumpFairness(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bounded.tbl")
	m, err := manager.Open(path, &manager.OpenOptions{Fairness: manager.Bounded(1500 * time.Microsecond)})
	require.NoError(t, err)
	m.Close()
	r := shm(t, nil, "dump", "--table", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `\nfairness\s+bounded:1.5ms \(`, r.stdout)
}

func TestDumpJSONShape(t *testing.T) {
	// An empty table: arrays, never null.
	empty := filepath.Join(t.TempDir(), "empty.tbl")
	m, err := manager.Open(empty, nil)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	r := shm(t, nil, "dump", "--json", "--table", empty)
	require.Equal(t, exitOK, r.code, r.stderr)
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &raw))
	require.Len(t, raw, 2)
	require.JSONEq(t, `[]`, string(raw["held"]))
	require.JSONEq(t, `[]`, string(raw["pending"]))

	path, holder, waiter := liveTable(t)
	r = shm(t, nil, "dump", "--json", "--table", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	var snap map[string][]map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &snap))
	require.Len(t, snap, 2)
	require.Len(t, snap["held"], 2)
	require.Len(t, snap["pending"], 1)
	for _, li := range append(snap["held"], snap["pending"]...) {
		keys := []string{}
		for k := range li {
			keys = append(keys, k)
		}
		require.ElementsMatch(t, []string{"name", "mode", "clientId", "pid"}, keys)
	}
	require.Equal(t, map[string]any{"name": "jobs", "mode": "shared", "clientId": waiter.ClientID(), "pid": float64(os.Getpid())}, snap["pending"][0])
	// The same shape as the Query snapshot.
	q, err := holder.Query(ctxFor(t, 10*time.Second))
	require.NoError(t, err)
	var fromDump manager.Snapshot
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &fromDump))
	require.ElementsMatch(t, q.Held, fromDump.Held)
	require.Equal(t, q.Pending, fromDump.Pending)
}

func TestDumpCheck(t *testing.T) {
	path, _, _ := liveTable(t)
	r := shm(t, nil, "dump", "--check", "--table", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "consistent")

	r = shm(t, nil, "dump", "--check", "--table", filepath.Join(t.TempDir(), "missing.tbl"))
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "no table")

	// A torn outcome file of Coalesce beside the table fails the check too.
	require.NoError(t, os.MkdirAll(path+".coalesce", 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(path+".coalesce", "00.res"), []byte("torn"), 0o600))
	r = shm(t, nil, "dump", "--check", "--table", path)
	require.Equal(t, exitFailure, r.code, r.stdout)
	require.Contains(t, r.stderr, "coalesce")
}

func TestDumpCorrupt(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.tbl")
	require.NoError(t, os.WriteFile(garbage, []byte(strings.Repeat("not a lock table! ", 1000)), 0o600))
	for _, args := range [][]string{{"dump"}, {"dump", "--json"}, {"dump", "--check"}} {
		r := shm(t, nil, append(args, "--table", garbage)...)
		require.Equal(t, exitCorrupt, r.code, "%v: %s", args, r.stderr)
		require.Contains(t, r.stderr, "magic", "the message names the field")
	}

	tiny := filepath.Join(dir, "tiny.tbl")
	require.NoError(t, os.WriteFile(tiny, []byte("SHMLOCK1"), 0o600))
	r := shm(t, nil, "dump", "--table", tiny)
	require.Equal(t, exitCorrupt, r.code, r.stderr)

	// A valid table cut short: its header names the size it should have.
	trunc := filepath.Join(dir, "trunc.tbl")
	m, err := manager.Open(trunc, nil)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	fi, err := os.Stat(trunc)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(trunc, fi.Size()/2))
	r = shm(t, nil, "dump", "--table", trunc)
	require.Equal(t, exitCorrupt, r.code, r.stderr)
	require.Contains(t, r.stderr, "file size")

	r = shm(t, nil, "dump", "--table", filepath.Join(dir, "missing.tbl"))
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "no table at")
}

func TestDumpWatch(t *testing.T) {
	path, _, _ := liveTable(t)
	ctx := ctxFor(t, 30*time.Second)
	cmd := exec.CommandContext(ctx, binary, "dump", "--watch", "--interval", "20ms", "--table", path)
	cmd.Env = cleanEnv()
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	frames := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() && frames < 3 {
		if strings.HasPrefix(sc.Text(), "table ") {
			frames++
		}
	}
	require.Equal(t, 3, frames, "three refreshes")
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	for sc.Scan() { // until the process exits (bounded by ctx)
	}
	require.NoError(t, cmd.Wait(), "Ctrl-C ends --watch with status 0")
}
