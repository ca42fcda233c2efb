//go:build unix

package stress

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMain doubles as the worker: Run re-executes this test binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == fakeExecArg {
		os.Exit(fakeExec(os.Args[2:]))
	}
	if IsWorker() {
		os.Exit(WorkerMain(os.Stdout, os.Stderr))
	}
	// Workers built with the race detector would sleep a second at exit.
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	os.Exit(m.Run())
}

func runConfig(t *testing.T, backend string) Config {
	hold, err := ParseHold("exp:20us")
	require.NoError(t, err)
	return Config{
		Backend: backend, Procs: 2, Goroutines: 2, Names: 2, Duration: 400 * time.Millisecond,
		Shared: 0.3, IfAvailable: 0.1, Steal: 0.05, Timeout: 0.1, Hold: hold, Seed: 42,
		Worker: []string{os.Args[0]},
	}
}

// TestRunShmlocks: a short run under kills, with the workers' Managers
// opened with the defaults and with HandOver (a release yields the P to
// the sibling it granted), and on a table of bounded fairness: no
// violation, and the report says which.
func TestRunShmlocks(t *testing.T) {
	for _, handOver := range []bool{false, true} {
		t.Run(fmt.Sprintf("handover=%v", handOver), func(t *testing.T) { runShmlocks(t, handOver, "") })
	}
	t.Run("bounded", func(t *testing.T) { runShmlocks(t, false, "bounded:1ms") })
}

func runShmlocks(t *testing.T, handOver bool, fairness string) {
	var stderr bytes.Buffer
	cfg := runConfig(t, BackendShmlocks)
	cfg.Chaos, cfg.HandOver, cfg.Fairness = 10, handOver, fairness
	if handOver || fairness != "" {
		cfg.Goroutines = 6
	}
	rep, err := Run(cfg, &stderr)
	require.NoError(t, err, stderr.String())
	require.Zero(t, rep.Violations, "%v\n%s", rep.ViolationMessages, stderr.String())
	require.Equal(t, handOver, rep.HandOver)
	if fairness == "" {
		fairness = "fifo"
	}
	require.Equal(t, fairness, rep.TableFairness)
	require.Positive(t, rep.Ops)
	require.Positive(t, rep.Outcomes.Granted)
	require.Positive(t, rep.Kills)
	// Per-goroutine grants: one count per position and goroutine; a worker
	// killed between its two counters may leave the sum short by one per kill.
	var sum int64
	require.Len(t, rep.Fairness.Goroutine.Grants, cfg.Procs)
	for _, gs := range rep.Fairness.Goroutine.Grants {
		require.Len(t, gs, cfg.Goroutines)
		for _, v := range gs {
			sum += v
		}
	}
	require.LessOrEqual(t, sum, rep.Grants)
	require.GreaterOrEqual(t, sum, rep.Grants-int64(rep.Kills))
	requireSums(t, rep)
	require.False(t, rep.TableKept)
	_, err = os.Stat(rep.Table)
	require.ErrorIs(t, err, os.ErrNotExist, "the temporary table is removed")
}

func TestRunFlockOps(t *testing.T) {
	var stderr bytes.Buffer
	cfg := runConfig(t, BackendFlock)
	cfg.Duration, cfg.Ops = 0, 200
	rep, err := Run(cfg, &stderr)
	require.NoError(t, err, stderr.String())
	require.Zero(t, rep.Violations, "%v\n%s", rep.ViolationMessages, stderr.String())
	require.EqualValues(t, 2*2*200, rep.Ops)
	require.Equal(t, []int64{400, 400}, rep.Fairness.PerProcess)
}

func TestRunBrokenExclusionIsCaught(t *testing.T) {
	t.Setenv(FaultEnv, "break-exclusion")
	var stderr bytes.Buffer
	cfg := runConfig(t, BackendShmlocks)
	cfg.Steal = 0
	rep, err := Run(cfg, &stderr)
	require.NoError(t, err, stderr.String())
	require.Positive(t, rep.Violations)
	require.True(t, rep.TableKept)
	require.FileExists(t, rep.Table)
	os.RemoveAll(filepath.Dir(rep.Table))
}

// TestRunGoroutineFairness: with every request a waiting one (no
// IfAvailable, deadline or steal) and --ops, every goroutine of every process
// is granted exactly its ops, and the report says so per goroutine, on both
// backends.
func TestRunGoroutineFairness(t *testing.T) {
	for _, backend := range []string{BackendShmlocks, BackendFlock} {
		t.Run(backend, func(t *testing.T) {
			var stderr bytes.Buffer
			cfg := runConfig(t, backend)
			cfg.Procs, cfg.Goroutines, cfg.Names = 2, 3, 1
			cfg.Duration, cfg.Ops = 0, 150
			cfg.IfAvailable, cfg.Timeout, cfg.Steal = 0, 0, 0
			rep, err := Run(cfg, &stderr)
			require.NoError(t, err, stderr.String())
			require.Zero(t, rep.Violations, "%v\n%s", rep.ViolationMessages, stderr.String())
			require.EqualValues(t, 2*3*150, rep.Outcomes.Granted)
			g := rep.Fairness.Goroutine
			require.Equal(t, [][]int64{{150, 150, 150}, {150, 150, 150}}, g.Grants)
			require.EqualValues(t, 150, g.Max)
			require.EqualValues(t, 150, g.Min)
			require.Equal(t, 1.0, g.Ratio)
		})
	}
}

func TestGoroutineFairnessSummary(t *testing.T) {
	f := newGoroutineFairness([][]int64{{10, 30}, {20, 15}})
	require.EqualValues(t, 30, f.Max)
	require.EqualValues(t, 10, f.Min)
	require.Equal(t, 3.0, f.Ratio)
	f = newGoroutineFairness([][]int64{{7, 0}})
	require.EqualValues(t, 7, f.Max)
	require.EqualValues(t, 0, f.Min)
	require.Zero(t, f.Ratio, "a starved goroutine: no finite ratio")
	f = newGoroutineFairness([][]int64{{3, 4}, {2}})
	require.Equal(t, 2.0, f.Ratio)
}

// requireSums checks the sums the report promises (Outcomes): one outcome
// per request, one count per grant, by mode and by how it ended.
func requireSums(t *testing.T, rep *Report) {
	t.Helper()
	o := rep.Outcomes
	require.Equal(t, rep.Ops, o.Granted+o.Stolen+o.NotAvailable+o.TimedOut+o.Errors, "one outcome per request: %+v", o)
	require.Equal(t, rep.Grants, rep.ExclusiveGrants+rep.SharedGrants, "grants by mode")
	require.Equal(t, rep.Grants, o.Granted+o.Stolen+rep.ReleaseErrors, "grants by how they ended: %+v", o)
	require.GreaterOrEqual(t, o.Granted, int64(0))
	require.LessOrEqual(t, rep.Steals, rep.Grants)
	require.LessOrEqual(t, rep.ReleaseErrors, o.Errors)
}
