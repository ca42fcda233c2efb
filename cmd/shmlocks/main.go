// Command shmlocks drives and inspects shmlocks lock tables.
package main

import (
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	exitCorrupt = 3
)

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
	}
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return exitOK
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
	fmt.Fprintln(w, "usage: shmlocks COMMAND [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\n%s\n", tableHelp())
	fmt.Fprintln(w, "\nExit status: 0 ok, 1 failure (violation, not available, timed out), 2 usage error,\n3 corrupt table (dump).")
	fmt.Fprintln(w, "\nRun 'shmlocks COMMAND --help' for a command's flags and examples.")
}
