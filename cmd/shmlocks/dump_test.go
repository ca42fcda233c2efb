//go:build unix

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

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
	comm := procCommand(os.Getpid())
	require.NotEmpty(t, comm, "this process's command from /proc")
	require.Contains(t, out, "table     "+path)
	require.Contains(t, out, "SHMLOCK1 version "+strconv.Itoa(table.FormatVersion))
	require.Contains(t, out, "(this boot)")
	require.Contains(t, out, "agents: 2")
	// Every holder has its hold time, the ones granted at once included,
	// and its command; client ids are right-aligned (TestRenderDumpGolden).
	age := `(\d+(\.\d+)?(µs|ms|s)|\d+m\d+s)`
	// COMMAND: the command line, its program's base name first; WRAPPER
	// "-": no shmlocks exec.
	cmdline := regexp.QuoteMeta(comm) + `[^\n]*?\s+-`
	require.Regexp(t, `"jobs"\s+held\s+exclusive\s+\d+\s+`+pid+`\s+`+cmdline+`\s+`+age+`\s+`+holder.ClientID()+`\n`, out)
	require.Regexp(t, `\s+waiting\s+shared\s+-\s+`+pid+`\s+`+cmdline+`\s+`+age+`\s+`+waiter.ClientID()+`\n`, out)
	require.Regexp(t, `"config"\s+held\s+shared\s+\d+\s+`+pid+`\s+`+cmdline+`\s+`+age+`\s+`+holder.ClientID()+`\n`, out)
	require.Regexp(t, `usage\s+names 2/\d+, requests 3/\d+ \(held 2, waiting 1\), agents 2/\d+`, out)
	require.Regexp(t, `\d+\s+`+pid+`\s+alive\s+`+regexp.QuoteMeta(comm)+`[^\n]*?\s+-\s+2\s+0\s+.* ago\s+`+holder.ClientID()+`\n`, out)
	require.Regexp(t, `\nfairness\s+fifo \(strict arrival order\)\n`, out)
}

// dumpDoc runs dump --json and decodes it.
func dumpDoc(t *testing.T, args ...string) map[string]json.RawMessage {
	t.Helper()
	r := shm(t, nil, append([]string{"dump", "--json"}, args...)...)
	require.Equal(t, exitOK, r.code, r.stderr)
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &raw), r.stdout)
	return raw
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
	raw := dumpDoc(t, "--table", empty)
	require.ElementsMatch(t, []string{"time", "table", "fairness", "held", "pending", "watching", "agents", "usage", "waitsFor", "deadlocks"}, mapKeysRaw(raw))
	for _, k := range []string{"held", "pending", "watching", "agents", "waitsFor", "deadlocks"} {
		require.JSONEq(t, `[]`, string(raw[k]), k)
	}

	path, holder, waiter := liveTable(t)
	before := time.Now()
	raw = dumpDoc(t, "--table", path)
	var doc struct {
		Time     time.Time        `json:"time"`
		Table    string           `json:"table"`
		Held     []map[string]any `json:"held"`
		Pending  []map[string]any `json:"pending"`
		Agents   []map[string]any `json:"agents"`
		Usage    map[string]any   `json:"usage"`
		WaitsFor []map[string]any `json:"waitsFor"`
	}
	require.NoError(t, json.Unmarshal(mustJSON(t, raw), &doc))
	require.WithinDuration(t, before, doc.Time, time.Minute)
	require.Equal(t, path, doc.Table)
	require.Len(t, doc.Held, 2)
	require.Len(t, doc.Pending, 1)
	for _, h := range doc.Held {
		require.ElementsMatch(t, []string{"name", "mode", "clientId", "pid", "token", "heldSeconds", "steal", "dead", "process", "holderPid", "command"}, mapKeys(h))
		require.Greater(t, h["heldSeconds"].(float64), 0.0, "every hold has its time: %v", h)
		require.Greater(t, h["token"].(float64), 0.0)
		require.Equal(t, procCmdline(os.Getpid()), h["command"])
		require.Equal(t, "alive", h["process"])
		require.EqualValues(t, os.Getpid(), h["holderPid"])
		require.Equal(t, false, h["dead"])
	}
	p := doc.Pending[0]
	require.ElementsMatch(t, []string{"name", "mode", "clientId", "pid", "waitingSeconds", "dead", "process", "holderPid", "command"}, mapKeys(p))
	require.Equal(t, "jobs", p["name"])
	require.Equal(t, "shared", p["mode"])
	require.Equal(t, waiter.ClientID(), p["clientId"])
	require.EqualValues(t, os.Getpid(), p["pid"])
	require.Greater(t, p["waitingSeconds"].(float64), 0.0)
	require.Len(t, doc.Agents, 2)
	require.EqualValues(t, 2, doc.Usage["held"])
	require.EqualValues(t, 1, doc.Usage["waiting"])
	require.EqualValues(t, 2, doc.Usage["names"])
	require.EqualValues(t, 0, doc.Usage["agentsDead"])
	require.Len(t, doc.WaitsFor, 1)
	w := doc.WaitsFor[0]
	require.Equal(t, waiter.ClientID(), w["clientId"])
	blockers := w["waitsFor"].([]any)
	require.Len(t, blockers, 1)
	require.Equal(t, holder.ClientID(), blockers[0].(map[string]any)["clientId"])
	require.Equal(t, true, blockers[0].(map[string]any)["held"])

	// held and pending read as manager.Query's snapshot does.
	q, err := holder.Query(ctxFor(t, 10*time.Second))
	require.NoError(t, err)
	var fromDump manager.Snapshot
	require.NoError(t, json.Unmarshal(mustJSON(t, raw), &fromDump))
	require.ElementsMatch(t, q.Held, fromDump.Held)
	require.Equal(t, q.Pending, fromDump.Pending)
}

// A name that is not valid UTF-8 comes back byte for byte (nameBase64),
// and the holder's hold time is known although it was granted at once,
// by the fast path (the name was used once before: its entry is idle).
func TestDumpJSONNamesAndHoldTimes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "names.tbl")
	m, err := manager.Open(path, nil)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	ctx := ctxFor(t, 30*time.Second)
	const bad = "bad\xffutf\x00"
	for _, name := range []string{bad, "fast"} {
		l, err := m.Acquire(ctx, name, manager.RequestOptions{})
		require.NoError(t, err)
		require.NoError(t, l.Release())
	}
	t0 := time.Now()
	_, err = m.Acquire(ctx, bad, manager.RequestOptions{})
	require.NoError(t, err)
	_, err = m.Acquire(ctx, "fast", manager.RequestOptions{})
	require.NoError(t, err)
	raw := dumpDoc(t, "--table", path)
	t2 := time.Now()
	var doc struct {
		Held []struct {
			Name        string  `json:"name"`
			NameBase64  *string `json:"nameBase64"`
			HeldSeconds float64 `json:"heldSeconds"`
		} `json:"held"`
	}
	require.NoError(t, json.Unmarshal(mustJSON(t, raw), &doc))
	require.Len(t, doc.Held, 2)
	names := map[string]bool{}
	for _, h := range doc.Held {
		name := h.Name
		if h.NameBase64 != nil {
			b, err := base64.StdEncoding.DecodeString(*h.NameBase64)
			require.NoError(t, err)
			name = string(b)
		} else {
			require.True(t, utf8.ValidString(name))
		}
		names[name] = true
		// Granted after t0 (stamped from a clock at most about 0.1 s
		// behind: a second of slack), read before t2.
		require.Greater(t, h.HeldSeconds, 0.0, name)
		require.LessOrEqual(t, h.HeldSeconds, t2.Sub(t0).Seconds()+1, name)
	}
	require.Equal(t, map[string]bool{bad: true, "fast": true}, names, "names exact")
}

func mapKeysRaw(m map[string]json.RawMessage) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

func TestDumpCheck(t *testing.T) {
	path, _, _ := liveTable(t)
	r := shm(t, nil, "dump", "--check", "--table", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "consistent")

	r = shm(t, nil, "dump", "--check", "--table", filepath.Join(t.TempDir(), "missing.tbl"))
	require.Equal(t, exitNoTable, r.code)
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
	require.Equal(t, exitNoTable, r.code)
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

// --watch --json: one document per line and refresh, each with its time;
// a table that does not exist yet is waited for (said once on stderr).
func TestDumpWatchJSONWaitsForTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "later.tbl")
	ctx := ctxFor(t, 30*time.Second)
	cmd := exec.CommandContext(ctx, binary, "dump", "--watch", "--json", "--interval", "20ms", "--table", path)
	cmd.Env = cleanEnv()
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	waitFor(t, func() bool { return strings.Contains(stderr.String(), "no table at "+path+" yet; waiting for it") }, "the waiting note")

	m, err := manager.Open(path, nil)
	require.NoError(t, err)
	defer m.Close()
	_, err = m.Acquire(ctx, "arrived", manager.RequestOptions{})
	require.NoError(t, err)
	sc := bufio.NewScanner(out)
	var times []time.Time
	for len(times) < 3 && sc.Scan() {
		var doc struct {
			Time time.Time        `json:"time"`
			Held []map[string]any `json:"held"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &doc), "one document per line: %q", sc.Text())
		if len(doc.Held) == 1 && doc.Held[0]["name"] == "arrived" {
			times = append(times, doc.Time)
		}
	}
	require.Len(t, times, 3)
	require.True(t, times[0].Before(times[1]) && times[1].Before(times[2]), "a time per document: %v", times)
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	for sc.Scan() {
	}
	require.NoError(t, cmd.Wait())
	require.Equal(t, 1, strings.Count(stderr.String(), "waiting for it"), "said once")
}

// syncBuffer collects output written by another goroutine (a pty's
// master, a child's stderr).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
