//go:build !unix

package main

import (
	"fmt"
	"io"
)

func execLocked(o *execOptions, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "shmlocks exec: not supported on this OS")
	return exitFailure
}
