package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

const execAbout = `Acquire the lock NAME on the table, run COMMAND with its standard input,
output and error passed through while holding it, release it when the
command exits, and exit with the command's status (128+N if a signal N
killed it). Like flock(1), for the shmlocks table.

  --shared          request the lock in shared mode (default exclusive)
  --if-available    fail at once if the lock cannot be granted immediately
  --timeout DUR     give up after waiting DUR
  --steal           take the lock from its holders (exclusive only)

Not available (--if-available) or timed out (--timeout): exit status 1, or
--conflict-exit-code N (also -E N, as flock -E). SIGINT, SIGTERM, SIGHUP or
SIGQUIT while waiting withdraw the request cleanly and exit 1. While the
command runs those signals are forwarded to it (a Ctrl-C typed at a terminal
reaches the command from the terminal too, so it may see SIGINT twice).

If the lock is stolen while the command runs (another process used
--steal / RequestOptions.Steal), a warning is printed on standard error and
the command is sent SIGTERM; the exit status is then the command's
(normally 143).

Exit status 127: the command was not found; 126: it could not be run.

%s`

const execExamples = `  shmlocks exec backup -- rsync -a /data /backup
  shmlocks exec --shared config -- cat /etc/app.conf
  shmlocks exec --if-available --conflict-exit-code 75 cron-job -- ./job.sh
  shmlocks exec --timeout 30s --table /run/user/1000/app.locks db -- ./migrate
  shmlocks exec --steal stuck-job -- ./recover.sh`

// execOptions is a parsed exec command line.
type execOptions struct {
	path         string
	name         string
	opts         manager.RequestOptions
	timeout      time.Duration
	conflictCode int
	argv         []string
}

func runExec(args []string, stdout, stderr io.Writer) int {
	f := newFlags("exec", "shmlocks exec [--table PATH] [--shared] [--if-available | --timeout DUR] [--steal] [--conflict-exit-code N] NAME -- COMMAND [ARGS...]",
		fmt.Sprintf(execAbout, tableHelp()), execExamples, stdout, stderr)
	var o execOptions
	f.StringVar(&o.path, "table", "", "table file (default: see 'Table location')")
	shared := f.Bool("shared", false, "shared mode")
	ifAvailable := f.Bool("if-available", false, "do not wait: fail if not available at once")
	f.DurationVar(&o.timeout, "timeout", 0, "give up after waiting this long (0: wait forever)")
	steal := f.Bool("steal", false, "steal the lock from its holders (exclusive only)")
	f.IntVar(&o.conflictCode, "conflict-exit-code", exitFailure, "exit status when the lock is not available or the wait timed out")
	f.IntVar(&o.conflictCode, "E", exitFailure, "short for --conflict-exit-code")
	if code, ok := f.parse(args); !ok {
		return code
	}
	rest := f.Args()
	switch {
	case len(rest) == 0:
		return f.usageError("missing NAME and COMMAND")
	case len(rest) == 1 || rest[1] != "--":
		if len(rest) > 1 && strings.HasPrefix(rest[1], "-") {
			return f.usageError("flags go before NAME; separate the command with --")
		}
		return f.usageError("missing -- COMMAND after NAME")
	case len(rest) == 2:
		return f.usageError("missing COMMAND after --")
	}
	o.name, o.argv = rest[0], rest[2:]
	switch {
	case o.name == "":
		return f.usageError("empty lock name")
	case strings.HasPrefix(o.name, "-"):
		return f.usageError("lock name %q starts with '-' (reserved by Web Locks)", o.name)
	case *ifAvailable && o.timeout != 0:
		return f.usageError("--if-available and --timeout exclude each other")
	case *steal && (*shared || *ifAvailable):
		return f.usageError("--steal works only in exclusive mode without --if-available")
	case o.timeout < 0:
		return f.usageError("negative --timeout")
	case o.conflictCode < 0 || o.conflictCode > 255:
		return f.usageError("--conflict-exit-code %d out of range [0, 255]", o.conflictCode)
	}
	if *shared {
		o.opts.Mode = manager.Shared
	}
	o.opts.IfAvailable, o.opts.Steal = *ifAvailable, *steal
	if o.path == "" {
		o.path = defaultTablePath()
	}
	return execLocked(&o, stdout, stderr)
}
