package table

import (
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The fixtures of the table's tests: a table file of a test, and a
// liveness check that declares agents dead on demand.

var smallGeometry = Geometry{MaxResources: 16, MaxRequests: 64, MaxAgents: 16, MaxNameLen: 32}

func newTestTable(t testing.TB, g Geometry) *Table {
	t.Helper()
	tb, created, err := Open(filepath.Join(t.TempDir(), "t.tbl"), g, 0)
	require.NoError(t, err)
	require.True(t, created)
	t.Cleanup(func() { tb.Close() })
	return tb
}

// fakeLiveness lets a test declare agents (by PID) dead.
type fakeLiveness struct {
	mu   sync.Mutex
	dead map[int]bool
}

func installFakeLiveness(t testing.TB) *fakeLiveness {
	f := &fakeLiveness{dead: map[int]bool{}}
	setLiveness(func(id Identity) bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return !f.dead[id.PID]
	})
	t.Cleanup(func() { setLiveness(nil) })
	return f
}

func (f *fakeLiveness) kill(pid int) {
	f.mu.Lock()
	f.dead[pid] = true
	f.mu.Unlock()
}
