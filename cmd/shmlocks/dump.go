package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/shmlocks/shmlocks/coalesce"
	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/table"
)

const dumpAbout = `Show a lock table: its header (size, version, geometry, creation time,
boot id and whether it is this boot's), usage against the limits, every
agent (index, PID, alive or dead, client id, held and pending counts) and,
per name, the held locks and then the pending requests in queue order, with
mode, client, PID, fencing token and how long held or waiting.

The plain view and --json map the file read-only: they never latch, never
write and never block the holders; a live table may be caught mid-update,
and requests of dead agents that nobody has reaped yet are shown (marked
dead). --json prints the shape of manager.Query's snapshot:
{"held":[{"name","mode","clientId","pid"}...],"pending":[...]}.

--watch on a terminal is a top-like live view, redrawn in place every
--interval on the alternate screen: usage against the limits, agents (dead
ones not yet reaped), reaps per second, and one line per name, sorted by
longest wait: its first holder (mode, fencing token, pid, how long held),
how many more holders, its queue length (exclusive/shared) and longest
wait. Not on a terminal (or with --json), --watch prints the dump again
every --interval.

The plain view and --check also list, for each waiting request, whom it
waits for (the holders of its name and the requests queued ahead of it whose
mode conflicts with its own, like PostgreSQL's pg_blocking_pids), and the
wait-for cycles (deadlocks) through holds whose task waits: see
docs/multi-and-deadlock.md.

--check instead opens the table read-write as a temporary agent (which also
reaps dead agents), runs the table's consistency checker with every bucket
latched, validates the coalesce package's outcome files beside the table
(PATH.coalesce/), prints what it finds and closes again.

Exit status: 0 ok; 1 missing or unreadable table, or --check found
violations or a wait-for cycle; 64 usage error; 65 corrupt table (the
message names the field).

%s`

const dumpExamples = `  shmlocks dump
  shmlocks dump --table /run/user/1000/app.locks
  shmlocks dump --json | jq '.held[] | select(.mode == "exclusive")'
  shmlocks dump --watch --interval 500ms
  shmlocks dump --check`

func runDump(args []string, stdout, stderr io.Writer) int {
	f := newFlags("dump", "shmlocks dump [--table PATH] [--json] [--watch [--interval DUR] | --check]",
		fmt.Sprintf(dumpAbout, tableHelp()), dumpExamples, stdout, stderr)
	tbl := f.String("table", "", "table file (default: see 'Table location')")
	asJSON := f.Bool("json", false, "print the held and pending requests as JSON")
	watch := f.Bool("watch", false, "on a terminal: a top-like live view, names by longest wait; otherwise: the dump again every --interval; until interrupted (Ctrl-C)")
	interval := f.Duration("interval", time.Second, "refresh interval of --watch")
	check := f.Bool("check", false, "open read-write, run the consistency checker, exit 1 on any violation")
	if code, ok := f.parse(args); !ok {
		return code
	}
	if f.NArg() > 0 {
		return f.usageError("unexpected argument %q", f.Arg(0))
	}
	if *check && (*watch || *asJSON) {
		return f.usageError("--check does not combine with --watch or --json")
	}
	if *interval <= 0 {
		return f.usageError("--interval must be positive")
	}
	path := *tbl
	if path == "" {
		path = defaultTablePath()
	}
	fail := func(code int, format string, args ...any) int {
		fmt.Fprintf(stderr, "shmlocks dump: %s\n", fmt.Sprintf(format, args...))
		return code
	}
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fail(exitFailure, "no table at %s (see 'shmlocks dump --help' for the default location)", path)
		}
		return fail(exitFailure, "%v", err)
	}
	openErr := func(err error) int {
		if errors.Is(err, table.ErrCorrupt) {
			return fail(exitCorrupt, "%s is not a valid lock table: %v", path, err)
		}
		return fail(exitFailure, "%s: %v", path, err)
	}
	if *check {
		return dumpCheck(path, stdout, stderr, openErr)
	}

	t, err := table.OpenReadOnly(path)
	if err != nil {
		return openErr(err)
	}
	defer t.Close()
	show := func(w io.Writer) error {
		if *asJSON {
			return dumpJSON(t, w)
		}
		fmt.Fprintf(w, "table     %s\n", path)
		if err := t.Render(w, time.Now()); err != nil {
			return err
		}
		held, pending, err := t.Snapshot(nil)
		if err == nil {
			// Read once without latching: a cycle shown may be a phantom of
			// a table that changed while it was read; --check reads twice.
			g := table.NewWaitFor(held, pending)
			renderWaits(w, g, g.Cycles()) // waits.go
		}
		return err
	}
	if !*watch {
		var buf bytes.Buffer
		if err := show(&buf); err != nil {
			return openErr(err)
		}
		stdout.Write(buf.Bytes())
		return exitOK
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tty := false
	if f, ok := stdout.(*os.File); ok {
		tty = isTerminal(f)
		if tty && !*asJSON {
			// A terminal gets the full-screen live view (top.go).
			if err := runTop(ctx, t, path, f, *interval); err != nil {
				return openErr(err)
			}
			return exitOK
		}
	}
	for first := true; ; first = false {
		var buf bytes.Buffer
		switch {
		case tty:
			buf.WriteString("\x1b[H\x1b[2J") // home, clear: redraw in place
		case !first && !*asJSON:
			buf.WriteString("\n")
		}
		if err := show(&buf); err != nil {
			return openErr(err)
		}
		if tty {
			fmt.Fprintf(&buf, "\nrefreshing every %v; Ctrl-C to stop\n", *interval)
		}
		if _, err := stdout.Write(buf.Bytes()); err != nil {
			return fail(exitFailure, "%v", err)
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-time.After(*interval):
		}
	}
}

// dumpJSON prints the snapshot in manager.Snapshot's shape (never null arrays).
func dumpJSON(t *table.Table, w io.Writer) error {
	held, pending, err := t.Snapshot(nil)
	if err != nil {
		return err
	}
	conv := func(in []table.LockInfo) []manager.LockInfo {
		out := make([]manager.LockInfo, 0, len(in))
		for _, li := range in {
			if li.Mode != table.ModeExclusive && li.Mode != table.ModeShared {
				continue // torn read of a slot being reused
			}
			out = append(out, manager.LockInfo{Name: li.Name, Mode: manager.Mode(li.Mode),
				ClientID: manager.ClientIDOf(li.Nonce), PID: li.PID})
		}
		return out
	}
	b, err := json.MarshalIndent(manager.Snapshot{Held: conv(held), Pending: conv(pending)}, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// dumpCheck opens the table as an agent and runs the consistency checker.
func dumpCheck(path string, stdout, stderr io.Writer, openErr func(error) int) int {
	m, err := manager.Open(path, nil)
	if err != nil {
		return openErr(err)
	}
	defer m.Close()
	if err := m.Check(); err != nil {
		fmt.Fprintf(stderr, "shmlocks dump --check: %s: %v\n", path, err)
		return exitFailure
	}
	// The coalesce package's outcome files beside the table (docs/coalesce.md).
	if err := coalesce.New(m).Check(); err != nil {
		fmt.Fprintf(stderr, "shmlocks dump --check: %s: %v\n", path, err)
		return exitFailure
	}
	u := m.Table().Usage()
	// Our own agent is counted in Usage; report the others.
	fmt.Fprintf(stdout, "%s: consistent (%d other agents, %d held, %d waiting)\n", path, u.Agents-1, u.Held, u.Waiting)
	g, cycles, err := confirmedCycles(m.Table(), m.Agent())
	if err != nil {
		fmt.Fprintf(stderr, "shmlocks dump --check: %s: %v\n", path, err)
		return exitFailure
	}
	renderWaits(stdout, g, cycles)
	if len(cycles) > 0 {
		fmt.Fprintf(stderr, "shmlocks dump --check: %s: %d wait-for cycles (deadlocks)\n", path, len(cycles))
		return exitFailure
	}
	return exitOK
}
