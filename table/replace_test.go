package table

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// setVersion rewrites the format version of the table file at path (and
// its checksum), as a table of another build.
func setVersion(t *testing.T, path string, v uint32) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	b := make([]byte, HeaderSize)
	_, err = f.ReadAt(b, 0)
	require.NoError(t, err)
	binary.NativeEndian.PutUint32(b[hdrVersion:], v)
	binary.NativeEndian.PutUint32(b[hdrChecksum:], headerChecksum(b))
	_, err = f.WriteAt(b, 0)
	require.NoError(t, err)
}

// An inspector (dump, serve) told of an older format says whether a
// process uses it (one holding the in-use lock; an old format's agent
// naming a running process) or not (the next Open replaces it).
func TestFormatUseReported(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.tbl")
	tb, _, err := Open(path, smallGeometry, 0)
	require.NoError(t, err)
	_, err = tb.Register(Self(), 1)
	require.NoError(t, err)
	setVersion(t, path, FormatVersion-1)

	_, err = OpenReadOnly(path)
	var fe *FormatError
	require.True(t, errors.As(err, &fe), "%v", err)
	require.Contains(t, fe.InUse, "in-use lock", "a process of this format maps it")
	require.False(t, errors.Is(err, ErrCorrupt))
	tb.Close() // its in-use lock goes; its agent record stays, naming this live process

	_, err = OpenReadOnly(path)
	require.True(t, errors.As(err, &fe))
	require.Contains(t, fe.InUse, fmt.Sprintf("pids %d", os.Getpid()), "an old format's agent naming a running process")

	// No agent naming a running process, nobody mapping it: unused.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	b := make([]byte, HeaderSize)
	f.ReadAt(b, 0)
	off := binary.NativeEndian.Uint64(b[hdrAgentsOff:])
	n := binary.NativeEndian.Uint32(b[hdrMaxAgents:])
	_, err = f.WriteAt(make([]byte, int(n)*AgentSize), int64(off))
	require.NoError(t, err)
	f.Close()
	_, err = OpenReadOnly(path)
	require.True(t, errors.As(err, &fe))
	require.True(t, fe.Unused, "%v", err)
	require.Contains(t, err.Error(), "the next Open replaces it")
}
