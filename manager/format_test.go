package manager_test

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/table"
)

// oldFormat makes a table file at path that claims an older format (the
// fixture of a previous release's table: a valid header whose version is
// formatVersion-1, checksum recomputed).
func oldFormat(t *testing.T, path string) {
	t.Helper()
	m := openM(t, path, nil)
	require.NoError(t, m.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	ne := binary.NativeEndian
	ne.PutUint32(b[8:], table.FormatVersion-1)
	ne.PutUint32(b[112:], crc32.Checksum(b[:112], crc32.MakeTable(crc32.Castagnoli)))
	require.NoError(t, os.Remove(path))
	require.NoError(t, os.WriteFile(path, b, 0o600))
}

// A table of an older format is refused while a process has it open (an
// old build's process: here a child holding a descriptor of it) with the
// format found, and replaced by Open itself once nobody does.
func TestOldFormatReplacedOnceUnused(t *testing.T) {
	path := tablePath(t)
	oldFormat(t, path)
	f, err := os.Open(path)
	require.NoError(t, err)
	user := exec.Command("sleep", "60")
	user.ExtraFiles = []*os.File{f}
	require.NoError(t, user.Start())
	f.Close()
	t.Cleanup(func() { user.Process.Kill(); user.Wait() })

	_, err = Open(path, smallTable)
	require.ErrorIs(t, err, ErrFormat)
	var fe *table.FormatError
	require.True(t, errors.As(err, &fe))
	require.Equal(t, uint32(table.FormatVersion-1), fe.Found)
	require.NotEmpty(t, fe.InUse, "says who uses it")
	require.False(t, errors.Is(err, ErrCorrupt), "another format is not a corrupt table")
	st1, err := os.Stat(path)
	require.NoError(t, err)

	require.NoError(t, user.Process.Kill())
	user.Wait()
	m := openM(t, path, nil)
	st2, err := os.Stat(path)
	require.NoError(t, err)
	require.False(t, os.SameFile(st1, st2), "a new file took its place")
	l, err := m.Acquire(ctxT(t, eventually), "x", RequestOptions{IfAvailable: true})
	require.NoError(t, err)
	require.NoError(t, l.Release())
	check(t, m)
	ents, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	require.Len(t, ents, 1, "no temporary file left behind")
}

// A table of a newer format is never replaced.
func TestNewerFormatRefused(t *testing.T) {
	path := tablePath(t)
	oldFormat(t, path)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	ne := binary.NativeEndian
	ne.PutUint32(b[8:], table.FormatVersion+1)
	ne.PutUint32(b[112:], crc32.Checksum(b[:112], crc32.MakeTable(crc32.Castagnoli)))
	require.NoError(t, os.WriteFile(path, b, 0o600))
	_, err = Open(path, smallTable)
	require.ErrorIs(t, err, ErrFormat)
	require.Contains(t, err.Error(), "newer")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, b, after, "left as it was")
}

// Eight new processes that find one unused old-format table at once end
// up on one new table: one replaces it, the others open the new file.
func TestOldFormatEightRacers(t *testing.T) {
	path := tablePath(t)
	oldFormat(t, path)
	var kids []*child
	for i := 0; i < 8; i++ {
		kids = append(kids, start(t, path, nil, ""))
	}
	for _, k := range kids {
		k.ready()
	}
	m := openM(t, path, nil)
	require.Len(t, m.Table().Agents(), 9, "all eight children and this Manager on one table")
	for i, k := range kids {
		k.Send("acquire x ifavailable")
		if i == 0 {
			k.Expect("acquired x")
		} else {
			k.Expect("notavailable x")
		}
	}
	check(t, m)
}

// A replacer that died between marking the old table retired and renaming
// the new one over it leaves a retired file at the path (and maybe its
// temporary file): the next Open replaces it, as it does an unused old
// format.
func TestRetiredTableLeftByADeadReplacer(t *testing.T) {
	path := tablePath(t)
	oldFormat(t, path)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	binary.NativeEndian.PutUint32(b[8:], 0xFFFFFFFF) // retired, as Replace writes it before its rename
	require.NoError(t, os.WriteFile(path, b, 0o600))
	m := openM(t, path, nil)
	l, err := m.Acquire(ctxT(t, eventually), "x", RequestOptions{IfAvailable: true})
	require.NoError(t, err)
	require.NoError(t, l.Release())
	check(t, m)
}
