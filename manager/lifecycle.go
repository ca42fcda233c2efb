package manager

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/shmlocks/shmlocks/table"
)

// lifecycle is a Manager's life: Open makes it (the table mapped, our
// agent registered in it), Close ends it, and every table operation in
// between is counted in flight so that Close can wait for it (enter,
// leave).
type lifecycle struct {
	t        *table.Table
	a        *table.Agent
	be       Backend // nil: the table; else the locks live in be (NewBackendManager)
	maxName  int     // MaxNameLen of the table or the backend
	path     string
	clientID string

	closed   atomic.Bool
	inflight atomic.Int64  // table operations in progress (Close waits for them)
	closing  chan struct{} // closed by Close: waiters give up
	faulted  atomic.Bool   // a read of the mapping faulted (file truncated): inflight may be off
	bg       sync.WaitGroup
}

// enter marks a table operation in progress; false if the Manager is closed.
func (m *Manager) enter() bool {
	m.life.inflight.Add(1)
	if m.life.closed.Load() {
		m.life.inflight.Add(-1)
		return false
	}
	return true
}

func (m *Manager) leave() { m.life.inflight.Add(-1) }

// pollUntil looks at done every 10 µs until it says true or bound has passed.
func pollUntil(bound time.Duration, done func() bool) {
	for deadline := time.Now().Add(bound); !done() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Microsecond)
	}
}
