// Package members lets coalesce's test kit (coalesce/coalescetest) see how
// many callers wait in a Manager's flight on a key, without making it
// public API: package coalesce registers the count in its init.
package members

import (
	"sync/atomic"

	"github.com/shmlocks/shmlocks/manager"
)

var count atomic.Pointer[func(m *manager.Manager, key string) int]

// Register sets the function Count calls (package coalesce, once).
func Register(f func(m *manager.Manager, key string) int) { count.Store(&f) }

// Count is the number of callers waiting in m's flight on key (not the one
// running fn): 0 when package coalesce is not linked in.
func Count(m *manager.Manager, key string) int {
	if f := count.Load(); f != nil {
		return (*f)(m, key)
	}
	return 0
}
