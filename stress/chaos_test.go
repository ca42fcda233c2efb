//go:build unix

package stress

import (
	"bytes"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestChaos is the process-death chaos run of the suite: six processes
// hammer four names with mixed modes, IfAvailable, steals and deadlines
// while the supervisor SIGKILLs a random holder every 250 ms and starts a
// replacement. The checks are independent of the lock code (stress/doc.go):
// occupancy per name, a non-atomic counter inside exclusive sections, fencing
// tokens never going backwards, no stuck waiter, no two-second window without
// a grant; afterwards the table must pass the checker and Query must show
// nothing of the dead. 20 s by default; SHMLOCKS_CHAOS_SECONDS runs it longer.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("long chaos run (skipped with -short)")
	}
	secs := 20
	if v, err := strconv.Atoi(os.Getenv("SHMLOCKS_CHAOS_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	hold, err := ParseHold("exp:100us")
	require.NoError(t, err)
	cfg := Config{
		Backend: BackendShmlocks, Procs: 6, Goroutines: 2, Names: 4, Duration: time.Duration(secs) * time.Second,
		Shared: 0.3, IfAvailable: 0.1, Steal: 0.01, Timeout: 0.1, Deadline: 5 * time.Millisecond, Hold: hold,
		Chaos: 4, MaxGrantGap: 2 * time.Second, Worker: []string{os.Args[0]},
	}
	var stderr bytes.Buffer
	rep, err := Run(cfg, &stderr)
	require.NoError(t, err, stderr.String())
	t.Logf("seed %d: %d ops (%.0f/s), %d kills, %d exclusive + %d shared grants, reap p50 %.0fus max %.0fus, table %s",
		rep.Seed, rep.Ops, rep.OpsPerSec, rep.Kills, rep.ExclusiveGrants, rep.SharedGrants, rep.ReapUs.P50, rep.ReapUs.Max, rep.Table)
	require.Zero(t, rep.Violations, "violations: %q (table kept: %v at %s)", rep.ViolationMessages, rep.TableKept, rep.Table)
	require.Greater(t, rep.Kills, secs, "the supervisor kills every 250 ms")
	require.Greater(t, rep.ExclusiveGrants, int64(0))
	require.Greater(t, rep.SharedGrants, int64(0))
}
