//go:build unix

package manager

import (
	"os"
	"syscall"
)

func flockExclusive(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }
