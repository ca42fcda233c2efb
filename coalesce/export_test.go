package coalesce

import (
	"fmt"
	"sync"
	"testing"

	"github.com/shmlocks/shmlocks/manager"
)

// NewMemClients returns functions that open Managers on one new in-memory
// backend with a record store (backend_test.go), and that take every grant
// of one of them away: the kit's third bucket.
func NewMemClients() (open func(t *testing.T) *manager.Manager, cut func(m *manager.Manager)) {
	b := newMemBucket()
	var mu sync.Mutex
	clients := map[*manager.Manager]*memClient{}
	open = func(t *testing.T) *manager.Manager {
		mu.Lock()
		defer mu.Unlock()
		c := &memClient{b: b, id: fmt.Sprintf("c%d", len(clients)), closing: make(chan struct{})}
		m := manager.NewBackendManager(c)
		t.Cleanup(func() { m.Close() })
		clients[m] = c
		return m
	}
	cut = func(m *manager.Manager) {
		mu.Lock()
		c := clients[m]
		mu.Unlock()
		c.cut()
	}
	return open, cut
}
