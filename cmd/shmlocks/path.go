package main

import (
	"fmt"
	"io"
)

// runPath prints the table a command uses without --table.
func runPath(args []string, stdout, stderr io.Writer) int {
	f := newFlags("path", "shmlocks path",
		"Print the table that commands use without --table: $"+envTable+" if set, else the\nuser's default table (manager.DefaultPath).\n\n"+tableHelp(),
		"  shmlocks path\n  ls -l \"$(shmlocks path)\"", stdout, stderr)
	if code, ok := f.parse(args); !ok {
		return code
	}
	if f.NArg() > 0 {
		return f.usageError("unexpected argument %q", f.Arg(0))
	}
	fmt.Fprintln(stdout, defaultTablePath())
	return exitOK
}
