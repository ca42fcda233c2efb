//go:build !unix

package main

import (
	"fmt"
	"io"
	"os"
)

func execLocked(o *execOptions, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "shmlocks exec: not supported on this OS")
	return exitOSErr
}

func execChild([]string) int {
	fmt.Fprintln(os.Stderr, "shmlocks exec: not supported on this OS")
	return exitOSErr
}
