package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

const execAbout = `Acquire the lock NAME on the table, run COMMAND with its standard input,
output and error passed through while holding it, and exit with the
command's status (128+N if a signal N killed it). Like flock(1), for the
shmlocks table, with flock's options:

  shmlocks exec [options] NAME [--] COMMAND [ARGS...]
  shmlocks exec [options] NAME -c STRING

Options:
%s
Options go before NAME; short ones cluster (-sn) and take arguments
attached or apart (-w5, -w 5). The -- before COMMAND is optional (needed
only for a command starting with '-'). -n wins over -w, as in flock.

Not available (-n) or timed out (-w): exit status 1, or -E's code, and
nothing printed (a line with --verbose). A signal that would end this
process while it waits (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, ...)
withdraws the request cleanly and exits 128+N.

The lock lives exactly as long as the command: COMMAND runs in a process
group of its own, and that group co-owns the lock. Whatever ends this
process (SIGKILL, the OOM killer included), nobody else is granted NAME
while COMMAND or any process of its group runs; once they are all gone,
the name is free within milliseconds. When COMMAND exits and processes it
started in its group still run, shmlocks exec exits with COMMAND's status
and the lock stays theirs (flock's lock stays with the children that
inherited its descriptor); -o releases it when COMMAND exits instead. A
process that leaves the group (setsid, setpgid: daemons do) does not keep
the lock.

Every catchable signal sent to this process is passed to the command's
group (SIGCHLD and SIGURG excepted); on a terminal the command's group is
the foreground job, so Ctrl-C and Ctrl-Z reach it directly. The command's
environment has SHMLOCKS_NAME (the lock name) and SHMLOCKS_TOKEN (its
fencing token, decimal).

If the lock is stolen while the command runs (--steal elsewhere), a warning
is printed on standard error and the command's group is sent SIGTERM, then
SIGKILL after --kill-after; the exit status is then 76, whatever the
command did (it may have ignored SIGTERM and exited 0): the command did not
hold the lock to its end. A lock stolen as it was granted also exits 76,
and COMMAND is not run.

Exit status: the command's; 1 (or -E's code) not available or timed out;
76 the lock was lost (stolen); 126 the command could not be run, 127 not
found; 64 usage error; 65 the file is not a lock table this build reads;
66 the table cannot be opened or created (missing directory, not a
regular file, permission, unsafe location); 71 internal or system error;
75 table full; 128+N a signal N while waiting.

%s`

const execExamples = `  shmlocks exec -n backup rsync -a /data /backup
  shmlocks exec -s config cat /etc/app.conf
  shmlocks exec -w 2.5 -E 75 cron-job ./job.sh
  shmlocks exec -x db -c 'pg_dump app > app.sql'
  shmlocks exec -n job sh -c 'echo "token $SHMLOCKS_TOKEN"'
  shmlocks exec --timeout 30s --table /srv/locks/app.tbl --mode 0660 db -- ./migrate
  shmlocks exec --steal --kill-after 5s stuck-job -- ./recover.sh`

// execChildArg is argv[1] of the process that becomes the command
// (exec_unix.go): it waits until the command's group co-owns the lock.
const execChildArg = "__shmlocks-exec-child"

// Environment given to the command.
const (
	envLockName  = "SHMLOCKS_NAME"
	envLockToken = "SHMLOCKS_TOKEN"
)

// defaultKillAfter is --kill-after's default.
const defaultKillAfter = 10 * time.Second

// execOptions is a parsed exec command line.
type execOptions struct {
	path         string
	name         string
	opts         manager.RequestOptions
	timeout      time.Duration
	conflictCode int
	verbose      bool
	closeEarly   bool          // -o: release when the command exits, whatever its group does
	killAfter    time.Duration // after a steal, SIGKILL this long after SIGTERM (0: never)
	mode         os.FileMode   // --mode: permission bits of a table this creates
	argv         []string
	st           execState // the options as given (execflags.go)
}

func runExec(args []string, stdout, stderr io.Writer) int {
	f := newFlags("exec", "shmlocks exec [options] NAME [--] COMMAND [ARGS...] | NAME -c STRING",
		fmt.Sprintf(execAbout, execOptionsHelp(), tableHelp()), execExamples, stdout, stderr)
	var o execOptions
	if err := parseExecArgs(args, &o); err != nil {
		if errors.Is(err, errHelp) {
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
