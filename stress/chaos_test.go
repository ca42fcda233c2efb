//go:build unix

package stress

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// chaosConfig is a chaos run of secs seconds over features at rate kills a second.
func chaosConfig(t *testing.T, secs int, rate float64, features ...string) Config {
	hold, err := ParseHold("exp:100us")
	require.NoError(t, err)
	return Config{
		Backend: BackendShmlocks, Procs: max(len(features), 4), Goroutines: 2, Names: 4, Duration: time.Duration(secs) * time.Second,
		Shared: 0.3, IfAvailable: 0.1, Steal: 0.01, Timeout: 0.1, Deadline: 5 * time.Millisecond, Hold: hold,
		Chaos: rate, MaxGrantGap: 2 * time.Second, Worker: []string{os.Args[0]}, Features: features,
	}
}

// runChaos runs cfg and requires no violation and a kill of every feature.
func runChaos(t *testing.T, cfg Config) *Report {
	t.Helper()
	var stderr bytes.Buffer
	rep, err := Run(cfg, &stderr)
	require.NoError(t, err, stderr.String())
	t.Logf("seed %d: %d ops (%.0f/s), %d kills, %d exclusive + %d shared grants, reap p50 %.0fus max %.0fus, table %s",
		rep.Seed, rep.Ops, rep.OpsPerSec, rep.Kills, rep.ExclusiveGrants, rep.SharedGrants, rep.ReapUs.P50, rep.ReapUs.Max, rep.Table)
	for _, f := range cfg.Features {
		fr := rep.Features[f]
		t.Logf("%s: %d processes, %d requests, %d grants, %d kills (children %d, stale %d, led %d, followed %d)",
			f, fr.Processes, fr.Requests, fr.Grants, fr.Kills, fr.Children, fr.Stale, fr.Led, fr.Followed)
	}
	requireSums(t, rep)
	require.Zero(t, rep.Violations, "violations %v: %q (table kept: %v at %s)\nend of the workers' stderr:\n%s",
		rep.ViolationsByKind, rep.ViolationMessages, rep.TableKept, rep.Table, lastBytes(stderr.String(), 2048))
	// Each feature's max/min compares its own positions: together they
	// span the run's.
	var hi int64
	lo := rep.Fairness.Max
	for _, fr := range rep.Features {
		require.LessOrEqual(t, fr.Fairness.Min, fr.Fairness.Max)
		hi, lo = max(hi, fr.Fairness.Max), min(lo, fr.Fairness.Min)
	}
	if len(rep.Features) > 0 {
		require.Equal(t, rep.Fairness.Max, hi, "per process %v", rep.Fairness.PerProcess)
		require.Equal(t, rep.Fairness.Min, lo, "per process %v", rep.Fairness.PerProcess)
	}
	for _, f := range cfg.Features {
		fr := rep.Features[f]
		require.Positive(t, fr.Kills, "%s: the supervisor kills each feature in turn", f)
		require.Positive(t, fr.Grants, f)
		switch f {
		case FeatureChild:
			require.Positive(t, fr.Children, "child grants")
		case FeatureCoalesce:
			require.Positive(t, fr.Led, "flights led")
		}
	}
	return rep
}

// TestChaosFeatures is the short chaos run over the features the package
// drives itself (exec needs the shmlocks command: cmd/shmlocks's
// TestStressChaos): a plain process, one whose Requests fan out and nest
// child grants, Coalesce callers and AcquireAll callers, a kill every 50 ms,
// each feature in turn. No violation of any kind.
func TestChaosFeatures(t *testing.T) {
	cfg := chaosConfig(t, 3, 20, FeatureCoalesce, FeaturePlain, FeatureChild, FeatureAll)
	cfg.Procs = 5 // two Coalesce processes: leaders in two processes
	runChaos(t, cfg)
}

// lastBytes is the end of s, at most n bytes.
func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// TestChaos is the long process-death chaos run: six processes over the
// features (two of Coalesce and child), four names, mixed modes, IfAvailable, steals and
// deadlines, a kill every 125 ms. The checks are independent of the lock
// code (stress/doc.go): occupancy per name and per grant's children, a
// non-atomic counter inside exclusive sections and per Coalesce key, fencing
// tokens never going backwards, whole results of one's own key, no stuck
// waiter, no two-second window without a grant; afterwards the table must
// pass the checker and Query must show nothing of the dead. 20 s by default;
// SHMLOCKS_CHAOS_SECONDS runs it longer.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("long chaos run (skipped with -short)")
	}
	secs := 20
	if v, err := strconv.Atoi(os.Getenv("SHMLOCKS_CHAOS_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	cfg := chaosConfig(t, secs, 8, FeatureCoalesce, FeatureChild, FeatureAll, FeaturePlain)
	cfg.Procs = 6 // two of Coalesce and child
	rep := runChaos(t, cfg)
	require.Greater(t, rep.Kills, secs*4)
	require.Greater(t, rep.ExclusiveGrants, int64(0))
	require.Greater(t, rep.SharedGrants, int64(0))
}

// TestExecCheckerCatchesAnUnlockedCommand: with an exec wrapper that runs
// its command without taking the lock, the exec commands' check-ins must
// show the overlaps (the exec feature's checker works whatever shmlocks
// exec does).
func TestExecCheckerCatchesAnUnlockedCommand(t *testing.T) {
	cfg := chaosConfig(t, 2, 0, FeatureExec, FeaturePlain)
	cfg.Procs, cfg.Names, cfg.Steal = 2, 1, 0
	cfg.Exec = []string{os.Args[0], fakeExecArg}
	var stderr bytes.Buffer
	rep, err := Run(cfg, &stderr)
	require.NoError(t, err, stderr.String())
	require.Positive(t, rep.Features[FeatureExec].Grants, "commands ran: %s", stderr.String())
	require.Positive(t, rep.ViolationsByKind["exec"], "%v %q", rep.ViolationsByKind, rep.ViolationMessages)
	require.True(t, rep.TableKept)
	os.RemoveAll(rep.Table[:len(rep.Table)-len("/stress.tbl")])
}

// fakeExecArg makes the test binary a "shmlocks exec" that takes no lock:
// it runs what follows "--" and exits with its status.
const fakeExecArg = "-stress-fake-exec"

func fakeExec(args []string) int {
	for i, a := range args {
		if a != "--" {
			continue
		}
		cmd := exec.Command(args[i+1], args[i+2:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				return ee.ExitCode()
			}
			return 1
		}
		return 0
	}
	return 2
}
