//go:build unix

package shm

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// openFlags are added to every open of an existing file: O_NOFOLLOW refuses a
// symlink swapped in after our Lstat, O_NONBLOCK keeps a FIFO swapped in from
// blocking the open (it has no effect on regular files).
const openFlags = syscall.O_NOFOLLOW | syscall.O_NONBLOCK

// renameFile returns an *os.File for the same open file as f but reporting
// name from Name() (f was opened under its temporary name), and closes f. On
// failure f itself is returned: only Name() differs.
func renameFile(f *os.File, name string) *os.File {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return f
	}
	f.Close()
	return os.NewFile(uintptr(fd), name)
}

// dupFD returns a new descriptor (close-on-exec) for f's open file, or -1.
func dupFD(f *os.File) int {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return fd
}

func closeFD(fd int) { unix.Close(fd) }
