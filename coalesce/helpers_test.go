package coalesce

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/seam"
	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/manager/managertest"
)

// The tests' kit is managertest's (the kit of the packages built on a
// Manager): a table for a test and the bounded waits.
var (
	eventually  = managertest.Eventually
	smallTable  = managertest.SmallTable
	tablePath   = managertest.TablePath
	ctxT        = managertest.Context
	waitPending = managertest.WaitPending
)

// openM opens a Manager on path (smallTable), closed at cleanup.
func openM(t testing.TB, path string) *manager.Manager { return managertest.Open(t, path, nil) }

// checkAll runs the table's checker and the outcome store's.
func checkAll(t testing.TB, m *manager.Manager) {
	t.Helper()
	require.NoError(t, m.Check())
	require.NoError(t, New(m).Check())
}

// waitMembers waits (bounded) until n callers wait in m's flight on key.
func waitMembers(t testing.TB, m *manager.Manager, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(eventually)
	for flightMembers(m, key) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d callers in the flight on %q, want %d", flightMembers(m, key), key, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// recordPath is the file of key's outcome in the table store of path.
func recordPath(path, key string) string {
	return seam.FilePath(path+"."+feature, recordKey(key))
}
