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
killed it). Like flock(1), for the shmlocks table, with flock's options:

  shmlocks exec [options] NAME [--] COMMAND [ARGS...]
  shmlocks exec [options] NAME -c STRING

Options:
%s
Options go before NAME; short ones cluster (-sn) and take arguments
attached or apart (-w5, -w 5). The -- before COMMAND is optional (needed
only for a command starting with '-').

Not available (-n) or timed out (-w): exit status 1, or -E's code.
SIGINT, SIGTERM, SIGHUP or SIGQUIT while waiting withdraw the request
cleanly and exit 1. While the command runs those signals are forwarded to
it (a Ctrl-C typed at a terminal reaches the command from the terminal too,
so it may see SIGINT twice).

COMMAND never inherits the lock (flock -o is always in effect): the lock
belongs to this process's agent in the table, not to a file descriptor, and
is released when COMMAND exits, even if COMMAND left background processes
behind. -u/--unlock and -F/--no-fork are refused for the same reason.

If the lock is stolen while the command runs (another process used
--steal / RequestOptions.Steal), a warning is printed on standard error and
the command is sent SIGTERM; the exit status is then the command's
(normally 143).

Exit status 127: the command was not found; 126: it could not be run; 2:
usage error; 1: the table could not be opened. (flock uses sysexits codes
for these: 64, 69, 66/73; see docs/cli.md.)

%s`

const execExamples = `  shmlocks exec -n backup rsync -a /data /backup
  shmlocks exec -s config cat /etc/app.conf
  shmlocks exec -w 2.5 -E 75 cron-job ./job.sh
  shmlocks exec -x db -c 'pg_dump app > app.sql'
  shmlocks exec --timeout 30s --table /run/user/1000/app.locks db -- ./migrate
  shmlocks exec --steal stuck-job -- ./recover.sh`

// execOptions is a parsed exec command line.
type execOptions struct {
	path         string
	name         string
	opts         manager.RequestOptions
	timeout      time.Duration
	conflictCode int
	verbose      bool
	argv         []string
	st           execState // the options as given (execflags.go)
}

func runExec(args []string, stdout, stderr io.Writer) int {
	f := newFlags("exec", "shmlocks exec [--table PATH] [-s|-x] [-n | -w SECONDS] [-E N] [--steal] [--verbose] NAME [--] COMMAND [ARGS...] | NAME -c STRING",
		fmt.Sprintf(execAbout, execOptionsHelp(), tableHelp()), execExamples, stdout, stderr)
	var o execOptions
	if err := parseExecArgs(args, &o); err != nil {
		if err == errHelp {
			f.help(stdout)
			return exitOK
		}
		return f.usageError("%v", err)
	}
	if o.path == "" {
		o.path = defaultTablePath()
	}
	return execLocked(&o, stdout, stderr)
}

// execOptionsHelp lists exec's options for --help.
func execOptionsHelp() string {
	var b strings.Builder
	for _, o := range execOpts {
		var names []string
		for _, c := range o.short {
			names = append(names, "-"+string(c))
		}
		for _, l := range o.long {
			names = append(names, "--"+l)
		}
		spec := strings.Join(names, ", ")
		if o.arg != "" {
			spec += " " + o.arg
		}
		fmt.Fprintf(&b, "  %-34s %s\n", spec, o.help)
	}
	fmt.Fprintf(&b, "  %-34s %s\n", "-h, --help", "this help")
	return b.String()
}
