package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/tablemetrics"
	"github.com/shmlocks/shmlocks/table"
)

// The view fits the terminal: at most rows lines of at most cols columns,
// a "more names" line when the names do not fit, awkward names quoted.
func TestRenderTopFits(t *testing.T) {
	st := &tablemetrics.State{Time: time.Unix(0, 0), Geometry: table.Geometry{MaxResources: 16, MaxRequests: 64, MaxAgents: 8}}
	for i := range 30 {
		st.Names = append(st.Names, tablemetrics.Name{Name: strings.Repeat("n", i) + "\x1b[2J", Waiting: 1, WaitingExclusive: 1,
			LongestWait: time.Duration(30-i) * time.Second,
			Holders:     []tablemetrics.Holder{{Mode: table.ModeExclusive, Token: uint64(i), PID: 42, Held: time.Second}}})
	}
	var b bytes.Buffer
	renderTop(&b, st, topFrame{path: "/t", interval: time.Second, cols: 60, rows: 12, reapRate: 0.5})
	s := b.String()
	require.True(t, strings.HasPrefix(s, escHome))
	require.True(t, strings.HasSuffix(s, escClearEOS))
	lines := strings.Split(strings.TrimSuffix(strings.TrimPrefix(s, escHome), escClearEOS), "\r\n")
	require.Len(t, lines, 12)
	for _, l := range lines {
		l = strings.TrimSuffix(l, escClearEOL)
		require.LessOrEqual(t, len([]rune(l)), 60, "%q", l)
		require.NotContains(t, l, "\x1b", "names are quoted, escapes never reach the terminal: %q", l)
	}
	require.Contains(t, lines[11], "more names")
	require.Contains(t, lines[2], "(0.5/s)")
	require.Contains(t, lines[5], `"\x1b[2J"`, "the longest wait first")
}

// Each holder's command and hold time are shown when the terminal has room
// for them beside a name; a narrow one drops COMMAND rather than the queue.
// The order follows the sort key.
func TestRenderTopColumnsAndSort(t *testing.T) {
	st := &tablemetrics.State{Time: time.Unix(0, 0), Geometry: table.Geometry{MaxResources: 16, MaxRequests: 64, MaxAgents: 8}}
	st.Names = []tablemetrics.Name{
		{Name: "b-waited", Waiting: 1, WaitingExclusive: 1, LongestWait: 3 * time.Second, LongestHold: time.Second,
			Holders: []tablemetrics.Holder{{Mode: table.ModeExclusive, Token: 7, PID: 42, Held: time.Second}}},
		{Name: "a-held-long", LongestHold: time.Hour,
			Holders: []tablemetrics.Holder{{Mode: table.ModeExclusive, Token: 9, PID: 43, Held: time.Hour}}},
		{Name: "c-fresh", LongestHold: time.Millisecond,
			Holders: []tablemetrics.Holder{{Mode: table.ModeShared, Token: 1, PID: 44, Held: time.Millisecond}, {Mode: table.ModeShared, Token: 2, PID: 45}}},
	}
	command := func(pid int) string { return map[int]string{42: "worker", 43: "cron-job", 44: "report"}[pid] }
	frame := func(cols int, order topSort) []string {
		var b bytes.Buffer
		sortNames(st.Names, order)
		renderTop(&b, st, topFrame{path: "/t", interval: time.Second, cols: cols, rows: 20, sort: order, keys: true, command: command})
		out := strings.NewReplacer(escHome, "", escClearEOL, "", escClearEOS, "").Replace(b.String())
		return strings.Split(out, "\r\n")
	}
	lines := frame(120, sortWait)
	require.Contains(t, lines[0], "sorted by longest wait (w/h/n/s sort, q quits)")
	require.Regexp(t, `^NAME\s+MODE\s+TOKEN\s+PID\s+COMMAND\s+HELD FOR\s+\+HOLDERS\s+WAITING\s+LONGEST$`, lines[4])
	require.Regexp(t, `^b-waited\s+excl\s+7\s+42\s+worker\s+1s\s+1 \(1x/0s\)\s+3s$`, lines[5])
	require.Regexp(t, `^a-held-long\s+excl\s+9\s+43\s+cron-job\s+1h0m0s\s+0\s+-$`, lines[6])
	require.Regexp(t, `^c-fresh\s+shrd\s+1\s+44\s+report\s+1ms\s+\+1\s+0\s+-$`, lines[7])

	lines = frame(120, sortHold)
	require.Contains(t, lines[0], "sorted by longest hold")
	require.True(t, strings.HasPrefix(lines[5], "a-held-long") && strings.HasPrefix(lines[6], "b-waited") && strings.HasPrefix(lines[7], "c-fresh"), "%q", lines[5:8])
	lines = frame(120, sortName)
	require.Contains(t, lines[0], "sorted by name")
	require.True(t, strings.HasPrefix(lines[5], "a-held-long") && strings.HasPrefix(lines[6], "b-waited") && strings.HasPrefix(lines[7], "c-fresh"), "%q", lines[5:8])

	// 60 columns: TOKEN and +HOLDERS go too; the queue stays.
	lines = frame(60, sortWait)
	require.Regexp(t, `^NAME\s+MODE\s+PID\s+HELD FOR\s+WAITING\s+LONGEST$`, lines[4])
	require.Regexp(t, `^b-waited\s+excl\s+42\s+1s\s+1 \(1x/0s\)\s+3s$`, lines[5])

	lines = frame(80, sortWait)
	require.NotContains(t, lines[4], "COMMAND", "80 columns: no room for the command beside a name")
	require.Regexp(t, `^b-waited\s+excl\s+7\s+42\s+1s\s+1 \(1x/0s\)\s+3s$`, lines[5], "the queue columns stay")
	for _, l := range lines {
		require.LessOrEqual(t, len([]rune(l)), 80, "%q", l)
	}
}

// An exec grant whose wrapper died: the view shows the command's pid (a
// running member of the co-owning group) and command, marked "*" with a
// note, never the dead wrapper's pid as the holder.
func TestRenderTopExecHolder(t *testing.T) {
	st := &tablemetrics.State{Time: time.Unix(0, 0), Geometry: table.Geometry{MaxResources: 16, MaxRequests: 64, MaxAgents: 8}}
	st.Names = []tablemetrics.Name{{Name: "job", LongestHold: time.Second,
		Holders: []tablemetrics.Holder{{Mode: table.ModeExclusive, Token: 3, PID: 1005, Held: time.Second, Group: 2005, GroupAlive: true}}}}
	var b bytes.Buffer
	renderTop(&b, st, topFrame{path: "/t", interval: time.Second, cols: 120, rows: 20,
		command: func(pid int) string { return map[int]string{2005: "sleep 300"}[pid] },
		member:  func(pgid int) int { return pgid }})
	out := strings.NewReplacer(escHome, "", escClearEOL, "", escClearEOS, "").Replace(b.String())
	require.Regexp(t, `job\s+excl\s+3\s+2005\*\s+sleep 300\s+1s`, out)
	require.NotContains(t, out, "1005")
	require.Contains(t, out, "* the shmlocks exec wrapper is gone; its command's process group holds the lock")
}
