package table

import (
	"errors"
	"fmt"
)

// Errors returned by the table. Callers test them with errors.Is; the
// wrapped message names the field, limit or value involved.
var (
	// ErrCorrupt: the bytes of the file do not form a valid table (bad magic,
	// version, checksum, geometry, size, or an index or state out of range).
	ErrCorrupt = errors.New("table: corrupt lock table")
	// ErrGeometry: a requested geometry is out of range.
	ErrGeometry = errors.New("table: invalid geometry")
	// ErrTableFull: no free entry, slot or agent record; nothing held or queued was disturbed.
	ErrTableFull = errors.New("table: table full")
	// ErrNotHeld: the request is no longer held by the caller (released, stolen or reaped).
	ErrNotHeld = errors.New("table: request not held")
	// ErrStolen: the request was taken away by a steal.
	ErrStolen = errors.New("table: request stolen")
	// ErrNotAvailable: an if-available request was not grantable at once.
	ErrNotAvailable = errors.New("table: not available")
	// ErrAgentGone: the caller's own agent record was reaped or reused.
	ErrAgentGone = errors.New("table: agent record is gone")
)

func corruptf(field string, value any, format string, args ...any) error {
	return fmt.Errorf("%w: %s = %v (%s)", ErrCorrupt, field, value, fmt.Sprintf(format, args...))
}

func fullf(limit string, n int) error {
	return fmt.Errorf("%w: no free %s (limit %d)", ErrTableFull, limit, n)
}
