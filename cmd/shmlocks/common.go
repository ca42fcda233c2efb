package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Environment variables.
const (
	envTable = "SHMLOCKS_TABLE"
	envXDG   = "XDG_RUNTIME_DIR"
)

// defaultTablePath is the table used without --table: $SHMLOCKS_TABLE, else
// $XDG_RUNTIME_DIR/shmlocks.tbl, else <os temp dir>/shmlocks-<uid>.tbl.
func defaultTablePath() string {
	if p := os.Getenv(envTable); p != "" {
		return p
	}
	if d := os.Getenv(envXDG); d != "" {
		return filepath.Join(d, "shmlocks.tbl")
	}
	name := "shmlocks.tbl"
	if uid := os.Getuid(); uid >= 0 {
		name = "shmlocks-" + strconv.Itoa(uid) + ".tbl"
	}
	return filepath.Join(os.TempDir(), name)
}

// tableHelp documents the table location in every command's help.
func tableHelp() string {
	return fmt.Sprintf(`Table location: --table PATH; without it $%s if set, else
$%s/shmlocks.tbl if %s is set, else
<temp dir>/shmlocks-<uid>.tbl (here: %s).`, envTable, envXDG, envXDG, defaultTablePath())
}

// cmdFlags is a subcommand's flag set with a help text made of a synopsis,
// a description, the flags and examples. --help prints it on stdout and
// exits 0; a usage error prints the error and the synopsis on stderr and
// exits 2.
type cmdFlags struct {
	*flag.FlagSet
	synopsis, about, examples string
	stdout, stderr            io.Writer
}

func newFlags(name, synopsis, about, examples string, stdout, stderr io.Writer) *cmdFlags {
	f := &cmdFlags{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), synopsis: synopsis, about: about,
		examples: examples, stdout: stdout, stderr: stderr}
	f.SetOutput(io.Discard)
	return f
}

func (f *cmdFlags) help(w io.Writer) {
	fmt.Fprintf(w, "usage: %s\n\n%s\n", f.synopsis, strings.TrimSpace(f.about))
	n := 0
	f.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 { // exec lists its options in its about text
		fmt.Fprintf(w, "\nflags:\n")
		f.SetOutput(w)
		f.PrintDefaults()
		f.SetOutput(io.Discard)
	}
	fmt.Fprintf(w, "\nexamples:\n%s\n", strings.TrimRight(f.examples, "\n"))
}

// parse parses args. ok false: return code (0 after --help, 2 on a usage error).
func (f *cmdFlags) parse(args []string) (code int, ok bool) {
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.help(f.stdout)
			return exitOK, false
		}
		return f.usageError("%v", err), false
	}
	return 0, true
}

// usageError reports a usage error and returns exitUsage.
func (f *cmdFlags) usageError(format string, args ...any) int {
	fmt.Fprintf(f.stderr, "shmlocks %s: %s\nusage: %s\nRun 'shmlocks %s --help' for details.\n",
		f.Name(), fmt.Sprintf(format, args...), f.synopsis, f.Name())
	return exitUsage
}
