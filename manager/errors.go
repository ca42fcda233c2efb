package manager

import (
	"errors"

	"github.com/shmlocks/shmlocks/table"
)

// Errors. Test them with errors.Is; the wrapped message says which name,
// limit or field is involved.
var (
	// ErrNotSupported: a name starting with '-' or longer than MaxNameLen, an
	// invalid Mode, or a forbidden option mix (Steal with IfAvailable or Shared).
	ErrNotSupported = errors.New("shmlocks: not supported")
	// ErrAborted: ctx ended before the grant. The error also matches ctx.Err().
	ErrAborted = errors.New("shmlocks: request aborted")
	// ErrNotAvailable: Acquire with IfAvailable found the lock not grantable at once.
	ErrNotAvailable = errors.New("shmlocks: lock not available")
	// ErrStolen: the lock was stolen, or reaped, while held.
	ErrStolen = errors.New("shmlocks: lock stolen")
	// ErrClosed: the Manager was closed.
	ErrClosed = errors.New("shmlocks: manager closed")
	// ErrTableFull: no free resource, request or agent entry; nothing held is disturbed.
	ErrTableFull = table.ErrTableFull
	// ErrCorrupt: the file is not a valid lock table (bad magic, geometry,
	// size, checksum or indices).
	ErrCorrupt = table.ErrCorrupt
	// ErrFormat: the file is a lock table of another format
	// (*table.FormatError says which). Open replaces a table of an older
	// format by itself once no process uses it; while one does (the error
	// says who), or for a newer format, it refuses it.
	ErrFormat = table.ErrFormat
	// ErrReleased: Release of a lock that was already released (added to the v1 contract).
	ErrReleased = errors.New("shmlocks: lock already released")
	// ErrDeadlock: a waiting request was chosen as the victim of a wait-for
	// cycle (docs/multi-and-deadlock.md); the message names the cycle.
	ErrDeadlock = errors.New("shmlocks: deadlock")
)

// Errors of the reentrant requests (v2).
var (
	// ErrWouldDeadlock: a request whose ctx carries a held lock on the same
	// name (WithLock, or the ctx of Request's fn) needs more than that lock
	// gives (exclusive asked, shared held): it could never be granted while
	// the caller holds the lock, so it fails at once instead of waiting.
	// Packages built on the Manager use it for the same mistake in their
	// own terms (coalesce: Do on a key from the fn of that key's flight).
	ErrWouldDeadlock = errors.New("shmlocks: reentrant request would deadlock")
)

// errorsIsAny reports whether err matches any of targets.
func errorsIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
