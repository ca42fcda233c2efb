package manager_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/manager/managertest"
)

// TestConformance runs the backend-agnostic suite on the table: every
// agent a Manager of its own on one file (the etcd module runs the same
// suite on etcd).
func TestConformance(t *testing.T) { conformance(t, manager.FIFO, nil) }

// TestConformanceBounded runs it on tables of bounded fairness, without
// the tests of strict arrival order (managertest.ArrivalOrder): with a
// bound no request reaches in the suite (every release that could grant a
// head leaves it the name, and the head takes its turn) and with 1ms (heads
// that waited longer are served in order).
func TestConformanceBounded(t *testing.T) {
	for _, d := range []time.Duration{time.Hour, time.Millisecond} {
		t.Run(d.String(), func(t *testing.T) { conformance(t, manager.Bounded(d), managertest.ArrivalOrder) })
	}
}

func conformance(t *testing.T, f manager.Fairness, skip []string) {
	path := filepath.Join(t.TempDir(), "locks.tbl")
	managertest.RunExcept(t, func(t *testing.T) *manager.Manager {
		m, err := manager.Open(path, &manager.OpenOptions{MaxResources: 64, MaxRequests: 256, MaxAgents: 64, MaxNameLen: 128, Fairness: f})
		if err != nil {
			t.Fatal(err)
		}
		if m.Fairness() != f {
			t.Fatalf("table fairness %v, want %v", m.Fairness(), f)
		}
		t.Cleanup(func() {
			if err := m.Check(); err != nil && err != manager.ErrClosed {
				t.Errorf("check: %v", err)
			}
			m.Close()
		})
		return m
	}, skip)
}
