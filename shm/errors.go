package shm

import "errors"

var (
	// ErrSymlink is returned when path is a symbolic link.
	ErrSymlink = errors.New("shm: refusing to open a symbolic link")
	// ErrTooSmall is returned when an existing file is smaller than the
	// required minimum size (or empty); the file is not mapped.
	ErrTooSmall = errors.New("shm: file too small")
	// ErrBounds is returned by the checked accessors for an offset that is out
	// of range or not aligned to the word size.
	ErrBounds = errors.New("shm: offset out of bounds or misaligned")
	// ErrNotRegular is returned when path is not a regular file (a directory,
	// FIFO, device, socket...).
	ErrNotRegular = errors.New("shm: not a regular file")
	// ErrClosed is returned by the checked accessors after Close.
	ErrClosed = errors.New("shm: mapping is closed")
	// ErrUnsafeFS is returned for a file on a file system whose locks or
	// shared mappings do not reach every process that can open it (NFS,
	// SMB, 9p, FUSE...): processes there could hold one lock twice.
	ErrUnsafeFS = errors.New("shm: file system not safe for a shared lock table")
	// ErrNoLocks is returned when the kernel refuses the open-file-description
	// locks that mark a file in use and its users alive.
	ErrNoLocks = errors.New("shm: file system without open-file-description locks")
	// ErrInUse is returned by Replace when another process still uses the file.
	ErrInUse = errors.New("shm: file in use")
	// ErrReplaced: path no longer names the file this process has open.
	ErrReplaced = errors.New("shm: file replaced or removed")
	// ErrBusy is returned when another process keeps replacing the file for
	// longer than Open waits.
	ErrBusy = errors.New("shm: file being replaced")
)
