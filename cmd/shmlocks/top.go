package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shmlocks/shmlocks/internal/tablemetrics"
	"github.com/shmlocks/shmlocks/table"
)

// The live view of `shmlocks dump --watch` on a terminal: a top-like full
// screen, redrawn in place every interval on the alternate screen (the
// terminal's own contents come back at exit). One line per name with its
// first holder (mode, fencing token, pid, command, how long held) and how
// many more, and its queue (length by mode, longest wait); a header with
// usage against the limits, agents (dead ones not reaped yet) and reaps
// per second. Keys, read from standard input in cbreak mode (not echoed,
// no Enter needed; the terminal's settings are restored at exit, and at
// Ctrl-Z until the SIGCONT of fg: topScreen): q quits
// (as Ctrl-C does), w, h and n sort by longest wait, longest hold or name,
// s cycles through the three. A table that does not exist yet is waited
// for; a replaced one is re-opened (tableSource, as serve does).

const (
	escAltScreen = "\x1b[?1049h\x1b[?25l" // alternate screen, hide the cursor
	escMainScr   = "\x1b[?25h\x1b[?1049l" // show the cursor, back to the main screen
	escHome      = "\x1b[H"
	escClearEOL  = "\x1b[K"
	escClearEOS  = "\x1b[J"
)

// topSort is the order of the names in the view.
type topSort int

const (
	sortWait topSort = iota // longest wait first, then longest hold, then name
	sortHold                // longest hold first, then longest wait, then name
	sortName                // by name
)

func (s topSort) String() string {
	return [...]string{"longest wait", "longest hold", "name"}[s]
}

// sortNames orders names by s.
func sortNames(names []tablemetrics.Name, s topSort) {
	slices.SortStableFunc(names, func(a, b tablemetrics.Name) int {
		var c int
		switch s {
		case sortWait:
			c = cmp.Or(cmp.Compare(b.LongestWait, a.LongestWait), cmp.Compare(b.LongestHold, a.LongestHold))
		case sortHold:
			c = cmp.Or(cmp.Compare(b.LongestHold, a.LongestHold), cmp.Compare(b.LongestWait, a.LongestWait))
		}
		return cmp.Or(c, cmp.Compare(a.Name, b.Name))
	})
}

// topFrame is what one frame shows besides the table's state.
type topFrame struct {
	path       string
	interval   time.Duration
	cols, rows int
	reapRate   float64 // reaps per second since the last frame (negative: first frame)
	sort       topSort
	keys       bool                 // keys are read (the header says which)
	command    func(pid int) string // the command of a holder's process ("" unknown); nil: none
	member     func(pgid int) int   // a running process of a process group (0 none); nil: none
}

// topColumns are the columns of a name line after NAME, in display
// order, with their widths; drop ranks what a narrow terminal gives up
// first (1 first; 0 never): the queue (WAITING, LONGEST) stays.
var topColumns = []struct {
	head  string
	width int
	left  bool
	drop  int
}{
	{"MODE", 5, true, 6},
	{"TOKEN", 10, false, 3},
	{"PID", 8, false, 5},
	{"COMMAND", 15, true, 1},
	{"HELD FOR", 9, false, 4},
	{"+HOLDERS", 8, false, 2},
	{"WAITING", 11, false, 0},
	{"LONGEST", 9, false, 0},
}

// topKept returns which topColumns fit beside a NAME of at least 12
// columns in cols (0: all).
func topKept(cols int) []bool {
	keep := make([]bool, len(topColumns))
	width := 12
	for i, c := range topColumns {
		keep[i] = true
		width += c.width + 1
	}
	for rank := 1; cols > 0 && width > cols && rank <= 6; rank++ {
		for i, c := range topColumns {
			if c.drop == rank {
				keep[i] = false
				width -= c.width + 1
			}
		}
	}
	return keep
}

// renderTop writes one frame of the live view: at most f.rows lines, each
// cut to f.cols columns and followed by clear-to-end-of-line. The names
// are shown in st's order.
func renderTop(w io.Writer, st *tablemetrics.State, f topFrame) {
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	g, u := st.Geometry, st.Usage
	// The path last: a narrow terminal cuts it first.
	add("shmlocks dump --watch  %s  sorted by %s (%s)  every %v  %s", st.Time.Format("15:04:05"), f.sort, topKeysHelp(f.keys), f.interval, f.path)
	rate := "-"
	if f.reapRate >= 0 {
		rate = strconv.FormatFloat(f.reapRate, 'f', 1, 64)
	}
	add("names %d/%d  requests %d/%d (held %d, waiting %d)  longest wait %s",
		u.Entries, g.MaxResources, u.Slots, g.MaxRequests, u.Held, u.Waiting, topAge(st.LongestWait()))
	add("agents %d/%d (%d dead)  reaps %d (%s/s)  repairs %d", st.Agents, g.MaxAgents, st.Dead, u.Reaps, rate, u.Repairs)
	add("")
	// NAME takes what the kept columns leave of the width (at least 12
	// columns), and no more than the longest name needs.
	keep := topKept(f.cols)
	fixed := 0
	for i, c := range topColumns {
		if keep[i] {
			fixed += c.width + 1
		}
	}
	longest := 4
	for _, n := range st.Names {
		longest = max(longest, len([]rune(quoteName(n.Name))))
	}
	nameW := longest
	if f.cols > 0 {
		nameW = min(longest, max(12, f.cols-fixed))
	}
	line := func(name string, cells ...string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "%-*s", nameW, name)
		for i, c := range topColumns {
			if !keep[i] {
				continue
			}
			if c.left {
				fmt.Fprintf(&b, " %-*s", c.width, cells[i])
			} else {
				fmt.Fprintf(&b, " %*s", c.width, cells[i])
			}
		}
		return strings.TrimRight(b.String(), " ")
	}
	heads := make([]string, len(topColumns))
	for i, c := range topColumns {
		heads[i] = c.head
	}
	add("%s", line("NAME", heads...))
	room := f.rows - len(lines)
	wrapperGone := false
	for i, n := range st.Names {
		if room <= 1 && i < len(st.Names)-1 || room <= 0 {
			add("... %d more names", len(st.Names)-i)
			break
		}
		mode, token, pid, command, held, more := "-", "-", "-", "-", "-", ""
		if len(n.Holders) > 0 {
			h := n.Holders[0]
			mode = "excl"
			if h.Mode == table.ModeShared {
				mode = "shrd"
			}
			token = strconv.FormatUint(h.Token, 10)
			// The process that holds it as it is: for shmlocks exec the
			// command (its group's running member), "*" when its wrapper
			// (h.PID) is gone; a dead PID is marked dead.
			hp := h.PID
			if h.Group != 0 && h.GroupAlive && f.member != nil {
				if m := f.member(h.Group); m != 0 {
					hp = m
				}
			}
			pid = strconv.Itoa(hp)
			switch {
			case h.Dead:
				pid = strconv.Itoa(h.PID) + "†"
			case f.command != nil:
				command = cutColumns(commandCell(f.command(hp)), 15)
			}
			if !h.Dead && h.Group != 0 && !h.ProcessAlive {
				pid += "*"
				wrapperGone = true
			}
			held = topAge(h.Held)
			if len(n.Holders) > 1 {
				more = "+" + strconv.Itoa(len(n.Holders)-1)
			}
		}
		waiting, longestWait := "0", "-"
		if n.Waiting > 0 {
			waiting = fmt.Sprintf("%d (%dx/%ds)", n.Waiting, n.WaitingExclusive, n.WaitingShared)
			longestWait = topAge(n.LongestWait)
		}
		add("%s", line(cutColumns(quoteName(n.Name), nameW), mode, token, pid, command, held, more, waiting, longestWait))
		room--
	}
	if wrapperGone && room > 0 {
		add("* the shmlocks exec wrapper is gone; its command's process group holds the lock")
	}
	if len(st.Names) == 0 {
		add("(no lock is held or waited for)")
	}
	writeFrame(w, lines, f)
}

// topKeysHelp is the header's reminder of the keys.
func topKeysHelp(keys bool) string {
	if !keys {
		return "Ctrl-C quits"
	}
	return "w/h/n/s sort, q quits"
}

// renderWaiting is the frame shown while there is no table at the path.
func renderWaiting(w io.Writer, now time.Time, err error, f topFrame) {
	writeFrame(w, []string{
		fmt.Sprintf("shmlocks dump --watch  %s  (%s)  every %v  %s", now.Format("15:04:05"), topKeysHelp(f.keys), f.interval, f.path),
		"",
		fmt.Sprintf("no table here yet (%v); waiting for it", err),
	}, f)
}

// writeFrame writes lines from the top left corner, cut to the frame's
// size, each followed by clear-to-end-of-line, then clears the rest.
func writeFrame(w io.Writer, lines []string, f topFrame) {
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

// quoteName is a name as the views show it: quoted if it has bytes that
// would upset the terminal.
func quoteName(s string) string {
	if q := strconv.Quote(s); q[1:len(q)-1] != s {
		return q
	}
	return s
}

// cutColumns cuts s to n runes, the last one "…" (the view assumes one
// column per rune).
func cutColumns(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	if n <= 1 {
		return string(r[:max(n, 0)])
	}
	return string(r[:n-1]) + "…"
}

// topAge formats a duration for the view as the dump does, "-" for none.
func topAge(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return renderAge(d)
}

// runTop runs the live view on the terminal out until ctx ends or q is
// typed on in (nil, or not a terminal: no keys). The terminal's size is
// looked up on every frame (a resize takes effect at the next one).
func runTop(ctx context.Context, src *tableSource, path string, out, in *os.File, interval time.Duration) error {
	scr := &topScreen{out: out, in: in}
	var keys <-chan byte
	if scr.enter() {
		done := make(chan struct{})
		defer close(done)
		keys = readKeys(in, done)
	}
	defer scr.leave()
	jobs, stopJobs := jobSignals()
	defer stopJobs()
	var lastReaps uint64
	var lastAt time.Time
	order := sortWait
	commands := map[int]string{}
	tick := time.NewTimer(0)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case k := <-keys:
			switch k {
			case 'q', 'Q', 0x03, 0x04: // q, Ctrl-C (without ISIG), Ctrl-D
				return nil
			case 'w', 'W':
				order = sortWait
			case 'h', 'H':
				order = sortHold
			case 'n', 'N':
				order = sortName
			case 's', 'S':
				order = (order + 1) % 3
			default:
				continue
			}
			// A new order: redraw now (the next refresh keeps its time).
		case <-tick.C:
			tick.Reset(interval)
		case sig := <-jobs:
			if isSuspend(sig) {
				// Ctrl-Z: the shell gets its terminal back as it was
				// (echo, line editing, the main screen), then we stop,
				// and draw nothing until continued.
				scr.leave()
				if !suspended(ctx, jobs) {
					return nil
				}
			}
			// Continued (fg or bg; or a stray SIGCONT): take the screen
			// again and redraw now.
			scr.enter()
		}
		now := time.Now()
		f := topFrame{path: path, interval: interval, cols: 80, rows: 24, reapRate: -1, sort: order, keys: keys != nil}
		if c, r, ok := termSize(out); ok {
			f.cols, f.rows = c, r
		}
		t, err := src.get()
		if errors.Is(err, fs.ErrNotExist) {
			renderWaiting(out, now, err, f)
			lastAt = time.Time{}
			continue
		}
		if err != nil {
			return err
		}
		st, err := tablemetrics.Gather(t, now)
		if err != nil {
			return err
		}
		if !lastAt.IsZero() {
			f.reapRate = float64(st.Usage.Reaps-lastReaps) / now.Sub(lastAt).Seconds()
		}
		lastReaps, lastAt = st.Usage.Reaps, now
		sortNames(st.Names, order)
		clear(commands) // a command is looked up once per frame and pid
		f.command = func(pid int) string {
			c, ok := commands[pid]
			if !ok {
				c = procCmdline(pid)
				commands[pid] = c
			}
			return c
		}
		f.member = groupMember
		renderTop(out, &st, f)
	}
}

// suspended stops this process (suspendSelf) and returns once the notice
// of the SIGCONT that continued it is read from jobs (stopping again for
// a Ctrl-Z typed meanwhile); false: ctx ended first.
func suspended(ctx context.Context, jobs <-chan os.Signal) bool {
	suspendSelf()
	for {
		select {
		case sig := <-jobs:
			if !isSuspend(sig) {
				return true
			}
			suspendSelf()
		case <-ctx.Done():
			return false
		}
	}
}

// topScreen is the terminal as the live view holds it: the alternate
// screen, and in's settings in cbreak mode (keyMode) while in is a
// terminal. Ctrl-Z leaves it and the SIGCONT after takes it again.
type topScreen struct {
	out, in *os.File
	shown   bool   // on the alternate screen
	restore func() // puts in's settings back (nil: keyMode not in effect)
}

// enter takes the screen if it is not held, and reports whether keys are
// read in cbreak mode.
func (s *topScreen) enter() bool {
	if !s.shown {
		io.WriteString(s.out, escAltScreen)
		s.shown = true
		if s.in != nil {
			if restore, ok := keyMode(s.in); ok {
				s.restore = restore
			}
		}
	}
	return s.restore != nil
}

// leave gives the terminal back as enter found it, if it is held.
func (s *topScreen) leave() {
	if !s.shown {
		return
	}
	if s.restore != nil {
		s.restore()
		s.restore = nil
	}
	io.WriteString(s.out, escMainScr)
	s.shown = false
}

// readKeys reads single bytes from in (in cbreak mode, whose reads return
// at least every 0.1 s) until done is closed.
func readKeys(in *os.File, done <-chan struct{}) <-chan byte {
	keys := make(chan byte, 16)
	go func() {
		buf := make([]byte, 16)
		for {
			n, err := in.Read(buf)
			for _, k := range buf[:n] {
				select {
				case keys <- k:
				case <-done:
					return
				}
			}
			select {
			case <-done:
				return
			default:
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return
			}
		}
	}()
	return keys
}
