//go:build !linux

package shm

import "os"

// Without open-file-description locks (systems other than Linux) there is
// no in-use signal: a table of another format is refused until a person
// removes it, and liveness falls back on process ids (docs/design.md).
const (
	InUseStart = 0
	InUseLen   = 8
)

// HasOFDLocks reports whether this system has open-file-description locks.
const HasOFDLocks = false

func LockRange(f *os.File, start, n int64) (bool, error)   { return true, nil }
func UnlockRange(f *os.File, start, n int64) error         { return nil }
func RangeLocked(fd int, start, n int64) (locked, ok bool) { return false, false }
func takeInUse(f *os.File) (busy bool, err error)          { return false, nil }
func takeReplace(f *os.File) (bool, error)                 { return false, nil }
func openedElsewhere(f *os.File) (elsewhere, ok bool)      { return false, false }
func checkFS(f *os.File, path string) error                { return nil }
