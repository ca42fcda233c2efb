//go:build !unix

package stress

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
)

// Supported reports whether stress runs on this OS.
const Supported = false

// ErrNotSupported: stress needs a Unix (shared mmap, flock, SIGKILL).
var ErrNotSupported = errors.New("stress: not supported on this OS (" + runtime.GOOS + ")")

// Run is not supported on this OS.
func Run(cfg Config, stderr io.Writer) (*Report, error) { return nil, ErrNotSupported }

// IsWorker reports whether this process was started as a stress worker.
func IsWorker() bool { return os.Getenv(WorkerEnv) != "" }

// WorkerMain is not supported on this OS.
func WorkerMain(stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, ErrNotSupported)
	return 1
}

// processAlive: the checks that use it do not run on this OS.
func processAlive(pid int, start uint64) bool { return pid > 0 }

// processStart is 0 (unknown) on this OS.
func processStart(pid int) uint64 { return 0 }

// namespacesSupported: Config.Namespaces needs Linux.
const namespacesSupported = false
