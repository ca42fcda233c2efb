//go:build unix

package stress

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMain doubles as the worker: Run re-executes this test binary.
func TestMain(m *testing.M) {
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

func TestRunShmlocks(t *testing.T) {
	var stderr bytes.Buffer
	cfg := runConfig(t, BackendShmlocks)
	cfg.Chaos = 10
	rep, err := Run(cfg, &stderr)
	require.NoError(t, err, stderr.String())
	require.Zero(t, rep.Violations, "%v\n%s", rep.ViolationMessages, stderr.String())
	require.Positive(t, rep.Ops)
	require.Positive(t, rep.Outcomes.Granted)
	require.Positive(t, rep.Kills)
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
