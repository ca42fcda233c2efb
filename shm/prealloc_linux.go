//go:build linux

package shm

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// preallocate reserves the blocks of a freshly truncated (sparse) file so that
// a full file system (e.g. /dev/shm) is reported as ENOSPC here instead of as
// SIGBUS on a later write through the mapping. File systems without fallocate
// support are left sparse.
func preallocate(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		return nil
	}
	return err
}
