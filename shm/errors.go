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
)
