package main

import (
	"fmt"
	"io"
)

// runPath prints the default table location.
func runPath(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "--help" {
			fmt.Fprintf(stdout, "usage: shmlocks path\n\nPrint the default table location.\n\n%s\n", tableHelp())
			return exitOK
		}
		fmt.Fprintf(stderr, "shmlocks path: unexpected argument %q\n", args[0])
		return exitUsage
	}
	fmt.Fprintln(stdout, defaultTablePath())
	return exitOK
}
