package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/table"
	"github.com/shmlocks/shmlocks/table/tablemetrics"
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
