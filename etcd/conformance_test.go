package etcd

import (
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/manager/managertest"
)

// TestConformance runs the manager's conformance suite on a single-member
// embedded etcd: every agent a Manager with a client of its own.
func TestConformance(t *testing.T) {
	c := startCluster(t, 1)
	managertest.Run(t, func(t *testing.T) *manager.Manager {
		m, err := Open(ctxT(t, 10*time.Second), c.client(t), "/shmlocks-test", &Options{TTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	})
}
