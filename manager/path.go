package manager

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/shmlocks/shmlocks/table"
)

// ErrUnsafeTable: the table file, or a directory on its path, could be
// controlled by another user (owned by someone else than the caller or root
// in a world-writable directory, a world-writable directory without the
// sticky bit, or the default table's directory not the caller's own). The
// message says which and why.
var ErrUnsafeTable = errors.New("shmlocks: table location not safe")

// DefaultPath returns the default table of the calling user: one file per
// user, the same in a login shell, cron, a systemd service or sudo of the
// same uid, because it depends on nothing but the uid (no environment
// variable): /tmp/shmlocks-UID/shmlocks.tbl on Unix, in a directory that
// Open creates for the user with mode 0700, and refuses if it belongs to
// anyone else, is a symlink, or can be written by others. Elsewhere it is
// shmlocks.tbl in the user's temporary directory.
//
// /tmp rather than $XDG_RUNTIME_DIR (not set under cron or sudo, removed at
// logout) or /dev/shm (emptied of a user's files when the last session of
// that user ends, with systemd-logind's RemoveIPC=yes: a table removed
// while in use would split its users between two files). A service with
// its own /tmp (systemd's PrivateTmp=yes) does not see it: give it a
// --table (OpenOptions path) of its own choice.
func DefaultPath() string { return defaultPath() }

// checkTablePath refuses a path that another user could control, and
// creates the default table's directory (see DefaultPath) when path is the
// default table.
func checkTablePath(path string) error {
	if path == DefaultPath() {
		if err := ensureDefaultDir(filepath.Dir(path)); err != nil {
			return err
		}
	}
	return checkPathOwners(path)
}

// checkOpenedTable checks the owner of the file Open mapped (the one it
// opened, not the name, which may have changed since checkTablePath).
func checkOpenedTable(path string, t *table.Table) error {
	fi, err := t.Stat()
	if err != nil {
		return fmt.Errorf("stat: %w", err)
	}
	return checkOpenedOwner(path, fi)
}
