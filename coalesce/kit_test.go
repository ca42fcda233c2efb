package coalesce_test

import (
	"testing"

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
