package main

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/shmlocks/shmlocks/table"
)

// The plain view of `shmlocks dump`: the header (format, geometry,
// creation time, boot id), usage against the limits, every agent record
// (alive or dead, client id, command, how many requests it holds and waits
// for) and, per name, the held locks and then the pending requests in
// queue order and the watches, with how long each has been held or
// waiting; then whom each waiting request waits for (waits.go).
//
// Its output is a function of st and width only (the golden test pins
// both). width > 0 is the terminal's: the NAME column is cut to fit it,
// with "…". width 0 (not a terminal): names are printed whole and the NAME
// column is at most nameColumnMax wide, so one long name widens its own
// rows only.

// nameColumnMax is the widest NAME column padded for, off a terminal.
const nameColumnMax = 40

// commandColumnMax is the widest COMMAND shown (a command line; the whole
// is in --json).
const commandColumnMax = 24

// clientColumn is the width client ids are right-aligned to: a client id
// is a 64-bit value in hex, up to 16 digits, so ids line up whatever
// their value.
const clientColumn = 16

func renderDump(w io.Writer, st *dumpState, width int) error {
	var buf bytes.Buffer
	g, u := st.Geometry, st.Usage
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "table\t%s\n", st.Path)
	fmt.Fprintf(tw, "format\t%s version %d, %d bytes\n", table.Magic, table.FormatVersion, st.Size)
	fmt.Fprintf(tw, "geometry\t%d names, %d requests, %d agents, names up to %d bytes (%d buckets)\n",
		g.MaxResources, g.MaxRequests, g.MaxAgents, g.MaxNameLen, st.Buckets)
	if st.Bound == 0 {
		fmt.Fprintf(tw, "fairness\t%s (strict arrival order)\n", fairnessText(0))
	} else {
		fmt.Fprintf(tw, "fairness\t%s (a request may take a free name ahead of the queue while its oldest has waited less than %v)\n", fairnessText(st.Bound), st.Bound)
	}
	fmt.Fprintf(tw, "created\t%s (%s ago)\n", st.Created.UTC().Format(time.RFC3339), renderAge(st.Time.Sub(st.Created)))
	bootNote := "this boot"
	if !st.ThisBoot {
		bootNote = "not this boot: the file outlived a reboot"
	}
	fmt.Fprintf(tw, "boot id\t%s (%s)\n", hex.EncodeToString(st.BootID[:]), bootNote)
	fmt.Fprintf(tw, "nonce\t%016x\n", st.Nonce)
	other := ""
	if u.Watching > 0 {
		other = fmt.Sprintf(", watching %d", u.Watching)
	}
	if u.Claimed > 0 {
		other += fmt.Sprintf(", claimed or stolen %d", u.Claimed)
	}
	fmt.Fprintf(tw, "usage\tnames %d/%d, requests %d/%d (held %d, waiting %d%s), agents %d/%d\n",
		u.Entries, g.MaxResources, u.Slots, g.MaxRequests, u.Held, u.Waiting, other, u.Agents, g.MaxAgents)
	fmt.Fprintf(tw, "counters\treaps %d, repairs %d\n", u.Reaps, u.Repairs)
	tw.Flush()

	fmt.Fprintf(&buf, "\nagents: %d\n", len(st.Agents))
	if len(st.Agents) > 0 {
		rows := [][]string{{"INDEX", "PID", "STATE", "COMMAND", "EXEC GROUP", "HELD", "WAITING", "REGISTERED", padClient("CLIENT")}}
		for _, a := range st.Agents {
			rows = append(rows, []string{strconv.FormatUint(uint64(a.Index), 10), strconv.Itoa(a.PID), a.State,
				commandCell(a.Command), groupCell(&a.holder), strconv.Itoa(a.Held), strconv.Itoa(a.Waiting),
				renderAge(st.Time.Sub(a.Since)) + " ago", padClient(a.ClientID)})
		}
		writeColumns(&buf, rows, &nameFit{col: -1, width: width})
	}

	type lockLine struct {
		l    *dumpLock
		kind string // "held", "waiting" or "watching"
	}
	byName := map[string][]lockLine{}
	for i := range st.Held {
		byName[st.Held[i].Name] = append(byName[st.Held[i].Name], lockLine{&st.Held[i], "held"})
	}
	for i := range st.Pending {
		byName[st.Pending[i].Name] = append(byName[st.Pending[i].Name], lockLine{&st.Pending[i], "waiting"})
	}
	for i := range st.Watching { // after the requests: a watch takes no part in grants
		byName[st.Watching[i].Name] = append(byName[st.Watching[i].Name], lockLine{&st.Watching[i], "watching"})
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	slices.Sort(names)
	if len(names) == 0 {
		fmt.Fprintf(&buf, "\nlocks: none\n")
	} else {
		fmt.Fprintf(&buf, "\nlocks: %d names\n", len(names))
		rows := [][]string{{"NAME", "STATE", "MODE", "TOKEN", "PID", "COMMAND", "WRAPPER", "FOR", padClient("CLIENT")}}
		for _, n := range names {
			lines := byName[n]
			// Held by token first; pending keep their queue order, watches
			// their slot order (a stable sort).
			rank := map[string]int{"held": 0, "waiting": 1, "watching": 2}
			slices.SortStableFunc(lines, func(a, b lockLine) int {
				if c := cmp.Compare(rank[a.kind], rank[b.kind]); c != 0 || a.kind != "held" {
					return c
				}
				return cmp.Compare(a.l.Token, b.l.Token)
			})
			for i, ln := range lines {
				l := ln.l
				name := ""
				if i == 0 {
					name = strconv.Quote(n)
				}
				tok := "-"
				if ln.kind == "held" {
					tok = strconv.FormatUint(l.Token, 10)
					if l.Steal {
						tok += " (steal)"
					}
				}
				// The process that holds it as it is: exec's command (its
				// wrapper apart), a dead PID marked dead.
				pid := strconv.Itoa(l.PID)
				switch {
				case l.HolderPID != 0:
					pid = strconv.Itoa(l.HolderPID)
				case l.Agent != agentAlive:
					pid += " (" + agentDead + ")"
				}
				age := "-" // no time recorded (a fast grant a moment old)
				if d, ok := l.age(st.Time); ok {
					age = renderAge(d)
				}
				rows = append(rows, []string{name, ln.kind, modeName(l.Mode), tok, pid, commandCell(l.HolderCommand), wrapperCell(l), age, padClient(l.ClientID)})
			}
		}
		writeColumns(&buf, rows, &nameFit{col: 0, width: width})
	}

	if len(st.Pending) > 0 {
		renderWaits(&buf, st.Waits, st.Cycles) // waits.go
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// nameFit says how writeColumns fits column col (-1: none) and the lines:
// to a terminal of width columns, the column cut with "…" to what the
// others leave of the width (at least 12 columns) and, if that is not
// enough, every line cut at the width (the client id, last, goes first);
// or, with width 0, the column padded to at most nameColumnMax (longer
// cells overflow their own row).
type nameFit struct {
	col, width int
}

// writeColumns writes rows (the first is the header) as columns two
// spaces apart, indented by two, left-aligned; fit, if not nil, bounds
// one column (see nameFit). Widths count runes.
func writeColumns(w *bytes.Buffer, rows [][]string, fit *nameFit) {
	if len(rows) == 0 {
		return
	}
	n := len(rows[0])
	widths := make([]int, n)
	for _, r := range rows {
		for c, cell := range r {
			widths[c] = max(widths[c], utf8.RuneCountInString(cell))
		}
	}
	cut := false
	if fit != nil && fit.col >= 0 {
		if fit.width > 0 {
			rest := 2 // indent
			for c, wd := range widths {
				if c != fit.col {
					rest += wd + 2
				}
			}
			if room := max(fit.width-rest, 12); widths[fit.col] > room {
				widths[fit.col], cut = room, true
			}
		} else {
			widths[fit.col] = min(widths[fit.col], nameColumnMax)
		}
	}
	for _, r := range rows {
		var line strings.Builder
		line.WriteString("  ")
		for c, cell := range r {
			if cut && c == fit.col {
				cell = cutColumns(cell, widths[c])
			}
			line.WriteString(cell)
			if c < n-1 {
				if pad := widths[c] - utf8.RuneCountInString(cell); pad > 0 {
					line.WriteString(strings.Repeat(" ", pad))
				}
				line.WriteString("  ")
			}
		}
		l := strings.TrimRight(line.String(), " ")
		if fit != nil && fit.width > 0 {
			l = cutColumns(l, fit.width)
		}
		w.WriteString(l)
		w.WriteByte('\n')
	}
}

// padClient right-aligns a client id to clientColumn.
func padClient(id string) string {
	if n := clientColumn - len(id); n > 0 {
		return strings.Repeat(" ", n) + id
	}
	return id
}

// groupCell shows an agent's exec group: "-" none, else its id, "(gone)"
// when no process of it runs.
func groupCell(h *holder) string {
	switch {
	case h.Group == 0:
		return "-"
	case h.GroupAlive:
		return strconv.Itoa(h.Group)
	}
	return strconv.Itoa(h.Group) + " (gone)"
}

// wrapperCell shows the exec wrapper of a request: "-" none, else its pid
// and whether it runs.
func wrapperCell(l *dumpLock) string {
	if w := l.Wrapper(); w != "" {
		return strconv.Itoa(l.PID) + " " + w
	}
	return "-"
}

// commandCell shows a command name, "-" if unknown, quoted if it has bytes
// that would upset the terminal, cut to commandColumnMax.
func commandCell(c string) string {
	if c == "" {
		return "-"
	}
	// A command line: its program by base name (ps -o args shows the
	// whole path; the column has no room for it).
	if prog, args, ok := strings.Cut(c, " "); ok || strings.Contains(prog, "/") {
		if i := strings.LastIndexByte(prog, '/'); i >= 0 && i < len(prog)-1 {
			prog = prog[i+1:]
		}
		c = prog
		if ok {
			c += " " + args
		}
	}
	if q := strconv.Quote(c); q[1:len(q)-1] != c {
		c = q
	}
	return cutColumns(c, commandColumnMax)
}

// renderAge formats a duration for the dump: milliseconds below a second,
// tenths of a second below a minute, whole seconds above; negative ages (a
// clock step, or a torn read) print as "0s".
func renderAge(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}
