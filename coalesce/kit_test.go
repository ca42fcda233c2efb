package coalesce_test

import (
	"testing"

	"github.com/shmlocks/shmlocks/coalesce"
	"github.com/shmlocks/shmlocks/coalesce/coalescetest"
	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/manager/managertest"
)

// TestCoalesceKit runs the backend-agnostic coalesce tests on the table:
// every Manager an agent of one table file. (A leader that dies is its
// process: TestCoalesceLeaderKilled and TestCoalesceCrashPoints.)
func TestCoalesceKit(t *testing.T) {
	path := managertest.TablePath(t)
	coalescetest.Run(t, coalescetest.Bucket{Open: func(t *testing.T) *manager.Manager {
		return managertest.Open(t, path, nil)
	}})
}

// TestCoalesceKitOnBackend runs them on an in-memory backend whose store
// has none of the optional parts (seam.Follower, seam.PublishReleaser,
// seam.GrantRead): the protocol's plain form on a backend; its Cut takes a
// client's grants away as the end of a session does.
func TestCoalesceKitOnBackend(t *testing.T) {
	open, cut := coalesce.NewMemClients()
	coalescetest.Run(t, coalescetest.Bucket{
		Open: open,
		Cut:  func(_ *testing.T, m *manager.Manager) { cut(m) },
	})
}
