// Command shmlocks drives and inspects shmlocks lock tables.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/shmlocks/shmlocks/table"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == execChildArg {
		os.Exit(execChild(os.Args[2:])) // exec_unix.go: shmlocks exec's command, before it runs
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit statuses, shared by every command; those above 1 are sysexits(3)
// codes, as flock(1) uses. shmlocks exec also exits with the command's own
// status, 126/127 when it cannot run it and 128+N after signal N.
const (
	exitOK       = 0
	exitFailure  = 1  // not available (-n), timed out (-w), a check that failed
	exitUsage    = 64 // EX_USAGE: a usage error
	exitCorrupt  = 65 // EX_DATAERR: the file is not a valid lock table
	exitNoTable  = 66 // EX_NOINPUT: the table cannot be opened or created (missing, permission, not safe)
	exitOSErr    = 71 // EX_OSERR: the system refused (no memory, descriptors, processes)
	exitTempFail = 75 // EX_TEMPFAIL: the table is full (no free agent record, name or request)
)

const exitStatusHelp = `Exit status (sysexits codes above 1, as flock(1)): 0 ok; 1 not available,
timed out, a check failed (dump: also no table); 64 usage error; 65 not a
valid lock table (corrupt, another format version); 66 the table cannot be
opened or created (missing directory, permission, owned by another user);
71 system error; 75 table full. exec: the command's own status, 126/127 if
it cannot be run, 128+N after signal N.`

type command struct {
	name, summary string
	run           func(args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"dump", "show a table: agents, held locks and queues (read-only); --json, --watch, --check", runDump},
		{"exec", "run a command while holding a lock (like flock(1))", runExec},
		{"serve", "serve the table's state to a Prometheus scraper (--metrics ADDR)", runServe},
		{"stress", "hammer a table from many processes and check the lock independently", runStress},
		{"demo", "several processes contend for locks and print what they got", runDemo},
		{"path", "print the default table location", runPath},
		{"version", "print the version of shmlocks and of its table format", runVersion},
		{"help", "print the help of a command (help CMD), or this list", runHelp},
	}
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help":
		usage(stdout)
		return exitOK
	case "-V", "--version":
		return runVersion(nil, stdout, stderr)
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "shmlocks: unknown command %q\n", args[0])
	usage(stderr)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: shmlocks COMMAND [options]\n       shmlocks --version | --help\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\n%s\n", tableHelp())
	fmt.Fprintf(w, "\n%s\n", exitStatusHelp)
	fmt.Fprintln(w, "\nRun 'shmlocks help COMMAND' (or 'shmlocks COMMAND --help') for a command's options and examples.")
}

// runHelp prints the help of the command named in args, or the usage.
func runHelp(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0:
		usage(stdout)
		return exitOK
	case len(args) > 1:
		fmt.Fprintf(stderr, "shmlocks help: one command at a time (got %q)\n", args)
		return exitUsage
	case args[0] == "help":
		usage(stdout)
		return exitOK
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run([]string{"--help"}, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "shmlocks help: unknown command %q\n", args[0])
	usage(stderr)
	return exitUsage
}

// runVersion prints the module version (and VCS revision) of this build,
// the Go version and the table format it reads and writes.
func runVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "--help" {
			fmt.Fprintln(stdout, "usage: shmlocks version\n\nPrint the version of shmlocks, of Go, and the table format version it uses\n(tables of another format are refused).")
			return exitOK
		}
		fmt.Fprintf(stderr, "shmlocks version: unexpected argument %q\n", args[0])
		return exitUsage
	}
	fmt.Fprintf(stdout, "shmlocks %s (%s, table format %d)\n", buildVersion(), runtime.Version(), table.FormatVersion)
	return exitOK
}

func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" && (v == "(devel)" || len(v) > 40) {
		v += " rev " + rev + dirty
	}
	return v
}
