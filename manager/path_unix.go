//go:build unix

package manager

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// defaultRoot holds the users' default table directories (a variable for
// the tests, which must not touch the real one).
var defaultRoot = "/tmp"

func defaultPath() string {
	return filepath.Join(defaultRoot, "shmlocks-"+strconv.Itoa(os.Getuid()), "shmlocks.tbl")
}

// ensureDefaultDir creates dir (mode 0700) if it does not exist and checks
// that it is the caller's own: a directory, not a symlink, owned by the
// caller, writable by nobody else.
func ensureDefaultDir(dir string) error {
	created := false
	if err := os.Mkdir(dir, 0o700); err == nil {
		created = true
	} else if !errors.Is(err, fs.ErrExist) {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	uid := os.Getuid()
	switch owner := ownerOf(fi); {
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%w: the default table's directory %s is a symlink; remove it (it is created as a directory of mode 0700)", ErrUnsafeTable, dir)
	case !fi.IsDir():
		return fmt.Errorf("%w: the default table's directory %s is not a directory; remove it (it is created as a directory of mode 0700)", ErrUnsafeTable, dir)
	case owner != uid:
		return fmt.Errorf("%w: the default table's directory %s is owned by uid %d, not by you (uid %d): another user made it, and could read and change your locks; remove it (as root) or use --table", ErrUnsafeTable, dir, owner, uid)
	}
	if created && fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil { // a umask took bits we need
			return err
		}
		return nil
	}
	if p := fi.Mode().Perm(); p&0o022 != 0 {
		return fmt.Errorf("%w: the default table's directory %s has mode %#o: other users could replace the table; chmod 700 %s", ErrUnsafeTable, dir, p, dir)
	}
	return nil
}

// checkPathOwners walks path (made absolute), and the path its symlinks
// lead to: in a world-writable directory, the next component must be owned
// by the caller or root, and the directory must be sticky (else anyone
// could rename what is in it). A missing component ends the walk (Open
// reports it, or creates the file).
func checkPathOwners(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if err := walkOwners(abs); err != nil {
		return err
	}
	dir := filepath.Dir(abs)
	if real, err := filepath.EvalSymlinks(dir); err == nil && real != dir {
		return walkOwners(filepath.Join(real, filepath.Base(abs)))
	}
	return nil
}

func walkOwners(abs string) error {
	uid := os.Getuid()
	parent := "/"
	for _, name := range strings.Split(strings.TrimPrefix(abs, "/"), "/") {
		if name == "" {
			continue
		}
		child := filepath.Join(parent, name)
		dfi, err := os.Stat(parent)
		if err != nil {
			return nil
		}
		if dfi.Mode().Perm()&0o002 != 0 {
			if dfi.Mode()&fs.ModeSticky == 0 {
				return fmt.Errorf("%w: %s is in %s, a directory every user can write to without the sticky bit: anyone could replace it; use a directory other users cannot write to", ErrUnsafeTable, child, parent)
			}
			cfi, err := os.Lstat(child)
			if err != nil {
				return nil
			}
			if owner := ownerOf(cfi); owner != uid && owner != 0 {
				return foreignOwner(child, parent, owner, uid)
			}
		}
		parent = child
	}
	return nil
}

func foreignOwner(p, dir string, owner, uid int) error {
	return fmt.Errorf("%w: %s is owned by uid %d, not by you (uid %d) or root, in the world-writable directory %s: that user could read and change your locks (or steal them); remove it, or share a table in a directory other users cannot write to (docs/cli.md)",
		ErrUnsafeTable, p, owner, uid, dir)
}

func checkOpenedOwner(path string, fi os.FileInfo) error {
	uid := os.Getuid()
	owner := ownerOf(fi)
	if owner == uid || owner == 0 {
		return nil
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	dir := filepath.Dir(abs)
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	if dfi, err := os.Stat(dir); err == nil && dfi.Mode().Perm()&0o002 != 0 {
		return foreignOwner(abs, dir, owner, uid)
	}
	return nil
}

// ownerOf returns the uid that owns fi's file (-1 if unknown).
func ownerOf(fi os.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}
