package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/shmlocks/shmlocks/coalesce"
	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/table"
)

const dumpAbout = `Show a lock table: its header (size, version, geometry, creation time,
boot id and whether it is this boot's), usage against the limits, every
agent (index, PID, alive or dead, client id, command, held and pending
counts) and, per name, the held locks and then the pending requests in
queue order, with mode, fencing token, PID, client id, the command of the
process (from /proc, like lslocks) and how long held or waiting. Every
grant has its time: a lock granted at once is stamped from a clock each
process refreshes every 0.1 s, so its time may read up to 0.1 s long.
On a terminal long names are cut to its width with "…"; otherwise they
are printed whole.

The plain view and --json map the file read-only: they never latch, never
write and never block the holders; a live table may be caught mid-update,
and requests of dead agents that nobody has reaped yet are shown (marked
dead). --json prints everything the plain view shows as one JSON document
(the fields of manager.Query's snapshot, "held" and "pending", and more:
see docs/cli.md); a name that is not valid UTF-8 has its exact bytes in
"nameBase64" beside "name".

--watch on a terminal is a top-like live view, redrawn in place every
--interval on the alternate screen: usage against the limits, agents (dead
ones not yet reaped), reaps per second, and one line per name: its first
holder (mode, fencing token, pid, command, how long held), how many more
holders, its queue length (exclusive/shared) and longest wait. Keys: q or
Ctrl-C quits; w sorts by longest wait, h by longest hold, n by name, s
cycles through them (the header shows which); Ctrl-Z stops the view with
the terminal as it was, fg resumes it. Not on a terminal, --watch
prints the dump again every --interval, and --watch --json prints one JSON
document per line every --interval, each with its "time". --watch waits for
a table that does not exist yet and re-opens a table file that was
replaced.

The plain view and --check also list, for each waiting request, whom it
waits for (the holders of its name and the requests queued ahead of it whose
mode conflicts with its own, like PostgreSQL's pg_blocking_pids), and the
wait-for cycles (deadlocks) through holds whose task waits: see
docs/multi-and-deadlock.md.

--check instead opens the table read-write as a temporary agent (which also
reaps dead agents), runs the table's consistency checker with every bucket
latched, validates the coalesce package's outcome files beside the table
(PATH.coalesce/), prints what it finds and closes again.

Exit status: 0 ok; 1 --check found violations or a wait-for cycle; 64
usage error; 65 not a lock table this build reads (the message names the
field, or the format version); 66 the table cannot be opened (missing,
not a regular file, permission, unsafe location); 71 internal error.

%s`

const dumpExamples = `  shmlocks dump
  shmlocks dump --table /run/user/1000/app.locks
  shmlocks dump --json | jq '.held[] | select(.heldSeconds > 60)'
  shmlocks dump --watch --json --interval 10s >> locks.jsonl
  shmlocks dump --watch --interval 500ms
  shmlocks dump --check`

// minInterval is the shortest --interval: a shorter one would spin.
const minInterval = 10 * time.Millisecond

func runDump(args []string, stdout, stderr io.Writer) int {
	f := newFlags("dump", "shmlocks dump [--table PATH] [--json] [--watch [--interval DUR] | --check]",
		fmt.Sprintf(dumpAbout, tableHelp()), dumpExamples, stdout, stderr)
	tbl := f.String("table", "", "table file (default: see 'Table location')")
	asJSON := f.Bool("json", false, "print the dump as one JSON document (with --watch: one per line and refresh)")
	watch := f.Bool("watch", false, "on a terminal: a top-like live view (keys: q quits, w/h/n sort); otherwise: the dump again every --interval; until interrupted (Ctrl-C)")
	interval := new(time.Duration)
	f.Var(newDuration(interval, time.Second), "interval", "refresh interval of --watch: seconds (2, 0.5) or a duration (500ms), at least 10ms")
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
	if *interval < minInterval {
		return f.usageError("--interval %v is below the minimum of %v", *interval, minInterval)
	}
	path := *tbl
	if path == "" {
		path = defaultTablePath()
	}
	fail := func(code int, format string, args ...any) int { return failf(stderr, "dump", code, format, args...) }
	// Every error of opening or reading the table: 65 not a table, 66
	// cannot open (missing, not a regular file, permission, unsafe), 71
	// anything else (exitcode.go).
	openErr := func(err error) int { return tableFail(stderr, "dump", path, err, exitNoTable) }
	if _, err := os.Stat(path); err != nil && !*watch {
		return openErr(err)
	}
	if *check {
		return dumpCheck(path, stdout, stderr, openErr)
	}

	show := func(w io.Writer, st *dumpState) error {
		if *asJSON {
			return writeDumpJSON(w, st, *watch)
		}
		width := 0
		if f, ok := stdout.(*os.File); ok && isTerminal(f) {
			if c, _, ok := termSize(f); ok {
				width = c
			}
		}
		return renderDump(w, st, width)
	}
	if !*watch {
		t, err := table.OpenReadOnly(path)
		if err != nil {
			return openErr(err)
		}
		defer t.Close()
		st, err := gatherDump(t, path, time.Now())
		if err != nil {
			return openErr(err)
		}
		var buf bytes.Buffer
		if err := show(&buf, st); err != nil {
			return fail(exitOSErr, "%v", err)
		}
		stdout.Write(buf.Bytes())
		return exitOK
	}

	// --watch: like serve, a table that does not exist yet is waited for,
	// and a table file replaced by another is re-opened (tableSource).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	src := &tableSource{path: path}
	defer src.close()
	if f, ok := stdout.(*os.File); ok && isTerminal(f) && !*asJSON {
		// A terminal gets the full-screen live view (top.go), with keys
		// from standard input when it is a terminal too.
		if err := runTop(ctx, src, path, f, os.Stdin, *interval); err != nil {
			return openErr(err)
		}
		return exitOK
	}
	waiting := false
	for first := true; ; first = false {
		t, err := src.get()
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if !waiting {
				waiting = true
				fmt.Fprintf(stderr, "shmlocks dump: no table at %s yet; waiting for it\n", path)
			}
		case err != nil:
			return openErr(err)
		default:
			waiting = false
			st, err := gatherDump(t, path, time.Now())
			if err != nil {
				return openErr(err)
			}
			var buf bytes.Buffer
			if !first && !*asJSON {
				buf.WriteString("\n")
			}
			if err := show(&buf, st); err != nil {
				return fail(exitOSErr, "%v", err)
			}
			if _, err := stdout.Write(buf.Bytes()); err != nil {
				return fail(exitOSErr, "%v", err)
			}
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-time.After(*interval):
		}
	}
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
	t, a := inspect.Table(m)
	u := t.Usage()
	// Our own agent is counted in Usage; report the others.
	fmt.Fprintf(stdout, "%s: consistent (%d other agents, %d held, %d waiting)\n", path, u.Agents-1, u.Held, u.Waiting)
	// Agents whose recorded process is gone but whose co-owners (the
	// process group of a shmlocks exec command) hold their locks: not a
	// violation, but the PID recorded for them names nobody.
	for _, ag := range t.Agents() {
		if ag.OtherPidNS || !ag.Live() {
			continue
		}
		h := agentHolder(&ag)
		switch {
		case h.ProcessAlive:
		case h.GroupAlive:
			fmt.Fprintf(stdout, "agent %d (client %s): its process %d (a shmlocks exec wrapper) is gone; its command's process group %d holds its locks (pid %d: %s)\n",
				ag.Index, inspect.ClientID(ag.Nonce), ag.PID, h.Group, h.HolderPID, commandOrUnknown(h.HolderCommand))
		default:
			fmt.Fprintf(stdout, "agent %d (client %s): its process %d is gone; a process holding its keep-alive descriptor (shmlocks exec's command, or one it started) holds its locks\n",
				ag.Index, inspect.ClientID(ag.Nonce), ag.PID)
		}
	}
	g, cycles, err := confirmedCycles(t, a)
	if err != nil {
		code, msg := tableFailure(path, err, exitOSErr)
		fmt.Fprintf(stderr, "shmlocks dump --check: %s\n", msg)
		return code
	}
	renderWaits(stdout, g, cycles)
	if len(cycles) > 0 {
		fmt.Fprintf(stderr, "shmlocks dump --check: %s: %d wait-for cycles (deadlocks)\n", path, len(cycles))
		return exitFailure
	}
	return exitOK
}

// commandOrUnknown is c, or "command unknown".
func commandOrUnknown(c string) string {
	if c == "" {
		return "command unknown"
	}
	return c
}
