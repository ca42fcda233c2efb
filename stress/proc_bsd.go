//go:build unix && !linux

package stress

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// processAlive reports whether process pid is still there (a zombie counts
// as alive: without /proc its state is not read; start is not checked).
func processAlive(pid int, start uint64) bool {
	return pid > 0 && unix.Kill(pid, 0) != unix.ESRCH
}

// processStart is 0 (unknown) without /proc.
func processStart(pid int) uint64 { return 0 }

const namespacesSupported = false

func namespaceAttr() *syscall.SysProcAttr { return nil }

const ownProcEnv = "SHMLOCKS_STRESS_OWN_PROC"

func mountOwnProc() error { return nil }
