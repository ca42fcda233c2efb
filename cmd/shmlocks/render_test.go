package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/internal/waitgraph"
	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/table"
)

// The golden file is rewritten with: go test ./cmd/shmlocks -run RenderDump -update
var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// goldenState is a dump with every kind of line: agents alive and dead, a
// held lock granted by a steal, shared holders (one whose time is not
// written yet), pending requests of a dead agent, watches, a name with
// bytes that upset a terminal and a name far longer than a terminal.
func goldenState() *dumpState {
	base := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) int64 { return base.Add(d).UnixNano() }
	long := "orders/" + strings.Repeat("customer-000123/", 8) + "invoice"
	lock := func(name string, mode uint32, agent uint32, pid int, nonce uint64, token uint64, since int64, state, command string) dumpLock {
		h := holder{ProcessAlive: state == agentAlive, HolderCommand: command}
		if h.ProcessAlive {
			h.HolderPID = pid
		}
		return dumpLock{LockInfo: table.LockInfo{Name: name, Mode: mode, Agent: agent, PID: pid, Nonce: nonce, Token: token, Since: since},
			ClientID: inspect.ClientID(nonce), Agent: state, holder: h}
	}
	// shmlocks exec's agents: one whose wrapper (1004) runs, one whose
	// wrapper (1005) was killed while its command's group (2005) holds on.
	execAlive := holder{ProcessAlive: true, Group: 2004, GroupAlive: true, HolderPID: 2004, HolderCommand: "rsync -a /data /backup"}
	execGone := holder{Group: 2005, GroupAlive: true, HolderPID: 2005, HolderCommand: "sleep 300"}
	execLock := func(name string, agent uint32, pid int, nonce, token uint64, state string, h holder) dumpLock {
		return dumpLock{LockInfo: table.LockInfo{Name: name, Mode: table.ModeExclusive, Agent: agent, PID: pid, Nonce: nonce, Token: token, Since: at(85 * time.Minute)},
			ClientID: inspect.ClientID(nonce), Agent: state, holder: h}
	}
	st := &dumpState{
		Time: base.Add(90 * time.Minute), Path: "/run/user/1000/shmlocks.tbl", Size: 4992,
		Geometry: table.Geometry{MaxResources: 8, MaxRequests: 32, MaxAgents: 8, MaxNameLen: 256}, Buckets: 16,
		Created: base, BootID: [16]byte{0xb0, 0x07, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, Nonce: 0x5eed5eed5eed5eed,
		Usage: table.Usage{Entries: 4, Slots: 9, Held: 5, Waiting: 2, Watching: 2, Claimed: 1, Agents: 3},
		Agents: []dumpAgent{
			{Index: 1, PID: 1001, State: "alive", ClientID: "a1", Command: "worker", Held: 2, Since: base.Add(time.Minute)},
			{Index: 2, PID: 1002, State: "alive", ClientID: "5eedc0ffee0a2", Command: "report\x1b[2J", Held: 3, Waiting: 1, Since: base.Add(2 * time.Minute)},
			{Index: 3, PID: 1003, State: "dead", ClientID: "a3", Waiting: 1, Since: base.Add(3 * time.Minute)},
			{Index: 4, PID: 1004, State: agentAlive, ClientID: "a4", Command: "shmlocks exec backup rsync -a /data /backup", Held: 1, Since: base.Add(4 * time.Minute), holder: execAlive},
			{Index: 5, PID: 1005, State: agentWrapperGone, ClientID: "a5", Held: 1, Since: base.Add(5 * time.Minute), holder: execGone},
		},
		Held: []dumpLock{
			lock("invoices", table.ModeExclusive, 1, 1001, 0xa1, 1, at(80*time.Minute), "alive", "worker"),
			lock("reports", table.ModeShared, 1, 1001, 0xa1, 1, at(60*time.Minute), "alive", "worker"),
			lock("reports", table.ModeShared, 2, 1002, 0x5eedc0ffee0a2, 2, 0, "alive", "report\x1b[2J"),
			lock("cache\x00\"odd\"", table.ModeExclusive, 2, 1002, 0x5eedc0ffee0a2, 2, at(89*time.Minute+59*time.Second+999*time.Millisecond+400*time.Microsecond), "alive", "report\x1b[2J"),
			lock(long, table.ModeExclusive, 2, 1002, 0x5eedc0ffee0a2, 7, at(89*time.Minute), "alive", "a-command-name-longer-than-comm"),
			execLock("backup", 4, 1004, 0xa4, 3, agentAlive, execAlive),
			execLock("job", 5, 1005, 0xa5, 4, agentWrapperGone, execGone),
		},
		Pending: []dumpLock{
			lock("invoices", table.ModeShared, 2, 1002, 0x5eedc0ffee0a2, 0, at(85*time.Minute), "alive", "report\x1b[2J"),
			lock("invoices", table.ModeExclusive, 3, 1003, 0xa3, 0, at(89*time.Minute+59*time.Second+500*time.Millisecond), "dead", ""),
		},
		Watching: []dumpLock{
			lock("invoices", table.ModeShared, 1, 1001, 0xa1, 0, at(89*time.Minute+30*time.Second), "alive", "worker"),
			lock("invoices", table.ModeAny, 2, 1002, 0x5eedc0ffee0a2, 0, at(70*time.Minute), "alive", "report\x1b[2J"),
		},
	}
	st.Held[3].Steal = true
	var held, pending []table.LockInfo
	for _, l := range st.Held {
		held = append(held, l.LockInfo)
	}
	for _, l := range st.Pending {
		pending = append(pending, l.LockInfo)
	}
	st.Waits = waitgraph.New(held, pending)
	st.Cycles = st.Waits.Cycles()
	return st
}

// TestRenderDumpGolden: the plain view of a fixed state, off a terminal
// (names whole), compared with the golden file.
func TestRenderDumpGolden(t *testing.T) {
	var got bytes.Buffer
	require.NoError(t, renderDump(&got, goldenState(), 0))
	golden := filepath.Join("testdata", "dump.golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(golden, got.Bytes(), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err, "run with -update to create the golden file")
	require.Equal(t, string(want), got.String())
	require.NotContains(t, got.String(), "\x1b", "escapes never reach the terminal")
}

// On a terminal the lock lines fit its width: the long name is cut with
// "…", the others keep their columns; off a terminal the long name is
// whole and widens its own rows only.
func TestRenderDumpFitsWidth(t *testing.T) {
	st := goldenState()
	long := st.Held[4].Name
	for _, width := range []int{80, 100, 132} {
		var b bytes.Buffer
		require.NoError(t, renderDump(&b, st, width))
		inLocks := false
		for _, l := range strings.Split(b.String(), "\n") {
			if strings.HasPrefix(l, "locks:") {
				inLocks = true
				continue
			}
			if l == "" {
				inLocks = false
			}
			if inLocks {
				require.LessOrEqual(t, utf8.RuneCountInString(l), width, "width %d: %q", width, l)
			}
		}
		require.NotContains(t, b.String(), long, "width %d: the long name is cut", width)
		require.Contains(t, b.String(), "…", "width %d", width)
	}
	var b bytes.Buffer
	require.NoError(t, renderDump(&b, st, 0))
	require.Contains(t, b.String(), long, "off a terminal, names whole")
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, `"invoices"`) || strings.Contains(l, `"reports"`) {
			require.Less(t, utf8.RuneCountInString(l), 160, "a short name's row is not padded for the long one: %q", l)
		}
	}
}

// A table file truncated under the dump is reported as corrupt, never a
// crash; an empty table renders "none".
func TestGatherDumpEmptyAndTruncated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "empty.tbl")
	m, err := manager.Open(path, &manager.OpenOptions{MaxResources: 8, MaxRequests: 32, MaxAgents: 8, MaxNameLen: 32})
	require.NoError(t, err)
	require.NoError(t, m.Close())
	tb, err := table.OpenReadOnly(path)
	require.NoError(t, err)
	defer tb.Close()
	st, err := gatherDump(tb, path, time.Now())
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, renderDump(&out, st, 0))
	require.Contains(t, out.String(), "agents: 0")
	require.Contains(t, out.String(), "locks: none")

	require.NoError(t, os.Truncate(path, 0))
	if _, err := gatherDump(tb, path, time.Now()); err != nil { // some platforms keep the pages readable
		require.ErrorIs(t, err, table.ErrCorrupt)
	}
}

func TestRenderAge(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{0, "0s"},
		{1500 * time.Nanosecond, "2µs"},
		{1234567 * time.Nanosecond, "1ms"},
		{1567 * time.Millisecond, "1.6s"},
		{61*time.Second + 600*time.Millisecond, "1m2s"},
		{90 * time.Minute, "1h30m0s"},
	} {
		require.Equal(t, c.want, renderAge(c.d), "%v", c.d)
	}
}
