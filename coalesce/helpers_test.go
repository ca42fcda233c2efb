package coalesce

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/seam"
	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/manager/managertest"
)

// Bounds of every blocking wait in the tests: anything expected must happen
// within eventually (the conformance suite's bound).
var eventually = managertest.Eventually

var smallTable = &manager.OpenOptions{MaxResources: 64, MaxRequests: 256, MaxAgents: 32, MaxNameLen: 64}

func tablePath(t testing.TB) string { return filepath.Join(t.TempDir(), "locks.tbl") }

// openM opens a Manager on path (smallTable), closed at cleanup.
func openM(t testing.TB, path string) *manager.Manager {
	t.Helper()
	m, err := manager.Open(path, smallTable)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitPending waits until m's Query shows n pending requests on name.
func waitPending(t testing.TB, m *manager.Manager, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(eventually)
	for {
		s, err := m.Query(context.Background())
		require.NoError(t, err)
		c := 0
		for _, p := range s.Pending {
			if p.Name == name {
				c++
			}
		}
		if c == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pending on %q, want %d: %+v", c, name, n, s)
		}
		time.Sleep(time.Millisecond)
	}
}

// checkAll runs the table's checker and the outcome store's.
func checkAll(t testing.TB, m *manager.Manager) {
	t.Helper()
	require.NoError(t, m.Check())
	require.NoError(t, New(m).Check())
}

// flightMembers is the number of callers waiting in m's flight on key.
func flightMembers(m *manager.Manager, key string) int {
	mu.Lock()
	defer mu.Unlock()
	if f := flights[flightKey{m, key}]; f != nil {
		return len(f.waiting)
	}
	return 0
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
