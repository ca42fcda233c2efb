package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

// exec's command line is parsed the way flock(1) parses its own (getopt_long
// with parsing stopped at the first operand): options come before NAME;
// short options may be clustered (-sn) and take their argument attached or
// next (-w5, -w 5); long options take theirs after = or next; a long option
// may also be written with one dash (-shared, as Go's flag package allows,
// which the first exec accepted). After NAME: an optional --, then COMMAND
// [ARGS...], or -c/--command STRING.

// execOpt is one option of exec.
type execOpt struct {
	short string // letters, "" if none
	long  []string
	arg   string // the argument's name, "" for none
	help  string
	set   func(o *execOptions, v string) error
}

// execState is what the options set before they are checked together.
type execState struct {
	mode        manager.Mode
	nonblock    bool
	timeoutSet  bool
	ifAvailable bool // --if-available (ours), kept apart for the error message
	steal       bool
	command     string
	commandSet  bool
	verbose     bool
}

var execOpts = []execOpt{
	{"s", []string{"shared"}, "", "shared lock (flock -s)", func(o *execOptions, _ string) error { o.st.mode = manager.Shared; return nil }},
	{"xe", []string{"exclusive"}, "", "exclusive lock, the default (flock -x, -e)", func(o *execOptions, _ string) error { o.st.mode = manager.Exclusive; return nil }},
	{"n", []string{"nb", "nonblock"}, "", "fail rather than wait if the lock is not available at once (flock -n); exit 1 or -E's code", func(o *execOptions, _ string) error { o.st.nonblock = true; return nil }},
	{"", []string{"if-available"}, "", "the same as -n (the Web Locks name)", func(o *execOptions, _ string) error { o.st.ifAvailable = true; return nil }},
	{"w", []string{"wait", "timeout"}, "SECONDS", "give up after waiting this long (flock -w): seconds, fractions allowed, or a Go duration (1m30s); 0 is -n; exit 1 or -E's code", setTimeout},
	{"E", []string{"conflict-exit-code"}, "N", "exit status when not available or timed out, 0-255 (default 1)", setConflict},
	{"c", []string{"command"}, "STRING", "run STRING with $SHELL -c (else /bin/sh -c), as flock -c; also allowed after NAME", func(o *execOptions, v string) error { o.st.command, o.st.commandSet = v, true; return nil }},
	{"o", []string{"close"}, "", "release the lock when COMMAND exits, even if processes it started in its group still run (flock -o)", func(o *execOptions, _ string) error { o.closeEarly = true; return nil }},
	{"", []string{"steal"}, "", "take the lock from its holders (exclusive only)", func(o *execOptions, _ string) error { o.st.steal = true; return nil }},
	{"", []string{"kill-after"}, "DURATION", "after the lock was stolen and the command sent SIGTERM, send SIGKILL this long later (seconds or a Go duration; 0: never; default 10s)", setKillAfter},
	{"", []string{"verbose"}, "", "report how long getting the lock took, or why it was not available, and the command run (flock --verbose)", func(o *execOptions, _ string) error { o.st.verbose = true; return nil }},
	{"t", []string{"table"}, "PATH", "table file (default: see 'Table location')", setTable},
	{"", []string{"mode"}, "OCTAL", "permission bits of the table file if this creates it (default 0600; e.g. 0660 to share it with a group: docs/cli.md)", setMode},
	{"u", []string{"unlock"}, "", "not supported (flock -u drops a lock held by a file descriptor; a shmlocks lock has none)", func(*execOptions, string) error {
		return fmt.Errorf("-u/--unlock is not supported: a shmlocks lock is not held by a file descriptor the shell could pass; the lock is released when COMMAND exits")
	}},
	{"F", []string{"no-fork"}, "", "not supported (flock -F execs COMMAND in place; here COMMAND runs in a process group of its own that co-owns the lock)", func(*execOptions, string) error {
		return fmt.Errorf("-F/--no-fork is not supported: COMMAND runs in a process group of its own, which this process makes a co-owner of the lock before COMMAND starts")
	}},
}

func setTimeout(o *execOptions, v string) error {
	d, err := parseSeconds(v)
	if err != nil {
		return fmt.Errorf("timeout %v", err)
	}
	o.timeout, o.st.timeoutSet = d, true
	return nil
}

func setKillAfter(o *execOptions, v string) error {
	d, err := parseSeconds(v)
	if err != nil {
		return fmt.Errorf("--kill-after: %v", err)
	}
	o.killAfter = d
	return nil
}

func setTable(o *execOptions, v string) error {
	if v == "" {
		return fmt.Errorf("option --table needs a non-empty PATH (leave it out for the default table)")
	}
	o.path = v
	return nil
}

func setMode(o *execOptions, v string) error {
	n, err := strconv.ParseUint(v, 8, 32)
	if err != nil || n > 0o777 || n&0o600 != 0o600 {
		return fmt.Errorf("--mode %s: want octal permission bits, at least 0600 (the owner reads and writes), at most 0777", v)
	}
	o.mode = os.FileMode(n)
	return nil
}

func setConflict(o *execOptions, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 255 {
		return fmt.Errorf("--conflict-exit-code %s out of range [0, 255]", v)
	}
	o.conflictCode = n
	return nil
}

// parseSeconds parses flock's -w argument, seconds with an optional
// fraction, or a Go duration (the first exec's --timeout); every option
// of a duration takes the same (durationValue).
func parseSeconds(v string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if f < 0 || math.IsNaN(f) || f > float64(math.MaxInt64)/1e9 {
			return 0, fmt.Errorf("%q: out of range", v)
		}
		return time.Duration(f * 1e9), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%q: not a number of seconds (2, 0.5) nor a duration (1m30s, 500ms)", v)
	}
	if d < 0 {
		return 0, fmt.Errorf("%q: negative", v)
	}
	return d, nil
}

// durationValue is a flag.Value of a duration written as parseSeconds
// reads it: seconds (2, 0.5) or a Go duration (1m30s).
type durationValue struct{ d *time.Duration }

func newDuration(d *time.Duration, dflt time.Duration) durationValue {
	*d = dflt
	return durationValue{d}
}

func (v durationValue) Set(s string) error {
	d, err := parseSeconds(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

func (v durationValue) String() string {
	if v.d == nil {
		return "0s"
	}
	return v.d.String()
}

// ErrFDForm: flock's file-descriptor form (flock [options] FD, after
// exec N>file in a shell) has no shmlocks equivalent: a shmlocks lock is
// not held by a descriptor.
var ErrFDForm = errors.New("flock's file-descriptor form is not supported: use exec NAME COMMAND")

// findLong finds the option a long name names: exactly, or, with prefix,
// as the unambiguous prefix of one option's names (getopt_long, as flock
// takes --verb for --verbose); name is then the full name.
func findLong(name string, prefix bool) (opt *execOpt, full string, err error) {
	for i := range execOpts {
		for _, l := range execOpts[i].long {
			if l == name {
				return &execOpts[i], l, nil
			}
		}
	}
	if !prefix || name == "" {
		return nil, "", nil
	}
	var names []string
	for i := range execOpts {
		for _, l := range execOpts[i].long {
			if strings.HasPrefix(l, name) {
				if opt != &execOpts[i] {
					names = append(names, "--"+l)
				}
				opt, full = &execOpts[i], l
			}
		}
	}
	if len(names) > 1 {
		return nil, "", fmt.Errorf("option --%s is ambiguous (%s)", name, strings.Join(names, ", "))
	}
	return opt, full, nil
}

func findShort(c byte) *execOpt {
	for i := range execOpts {
		if strings.IndexByte(execOpts[i].short, c) >= 0 {
			return &execOpts[i]
		}
	}
	return nil
}

// parseExecArgs parses exec's command line into o (conflictCode 1 unless
// set). Errors are usage errors, or errHelp.
func parseExecArgs(args []string, o *execOptions) error {
	o.conflictCode = exitFailure
	o.killAfter = defaultKillAfter
	i := 0
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		if len(a) < 2 || a[0] != '-' {
			break // NAME
		}
		if a == "-h" || a == "--help" || a == "-help" {
			return errHelp
		}
		// A long option: --name[=v], or -name[=v] if name is a long option.
		body, dashes := strings.TrimPrefix(a[1:], "-"), 1
		if strings.HasPrefix(a, "--") {
			dashes = 2
		}
		name, val, hasVal := strings.Cut(body, "=")
		opt, full, err := findLong(name, dashes == 2)
		if err != nil {
			return err
		}
		if opt != nil && (dashes == 2 || len(name) > 1) {
			name = full
			if opt.arg == "" {
				if hasVal {
					return fmt.Errorf("option --%s takes no argument", name)
				}
				if err := opt.set(o, ""); err != nil {
					return err
				}
				continue
			}
			if !hasVal {
				if i+1 >= len(args) {
					return fmt.Errorf("option --%s needs %s", name, opt.arg)
				}
				i++
				val = args[i]
			}
			if err := opt.set(o, val); err != nil {
				return err
			}
			continue
		}
		if dashes == 2 {
			return fmt.Errorf("unknown option %s", a)
		}
		// A cluster of short options.
		for j := 1; j < len(a); j++ {
			opt := findShort(a[j])
			if opt == nil {
				return fmt.Errorf("unknown option -%c in %s", a[j], a)
			}
			if opt.arg == "" {
				if err := opt.set(o, ""); err != nil {
					return err
				}
				continue
			}
			v := a[j+1:]
			if v == "" {
				if i+1 >= len(args) {
					return fmt.Errorf("option -%c needs %s", a[j], opt.arg)
				}
				i++
				v = args[i]
			}
			if err := opt.set(o, v); err != nil {
				return err
			}
			break
		}
	}
	rest := args[i:]
	if len(rest) == 0 {
		return fmt.Errorf("missing NAME and COMMAND")
	}
	o.name, rest = rest[0], rest[1:]
	switch {
	case o.name == "":
		return fmt.Errorf("empty lock name")
	case strings.HasPrefix(o.name, "-"):
		return fmt.Errorf("lock name %q starts with '-' (reserved by Web Locks)", o.name)
	}
	// After NAME: [--] COMMAND [ARGS...], or -c/--command STRING.
	if len(rest) > 0 && (rest[0] == "-c" || rest[0] == "--command") {
		if len(rest) != 2 {
			return fmt.Errorf("%s takes exactly one STRING, the last argument", rest[0])
		}
		if o.st.commandSet {
			return fmt.Errorf("-c given twice")
		}
		o.st.command, o.st.commandSet = rest[1], true
		rest = nil
	}
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
		if len(rest) == 0 {
			return fmt.Errorf("missing COMMAND after --")
		}
	} else if len(rest) > 0 && strings.HasPrefix(rest[0], "-") {
		return fmt.Errorf("options go before NAME (got %q after it); a command starting with '-' goes after --", rest[0])
	}
	switch {
	case o.st.commandSet && len(rest) > 0:
		return fmt.Errorf("-c STRING and a COMMAND exclude each other")
	case o.st.commandSet:
		sh := os.Getenv("SHELL")
		if sh == "" {
			sh = "/bin/sh"
		}
		o.argv = []string{sh, "-c", o.st.command}
	case len(rest) == 0 && isNumber(o.name):
		return fmt.Errorf("%w (%s is a file descriptor to flock; here NAME is a lock name)", ErrFDForm, o.name)
	case len(rest) == 0:
		return fmt.Errorf("missing COMMAND after NAME (or -c STRING)")
	default:
		o.argv = rest
	}
	st := &o.st
	nonblock := st.nonblock || st.ifAvailable || (st.timeoutSet && o.timeout == 0)
	switch { // -n wins over -w, as in flock
	case st.steal && (st.mode == manager.Shared || nonblock):
		return fmt.Errorf("--steal works only in exclusive mode without -n/--if-available")
	}
	o.opts = manager.RequestOptions{Mode: st.mode, IfAvailable: nonblock, Steal: st.steal}
	if nonblock {
		o.timeout = 0
	}
	o.verbose = st.verbose
	return nil
}

// isNumber reports whether s is a decimal number (flock's FD operand).
func isNumber(s string) bool {
	_, err := strconv.ParseUint(s, 10, 31)
	return err == nil
}
