package manager_test

import (
	"testing"

	"github.com/shmlocks/shmlocks/manager/managertest"
)

// The tests' kit is managertest's (the kit of every package built on a
// Manager), under the short names the tests use: a table for a test, a
// request in the background and the bounded checks of its outcome.
var (
	quietPeriod  = managertest.QuietPeriod // "still blocked" holds this long
	eventually   = managertest.Eventually  // what must happen, happens within this
	smallTable   = managertest.SmallTable
	tablePath    = managertest.TablePath
	openM        = managertest.Open
	check        = managertest.Check
	ctxT         = managertest.Context
	acquireAsync = managertest.AcquireAsync
	mustBlock    = managertest.MustBlock
	mustGrant    = managertest.MustGrant
	mustFail     = managertest.MustFail
	waitPending  = managertest.WaitPending
)

type result = managertest.Result

// skipFaultsUnderRace skips a test that truncates a live table under
// running goroutines when the race detector is on. The race runtime makes
// some accesses to the mapping from its own code, on the system stack,
// where a fault that SetPanicOnFault turns into a panic cannot always be
// unwound: one CI run of the race suite died with "fatal error: traceback
// did not unwind completely" in the middle of these tests, and never
// outside them. `make test` runs them without -race (the faults target)
// and on the polling build (poll).
func skipFaultsUnderRace(t testing.TB) {
	t.Helper()
	if raceEnabled {
		t.Skip("truncates a live mapping: run without -race (make faults)")
	}
}
