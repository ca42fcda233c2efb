package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/shmlocks/shmlocks/table"
	"github.com/shmlocks/shmlocks/table/tablemetrics"
)

// The live view of `shmlocks dump --watch` on a terminal: a top-like full
// screen, redrawn in place every interval on the alternate screen (the
// terminal's own contents come back at exit). One line per name, sorted by
// longest wait (then longest hold, then name), with its first holder (mode,
// fencing token, pid, how long held) and how many more, and its queue
// (length by mode, longest wait); a header with usage against the limits,
// agents (dead ones not reaped yet) and reaps per second.

const (
	escAltScreen = "\x1b[?1049h\x1b[?25l" // alternate screen, hide the cursor
	escMainScr   = "\x1b[?25h\x1b[?1049l" // show the cursor, back to the main screen
	escHome      = "\x1b[H"
	escClearEOL  = "\x1b[K"
	escClearEOS  = "\x1b[J"
)

// topFrame is what one frame shows besides the table's state.
type topFrame struct {
	path       string
	interval   time.Duration
	cols, rows int
	reapRate   float64 // reaps per second since the last frame (negative: first frame)
}

// renderTop writes one frame of the live view: at most f.rows lines, each
// cut to f.cols columns and followed by clear-to-end-of-line.
func renderTop(w io.Writer, st *tablemetrics.State, f topFrame) {
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	g, u := st.Geometry, st.Usage
	add("shmlocks dump --watch  %s  %s  (every %v; Ctrl-C quits)", f.path, st.Time.Format("15:04:05"), f.interval)
	rate := "-"
	if f.reapRate >= 0 {
		rate = strconv.FormatFloat(f.reapRate, 'f', 1, 64)
	}
	add("names %d/%d  requests %d/%d (held %d, waiting %d)  longest wait %s",
		u.Entries, g.MaxResources, u.Slots, g.MaxRequests, u.Held, u.Waiting, topAge(st.LongestWait()))
	add("agents %d/%d (%d dead)  reaps %d (%s/s)  repairs %d", st.Agents, g.MaxAgents, st.Dead, u.Reaps, rate, u.Repairs)
	add("")
	add("%-24s %-5s %10s %8s %9s %7s %9s %9s", "NAME", "MODE", "TOKEN", "PID", "HELD FOR", "+HOLDERS", "WAITING", "LONGEST")
	room := f.rows - len(lines)
	for i, n := range st.Names {
		if room <= 1 && i < len(st.Names)-1 || room <= 0 {
			add("... %d more names", len(st.Names)-i)
			break
		}
		mode, token, pid, held, more := "-", "-", "-", "-", ""
		if len(n.Holders) > 0 {
			h := n.Holders[0]
			mode = "excl"
			if h.Mode == table.ModeShared {
				mode = "shrd"
			}
			token = strconv.FormatUint(h.Token, 10)
			pid = strconv.Itoa(h.PID)
			if h.Dead {
				pid += "†"
			}
			if h.Held > 0 {
				held = topAge(h.Held)
			}
			if len(n.Holders) > 1 {
				more = "+" + strconv.Itoa(len(n.Holders)-1)
			}
		}
		waiting, longest := "0", "-"
		if n.Waiting > 0 {
			waiting = fmt.Sprintf("%d (%dx/%ds)", n.Waiting, n.WaitingExclusive, n.WaitingShared)
			longest = topAge(n.LongestWait)
		}
		add("%-24s %-5s %10s %8s %9s %7s %9s %9s", topName(n.Name, 24), mode, token, pid, held, more, waiting, longest)
		room--
	}
	if len(st.Names) == 0 {
		add("(no lock is held or waited for)")
	}
	var b bytes.Buffer
	b.WriteString(escHome)
	for i, l := range lines {
		if f.rows > 0 && i >= f.rows {
			break
		}
		if f.cols > 0 {
			l = cutColumns(l, f.cols)
		}
		b.WriteString(l)
		b.WriteString(escClearEOL)
		if i < len(lines)-1 && (f.rows <= 0 || i < f.rows-1) {
			b.WriteString("\r\n")
		}
	}
	b.WriteString(escClearEOS)
	w.Write(b.Bytes())
}

// topName shows a name in at most n columns: quoted if it has bytes that
// would upset the terminal, cut with "…" if longer.
func topName(s string, n int) string {
	q := strconv.Quote(s)
	if q[1:len(q)-1] != s {
		s = q
	}
	return cutColumns(s, n)
}

// cutColumns cuts s to n runes (the view assumes one column per rune).
func cutColumns(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	if n <= 1 {
		return string(r[:n])
	}
	return string(r[:n-1]) + "…"
}

// topAge formats a duration for the view as the dump does, "-" for none.
func topAge(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return table.RenderAge(d)
}

// runTop runs the live view on the terminal out until ctx ends. The
// terminal's size is looked up on every frame (a resize takes effect at the
// next one).
func runTop(ctx context.Context, t *table.Table, path string, out *os.File, interval time.Duration) error {
	io.WriteString(out, escAltScreen)
	defer io.WriteString(out, escMainScr)
	var lastReaps uint64
	var lastAt time.Time
	for {
		now := time.Now()
		st, err := tablemetrics.Gather(t, now)
		if err != nil {
			return err
		}
		f := topFrame{path: path, interval: interval, cols: 80, rows: 24, reapRate: -1}
		if c, r, ok := termSize(out); ok {
			f.cols, f.rows = c, r
		}
		if !lastAt.IsZero() {
			f.reapRate = float64(st.Usage.Reaps-lastReaps) / now.Sub(lastAt).Seconds()
		}
		lastReaps, lastAt = st.Usage.Reaps, now
		renderTop(out, &st, f)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}
