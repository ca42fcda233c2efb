package manager_test

import (
	"path/filepath"
	"testing"

	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/manager/managertest"
)

// TestConformance runs the backend-agnostic suite on the table: every
// agent a Manager of its own on one file (the etcd module runs the same
// suite on etcd).
func TestConformance(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locks.tbl")
	managertest.Run(t, func(t *testing.T) *manager.Manager {
		m, err := manager.Open(path, &manager.OpenOptions{MaxResources: 64, MaxRequests: 256, MaxAgents: 64, MaxNameLen: 128})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := m.Check(); err != nil && err != manager.ErrClosed {
				t.Errorf("check: %v", err)
			}
			m.Close()
		})
		return m
	})
}
