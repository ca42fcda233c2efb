//go:build unix

package manager

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// useDefaultRoot points DefaultPath at a fresh world-writable, sticky
// directory (like /tmp) for the test.
func useDefaultRoot(t *testing.T) string {
	root := filepath.Join(t.TempDir(), "tmp")
	require.NoError(t, os.Mkdir(root, 0o777))
	require.NoError(t, os.Chmod(root, 0o777|os.ModeSticky))
	old := defaultRoot
	defaultRoot = root
	t.Cleanup(func() { defaultRoot = old })
	return root
}

// The default table depends on the uid only, not on the environment.
func TestDefaultPathIgnoresEnvironment(t *testing.T) {
	want := DefaultPath()
	require.Contains(t, want, "shmlocks-"+strconv.Itoa(os.Getuid()))
	for _, kv := range [][2]string{{"XDG_RUNTIME_DIR", "/run/user/1"}, {"XDG_RUNTIME_DIR", ""}, {"TMPDIR", "/elsewhere"},
		{"HOME", "/"}, {"USER", "x"}, {"SUDO_UID", "77"}, {"SHMLOCKS_TABLE", "/x.tbl"}} {
		t.Setenv(kv[0], kv[1])
		require.Equal(t, want, DefaultPath(), "%s=%q", kv[0], kv[1])
	}
}

// Open of the default table creates its directory, the user's, mode 0700
// whatever the umask, and the table in it with mode 0600.
func TestDefaultDirCreatedPrivate(t *testing.T) {
	useDefaultRoot(t)
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	m, err := Open(DefaultPath(), smallTable)
	require.NoError(t, err)
	defer m.Close()
	fi, err := os.Lstat(filepath.Dir(DefaultPath()))
	require.NoError(t, err)
	require.True(t, fi.IsDir())
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	require.Equal(t, os.Getuid(), ownerOf(fi))
	fi, err = os.Stat(DefaultPath())
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	// Opened again: the same table.
	m2, err := Open(DefaultPath(), nil)
	require.NoError(t, err)
	m2.Close()
}

// A default directory that is a symlink, not a directory, writable by
// others, or (as root: planted) owned by another user is refused with
// ErrUnsafeTable and the reason.
func TestDefaultDirRefused(t *testing.T) {
	for _, c := range []struct {
		name, says string
		plant      func(t *testing.T, dir string)
		root       bool
	}{
		{"symlink", "is a symlink", func(t *testing.T, dir string) {
			require.NoError(t, os.Symlink(t.TempDir(), dir))
		}, false},
		{"file", "not a directory", func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(dir, nil, 0o600))
		}, false},
		{"group-writable", "has mode", func(t *testing.T, dir string) {
			require.NoError(t, os.Mkdir(dir, 0o700))
			require.NoError(t, os.Chmod(dir, 0o770))
		}, false},
		{"planted", "owned by uid 4242", func(t *testing.T, dir string) {
			require.NoError(t, os.Mkdir(dir, 0o777))
			require.NoError(t, os.Lchown(dir, 4242, 4242))
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.root && os.Getuid() != 0 {
				t.Skip("planting a directory owned by another user needs root")
			}
			useDefaultRoot(t)
			c.plant(t, filepath.Dir(DefaultPath()))
			m, err := Open(DefaultPath(), smallTable)
			if m != nil {
				m.Close()
			}
			require.ErrorIs(t, err, ErrUnsafeTable)
			require.ErrorContains(t, err, c.says)
		})
	}
}

// Any table path: a file or directory owned by another user (not root) in
// a world-writable directory is refused, and so is a world-writable
// directory without the sticky bit; a table shared on purpose, in a
// directory others cannot write to, opens.
func TestPlantedTableRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("planting files owned by another user needs root")
	}
	tmp := useDefaultRoot(t)
	planted := filepath.Join(tmp, "t.tbl")
	m, err := Open(planted, &OpenOptions{MaxResources: 4, MaxRequests: 8, MaxAgents: 4, MaxNameLen: 8, FileMode: 0o666})
	require.NoError(t, err)
	m.Close()
	require.NoError(t, os.Lchown(planted, 4242, 4242))
	_, err = Open(planted, nil)
	require.ErrorIs(t, err, ErrUnsafeTable)
	require.ErrorContains(t, err, "owned by uid 4242")

	// A directory planted on the way.
	sub := filepath.Join(tmp, "sub")
	require.NoError(t, os.Mkdir(sub, 0o777))
	require.NoError(t, os.Lchown(sub, 4242, 4242))
	_, err = Open(filepath.Join(sub, "t.tbl"), nil)
	require.ErrorIs(t, err, ErrUnsafeTable)
	require.NoFileExists(t, filepath.Join(sub, "t.tbl"), "nothing created there")

	// A symlink planted by another user, to a place of ours.
	link := filepath.Join(tmp, "link")
	require.NoError(t, os.Symlink(t.TempDir(), link))
	require.NoError(t, os.Lchown(link, 4242, 4242))
	_, err = Open(filepath.Join(link, "t.tbl"), nil)
	require.ErrorIs(t, err, ErrUnsafeTable)

	// World-writable without the sticky bit.
	open := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(open, 0o777))
	require.NoError(t, os.Chmod(open, 0o777))
	_, err = Open(filepath.Join(open, "t.tbl"), nil)
	require.ErrorIs(t, err, ErrUnsafeTable)
	require.ErrorContains(t, err, "sticky")

	// The check after the open looks at the file opened.
	fi, err := os.Stat(planted)
	require.NoError(t, err)
	require.ErrorIs(t, checkOpenedOwner(planted, fi), ErrUnsafeTable)

	// Shared on purpose: a group directory; the file belongs to another user.
	team := filepath.Join(t.TempDir(), "team")
	require.NoError(t, os.Mkdir(team, 0o770))
	shared := filepath.Join(team, "t.tbl")
	m, err = Open(shared, &OpenOptions{FileMode: 0o660})
	require.NoError(t, err)
	m.Close()
	require.NoError(t, os.Lchown(shared, 4242, 4242))
	m, err = Open(shared, nil)
	require.NoError(t, err)
	m.Close()
}
