//go:build !unix

package manager

import (
	"os"
	"path/filepath"
)

// Outside Unix the user's temporary directory is already the user's own.
func defaultPath() string { return filepath.Join(os.TempDir(), "shmlocks.tbl") }

func ensureDefaultDir(string) error              { return nil }
func checkPathOwners(string) error               { return nil }
func checkOpenedOwner(string, os.FileInfo) error { return nil }
