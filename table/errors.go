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
	// ErrFormat: the file is a lock table of another format (FormatError
	// says which). A table of an older format is replaced by Open itself
	// once no process uses it; while one does, or for a newer format, Open
	// refuses it.
	ErrFormat = errors.New("table: lock table of another format")
	// ErrAgentGone: the caller's own agent record was reaped or reused.
	ErrAgentGone = errors.New("table: agent record is gone")
)

func corruptf(field string, value any, format string, args ...any) error {
	return fmt.Errorf("%w: %s = %v (%s)", ErrCorrupt, field, value, fmt.Sprintf(format, args...))
}

func fullf(limit string, n int) error {
	return fmt.Errorf("%w: no free %s (limit %d)", ErrTableFull, limit, n)
}

// formatRetired is the version a replacer writes into a table it replaced,
// so that a process that opened the old file at that moment refuses it.
const formatRetired = 0xFFFFFFFF

// FormatError reports a table file of another format.
type FormatError struct {
	Found  uint32 // the file's format version (formatRetired: replaced)
	InUse  string // who still uses it, when Open could not replace it (or an inspector found)
	Unused bool   // an inspector found nobody using it: the next Open replaces it
}

func (e *FormatError) Error() string {
	switch {
	case e.Found == formatRetired:
		return "table: the file was replaced by a newer table (it is no longer at its path)"
	case e.Found > FormatVersion:
		return fmt.Sprintf("table: format = %d: the file was made by a newer shmlocks (this build reads format %d): upgrade this program", e.Found, FormatVersion)
	case e.InUse != "":
		return fmt.Sprintf("table: format = %d: the file was made by an older shmlocks (this build reads format %d) and is in use by %s: it is replaced by itself once no process uses it", e.Found, FormatVersion, e.InUse)
	case e.Unused:
		return fmt.Sprintf("table: format = %d: the file was made by an older shmlocks (this build reads format %d); no process uses it: the next Open replaces it", e.Found, FormatVersion)
	}
	return fmt.Sprintf("table: format = %d: the file was made by an older shmlocks (this build reads format %d)", e.Found, FormatVersion)
}

func (e *FormatError) Is(target error) bool { return target == ErrFormat }
