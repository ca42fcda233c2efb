// Command shmlocks drives and inspects shmlocks lock tables.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/shmlocks/shmlocks/table"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == execChildArg {
		os.Exit(execChild(os.Args[2:])) // exec_unix.go: shmlocks exec's command, before it runs
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

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
	// Options before the command: --help, --version, and --table PATH
	// (or -t PATH), which is then the command's own --table.
	var pre []string
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		a := args[0]
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case a == "-h" || a == "--help" || strings.HasPrefix(a, "--") && len(name) >= 2 && strings.HasPrefix("help", name):
			usage(stdout)
			return exitOK
		case a == "-V" || a == "--version" || strings.HasPrefix(a, "--") && len(name) >= 2 && strings.HasPrefix("version", name):
			return runVersion(nil, stdout, stderr)
		case a == "-t" || strings.HasPrefix(a, "--") && len(name) >= 2 && strings.HasPrefix("table", name):
			if !hasVal {
				if len(args) < 2 {
					fmt.Fprintf(stderr, "shmlocks: option %s needs PATH\n", a)
					return exitUsage
				}
				val, args = args[1], args[1:]
			}
			pre = append(pre, "--table", val)
			args = args[1:]
		case strings.HasPrefix(a, "-t") && !strings.HasPrefix(a, "--"):
			pre = append(pre, "--table", a[2:])
			args = args[1:]
		default:
			fmt.Fprintf(stderr, "shmlocks: unknown option %s before the command (options before it: --table PATH, --help, --version)\n", a)
			usage(stderr)
			return exitUsage
		}
	}
	if len(args) == 0 {
		fmt.Fprintln(stderr, "shmlocks: missing COMMAND after the options")
		usage(stderr)
		return exitUsage
	}
	for _, c := range commands() {
		if c.name == args[0] && len(pre) > 0 {
			switch c.name {
			case "dump", "exec", "serve", "stress", "demo":
			default:
				fmt.Fprintf(stderr, "shmlocks: %s takes no --table\n", c.name)
				return exitUsage
			}
			return c.run(append(pre, args[1:]...), stdout, stderr)
		}
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
	fmt.Fprintln(w, "usage: shmlocks [--table PATH] COMMAND [options]\n       shmlocks --version | --help\n\ncommands:")
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
