//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// The in-use signal (docs/design.md, "Compatibility promise"): every process
// that maps a table holds an open-file-description (OFD) read lock on bytes
// [0, InUseLen) of the file for as long as it maps it; the kernel drops it when
// the last reference to that open file (the descriptor or the mapping) goes,
// which includes the death of the process, whatever namespace either side
// lives in. A process that wants to replace the file takes the write lock on
// the same bytes: it gets it only when no process uses the file.
const (
	InUseStart = 0
	InUseLen   = 8
)

// HasOFDLocks reports whether this system has open-file-description locks.
const HasOFDLocks = true

// lockRange takes (or, with typ F_UNLCK, drops) an OFD lock on [start,
// start+n) of f without waiting. It reports false, nil when another open
// file holds a conflicting lock.
func lockRange(fd int, typ int16, start, n int64) (bool, error) {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: start, Len: n}
	err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk)
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%w: F_OFD_SETLK: %w", ErrNoLocks, err)
	}
	return true, nil
}

// LockRange takes an exclusive (write) OFD lock on [start, start+n) of f
// without waiting: false, nil if another open file description holds any
// lock on it.
func LockRange(f *os.File, start, n int64) (bool, error) {
	return lockRange(int(f.Fd()), unix.F_WRLCK, start, n)
}

// UnlockRange drops this open file description's lock on [start, start+n).
func UnlockRange(f *os.File, start, n int64) error {
	_, err := lockRange(int(f.Fd()), unix.F_UNLCK, start, n)
	return err
}

// RangeLocked reports whether an open file description other than fd's
// holds a lock on any byte of [start, start+n). ok is false when the kernel
// could not tell (fd closed, a file system without such locks): the caller
// must not conclude anything.
func RangeLocked(fd int, start, n int64) (locked, ok bool) {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: start, Len: n}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk); err != nil {
		return false, false
	}
	return lk.Type != unix.F_UNLCK, true
}

// takeInUse takes the in-use read lock on f. busy: a replacer holds the
// write lock.
func takeInUse(f *os.File) (busy bool, err error) {
	ok, err := lockRange(int(f.Fd()), unix.F_RDLCK, InUseStart, InUseLen)
	return !ok && err == nil, err
}

// takeReplace takes the in-use write lock on f: false when any other open
// file description holds the in-use lock (a user of the table, or another
// replacer).
func takeReplace(f *os.File) (bool, error) {
	return lockRange(int(f.Fd()), unix.F_WRLCK, InUseStart, InUseLen)
}

// openedElsewhere reports whether any open file other than f (a
// descriptor or a mapping of any process) refers to f's file, asked of the
// kernel with a write lease (F_SETLEASE), which is granted only when no
// other open file exists; the lease is dropped at once. ok is false when
// the kernel would not answer (not the file's owner and no CAP_LEASE,
// leases disabled, a file system without leases).
func openedElsewhere(f *os.File) (elsewhere, ok bool) {
	fd := int(f.Fd())
	// Should another process open the file while the lease is held, the
	// kernel signals the holder: SIGURG, whose default is to be ignored
	// (SIGIO's would end a host program that is not Go, a Python one using
	// the C library), and which the Go runtime expects anyway.
	unix.FcntlInt(uintptr(fd), unix.F_SETSIG, int(unix.SIGURG))
	_, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_WRLCK)
	switch {
	case err == nil:
		unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
		return false, true
	case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EBUSY):
		return true, true
	default:
		return false, false
	}
}

// File systems whose locks or shared mappings do not reach every process
// that can open the file: network and user-space file systems (another
// host's process, or a mapping the kernel does not keep coherent).
var unsafeFS = map[int64]string{
	0x6969:     "nfs",
	0xFF534D42: "cifs",
	0xFE534D42: "smb2",
	0x517B:     "smb",
	0x01021997: "9p",
	0x5346414F: "afs",
	0x00C36400: "ceph",
	0x73757245: "coda",
	0x65735546: "fuse",
	0x47504653: "gpfs",
	0x0BD00BD0: "lustre",
	0x01161970: "gfs2",
	0x7461636F: "ocfs2",
}

// checkFS refuses a file on a file system whose locks or mappings do not
// reach every process (ErrUnsafeFS naming the type).
func checkFS(f *os.File, path string) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return nil // cannot tell: the lock check that follows decides
	}
	if name, bad := unsafeFS[int64(uint32(st.Type))]; bad {
		return fmt.Errorf("%w: %s is on a %s file system (type %#x): its locks and shared mappings do not reach every process that can open it", ErrUnsafeFS, path, name, uint32(st.Type))
	}
	return nil
}
