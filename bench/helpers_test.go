package bench

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/internal/proctest"
	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/manager/managertest"
	"github.com/shmlocks/shmlocks/table"
)

// eventually bounds every wait of the benchmarks for something that must
// happen (the conformance suite's bound).
var eventually = managertest.Eventually

var smallTable = &manager.OpenOptions{MaxResources: 64, MaxRequests: 256, MaxAgents: 32, MaxNameLen: 64}

func tablePath(t testing.TB) string { return filepath.Join(t.TempDir(), "bench.tbl") }

// openM opens a Manager on path (opts nil: smallTable), closed at cleanup.
func openM(t testing.TB, path string, opts *manager.OpenOptions) *manager.Manager {
	t.Helper()
	if opts == nil {
		opts = smallTable
	}
	m, err := manager.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// waitPending waits until m's Query shows n pending requests on name.
func waitPending(t testing.TB, m *manager.Manager, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(eventually)
	for {
		s, err := m.Query(context.Background())
		if err != nil {
			t.Fatal(err)
		}
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

// tableOf maps the table file at path read-write (table.Open: the file's
// own geometry), for the figures the API does not show; unmapped at
// cleanup. The benchmarks only read it, but the CAS floor's word.
func tableOf(t testing.TB, path string) *table.Table {
	t.Helper()
	tb, _, err := table.Open(path, table.DefaultGeometry, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	return tb
}

// parkedOf returns a reader of the number of m's requests parked (past
// their spin phase), from m's agent record in the table at path.
func parkedOf(t testing.TB, path string, m *manager.Manager) func() uint32 {
	t.Helper()
	tb := tableOf(t, path)
	return func() uint32 {
		for _, ai := range tb.Agents() {
			if inspect.ClientID(ai.Nonce) == m.ClientID() {
				return ai.Parked
			}
		}
		t.Fatalf("no agent record of client %s", m.ClientID())
		return 0
	}
}

// The children of the multi-process benchmarks (internal/proctest).
func TestHelperProcess(t *testing.T) {
	proctest.Main(t, childRoles)
}

var childRoles = proctest.Roles{}

// child is a running child process.
type child struct {
	*proctest.Child
	t testing.TB
}
