package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/shmlocks/shmlocks/manager"
)

// Environment variables.
const (
	envTable = "SHMLOCKS_TABLE"
)

// defaultTablePath is the table used without --table: $SHMLOCKS_TABLE if
// set (an explicit choice, like --table), else manager.DefaultPath(), which
// depends on the user only.
func defaultTablePath() string {
	if p := os.Getenv(envTable); p != "" {
		return p
	}
	return manager.DefaultPath()
}

// tableHelp documents the table location in every command's help.
func tableHelp() string {
	return fmt.Sprintf(`Table location: --table PATH; without it $%s if set, else the
user's default table, the same whatever the environment (login shell,
cron, systemd, sudo): %s here, in a directory
of the user's own, mode 0700 ('shmlocks path' prints it).`, envTable, manager.DefaultPath())
}

// cmdFlags is a subcommand's flag set with a help text made of a synopsis,
// a description, the flags and examples. Options are parsed GNU style
// (flags.go). --help prints the help on stdout and exits 0; a usage error
// prints the error and the synopsis on stderr and exits exitUsage.
type cmdFlags struct {
	*flag.FlagSet
	synopsis, about, examples string
	stdout, stderr            io.Writer
	short                     map[byte]string // short options (shortOptions)
}

func newFlags(name, synopsis, about, examples string, stdout, stderr io.Writer) *cmdFlags {
	f := &cmdFlags{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), synopsis: synopsis, about: about,
		examples: examples, stdout: stdout, stderr: stderr, short: shortOptions[name]}
	f.SetOutput(io.Discard)
	return f
}

func (f *cmdFlags) help(w io.Writer) {
	fmt.Fprintf(w, "usage: %s\n\n%s\n", f.synopsis, strings.TrimSpace(f.about))
	n := 0
	f.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 { // exec lists its options in its about text
		fmt.Fprintf(w, "\noptions:\n")
		printOptions(w, f.FlagSet, f.short)
	}
	if f.examples != "" {
		fmt.Fprintf(w, "\nexamples:\n%s\n", strings.TrimRight(f.examples, "\n"))
	}
}

// parse parses args GNU style (flags.go); the operands are then f.Args().
// ok false: return code (0 after --help, exitUsage on a usage error).
func (f *cmdFlags) parse(args []string) (code int, ok bool) {
	operands, err := parseGNU(f.FlagSet, f.short, args)
	if err != nil {
		if errors.Is(err, errHelp) {
			f.help(f.stdout)
			return exitOK, false
		}
		return f.usageError("%v", err), false
	}
	f.FlagSet.Parse(append([]string{"--"}, operands...)) // sets f.Args()
	return 0, true
}

// usageError reports a usage error and returns exitUsage.
func (f *cmdFlags) usageError(format string, args ...any) int {
	fmt.Fprintf(f.stderr, "shmlocks %s: %s\nusage: %s\nRun 'shmlocks %s --help' for details.\n",
		f.Name(), fmt.Sprintf(format, args...), f.synopsis, f.Name())
	return exitUsage
}
