//go:build unix

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// stressJSON runs stress --json with one backend and decodes its report.
func stressJSON(t *testing.T, env []string, args ...string) (result, map[string]any) {
	t.Helper()
	r, out := stressJSONRuns(t, env, args...)
	runs := out["runs"].([]any)
	require.Len(t, runs, 1)
	rep := runs[0].(map[string]any)
	require.Equal(t, rep["violations"], out["violations"], "the total of one run")
	requireOutcomesAddUp(t, rep)
	return r, rep
}

// stressJSONRuns runs stress --json and decodes the whole document: one
// shape whatever the number of backends.
func stressJSONRuns(t *testing.T, env []string, args ...string) (result, map[string]any) {
	t.Helper()
	r := shm(t, env, append([]string{"stress", "--json"}, args...)...)
	var out map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), "stdout %q stderr %q", r.stdout, r.stderr)
	require.ElementsMatch(t, []string{"violations", "runs"}, mapKeys(out))
	return r, out
}

// requireOutcomesAddUp: every request of a report has exactly one outcome.
func requireOutcomesAddUp(t *testing.T, rep map[string]any) {
	t.Helper()
	o := rep["outcomes"].(map[string]any)
	var sum float64
	for _, k := range []string{"granted", "stolen", "notAvailable", "timedOut", "errors"} {
		sum += o[k].(float64)
	}
	require.Len(t, o, 5)
	require.Equal(t, rep["ops"], sum, "the outcomes add up to the requests: %v", o)
	// Each grant is counted once: by mode, and by how it ended.
	g := rep["grants"].(float64)
	require.Equal(t, g, rep["exclusiveGrants"].(float64)+rep["sharedGrants"].(float64), "grants = exclusive + shared: %v", rep)
	require.Equal(t, g, o["granted"].(float64)+o["stolen"].(float64)+rep["releaseErrors"].(float64),
		"grants = granted + stolen + release errors: %v, %v", o, rep)
	require.LessOrEqual(t, rep["steals"].(float64), g, "steals are grants")
	require.LessOrEqual(t, rep["releaseErrors"].(float64), o["errors"].(float64))
}

// requireTextAddsUp checks the sums of stress's text report (one backend).
func requireTextAddsUp(t *testing.T, out string) {
	t.Helper()
	num := func(label string) int {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(label) + `\s+(\d+)\s*$`).FindStringSubmatch(out)
		require.NotNil(t, m, "a %q line in %s", label, out)
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		return n
	}
	sum := 0
	for _, l := range []string{"  granted and released", "  granted, then stolen", "  not available", "  timed out", "  errors"} {
		sum += num(l)
	}
	require.Equal(t, num("requests (by outcome below)"), sum, out)
	grants := num("grants (by mode below)")
	require.Equal(t, grants, num("  exclusive")+num("  shared"), out)
	require.Equal(t, grants, num("  granted and released")+num("  granted, then stolen")+num("    of them release errors"), out)
	require.LessOrEqual(t, num("of the grants, by stealing"), grants, out)
}

func mapKeys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func requirePercentiles(t *testing.T, rep map[string]any, key string) {
	t.Helper()
	p, ok := rep[key].(map[string]any)
	require.True(t, ok, "%s is an object: %v", key, rep[key])
	for _, k := range []string{"p50", "p90", "p99", "p999", "max"} {
		_, ok := p[k].(float64)
		require.True(t, ok, "%s.%s is a number: %v", key, k, p)
	}
}

func TestStressJSON(t *testing.T) {
	dur := "2s"
	if testing.Short() {
		dur = "1s"
	}
	r, rep := stressJSON(t, nil, "--duration", dur, "--procs", "3")
	require.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
	for _, k := range []string{"ops", "opsPerSec", "violations", "violationMessages", "kills", "acquireWaitUs", "handoffUs", "fairness", "seed"} {
		require.Contains(t, rep, k)
	}
	require.EqualValues(t, 0, rep["violations"])
	require.Empty(t, rep["violationMessages"])
	require.Greater(t, rep["ops"].(float64), 0.0)
	require.Greater(t, rep["opsPerSec"].(float64), 0.0)
	requirePercentiles(t, rep, "acquireWaitUs")
	requirePercentiles(t, rep, "handoffUs")
	fair := rep["fairness"].(map[string]any)
	require.Len(t, fair["perProcess"], 3)
	require.Greater(t, fair["min"].(float64), 0.0)
	// Per goroutine: --goroutines 2 (the default) in each of the 3 processes.
	gf := fair["goroutine"].(map[string]any)
	grants := gf["grants"].([]any)
	require.Len(t, grants, 3)
	var sum float64
	for _, gs := range grants {
		require.Len(t, gs, 2)
		for _, v := range gs.([]any) {
			sum += v.(float64)
		}
	}
	require.Equal(t, rep["grants"], sum, "every grant counted once, per goroutine")
	require.GreaterOrEqual(t, gf["max"].(float64), gf["min"].(float64))
	require.False(t, rep["tableKept"].(bool))
	_, err := os.Stat(rep["table"].(string))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestStressText(t *testing.T) {
	r := shm(t, nil, "stress", "--duration", "500ms", "--procs", "2", "--seed", "7")
	require.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
	require.Contains(t, r.stdout, "seed 7:")
	require.Contains(t, r.stdout, "requests/s")
	require.Contains(t, r.stdout, "acquire wait, exclusive")
	require.Contains(t, r.stdout, "handoff, all")
	require.Regexp(t, `fairness per goroutine \(grants\) max/min\s+\d+/\d+ = \d+\.\d\d\n`, r.stdout)
	require.NotContains(t, r.stderr, "\r", "no redrawn progress line when stderr is not a terminal")
	require.NotContains(t, r.stderr, "stress: shmlocks", "no progress line before --progress (5s)")
	// The outcome lines add up to the requests, the grants to their modes
	// and outcomes; the counters are explained.
	requireTextAddsUp(t, r.stdout)
	require.Contains(t, r.stdout, "Each request has one outcome")
	require.Contains(t, r.stdout, "processes killed (--chaos)")

	// The same sums under --chaos (kills between a worker's counters).
	r = shm(t, nil, "stress", "--duration", "1500ms", "--chaos", "20")
	require.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
	requireTextAddsUp(t, r.stdout)

	// Not on a terminal: a progress line every --progress.
	r = shm(t, nil, "stress", "--duration", "1s", "--procs", "2", "--progress", "200ms")
	require.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
	lines := regexp.MustCompile(`(?m)^stress: shmlocks \d+\.\ds/1s  requests \d+ \(\d+/s\)  kills 0  violations 0$`).FindAllString(r.stderr, -1)
	require.GreaterOrEqual(t, len(lines), 2, "progress lines: %q", r.stderr)
	require.NotContains(t, r.stderr, "\r")
}

// TestStressFairness: --fairness creates the run's table with it, and the
// report names it; a bad value is a usage error.
func TestStressFairness(t *testing.T) {
	r := shm(t, nil, "stress", "--duration", "300ms", "--procs", "2", "--goroutines", "3", "--names", "1", "--fairness", "bounded:1ms")
	require.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
	require.Contains(t, r.stdout, "shmlocks table bounded:1ms")
	require.Regexp(t, `violations\s+0\n`, r.stdout)
	r = shm(t, nil, "stress", "--duration", "300ms", "--fairness", "bounded:0s")
	require.NotEqual(t, exitOK, r.code)
	require.Contains(t, r.stderr, "--fairness")
}

// TestStressChaos: --chaos runs every feature by default (a process each:
// plain holders, shmlocks exec wrappers with running commands, child
// grants, Coalesce leaders, AcquireAll holders) and kills each in turn; the
// report counts kills per feature and violations per kind, and finds none.
func TestStressChaos(t *testing.T) {
	checkChaos(t, "3s", "20")
}

// TestStressChaosLong is the long form: 10 s, 2 processes per feature
// (SHMLOCKS_CHAOS_SECONDS runs it longer).
func TestStressChaosLong(t *testing.T) {
	if testing.Short() {
		t.Skip("long chaos run (skipped with -short)")
	}
	secs := 10
	if v, err := strconv.Atoi(os.Getenv("SHMLOCKS_CHAOS_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	checkChaos(t, fmt.Sprintf("%ds", secs), "20", "--procs", "10")
}

func checkChaos(t *testing.T, dur, rate string, more ...string) {
	t.Helper()
	r, rep := stressJSON(t, nil, append([]string{"--chaos", rate, "--duration", dur, "--kill-each"}, more...)...)
	feats, _ := rep["features"].(map[string]any)
	for _, f := range []string{"plain", "exec", "child", "coalesce", "all"} {
		fr, ok := feats[f].(map[string]any)
		require.True(t, ok, "feature %s in the report: %v", f, rep["features"])
		t.Logf("%s: %v", f, fr)
	}
	require.Equal(t, exitOK, r.code, "violations %v: %v\nstderr: %s", rep["violationsByKind"], rep["violationMessages"], r.stderr)
	require.EqualValues(t, 0, rep["violations"])
	for _, f := range []string{"plain", "exec", "child", "coalesce", "all"} {
		fr := feats[f].(map[string]any)
		require.Greater(t, fr["kills"].(float64), 0.0, "%s: killed in turn", f)
		require.Greater(t, fr["grants"].(float64), 0.0, f)
	}
	kinds := rep["violationsByKind"].(map[string]any)
	for _, k := range []string{"exclusion", "exec", "child", "flight", "counter", "token", "stuck", "table", "failure"} {
		require.Contains(t, kinds, k)
	}
	require.Greater(t, rep["kills"].(float64), 0.0)
}

// TestStressFeaturesFlag: --features picks the mix; an unknown feature, or
// more features than --procs, is a usage error.
func TestStressFeaturesFlag(t *testing.T) {
	r, rep := stressJSON(t, nil, "--features", "coalesce,all", "--duration", "500ms", "--procs", "2")
	require.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
	feats := rep["features"].(map[string]any)
	require.Len(t, feats, 2)
	require.Contains(t, feats, "coalesce")
	require.Contains(t, feats, "all")
	for _, args := range [][]string{
		{"--features", "mutex"},
		{"--features", "exec,child,all", "--procs", "2"},
		{"--features", "child", "--backend", "flock"},
	} {
		r := shm(t, nil, append([]string{"stress", "--duration", "100ms"}, args...)...)
		require.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
	}
}

func TestStressBreakExclusion(t *testing.T) {
	r, rep := stressJSON(t, []string{"SHMLOCKS_FAULT=break-exclusion"}, "--duration", "1s")
	require.Equal(t, exitFailure, r.code)
	require.Greater(t, rep["violations"].(float64), 0.0)
	require.NotEmpty(t, rep["violationMessages"])
	require.True(t, rep["tableKept"].(bool))
	tbl := rep["table"].(string)
	require.FileExists(t, tbl)
	require.Contains(t, r.stderr, tbl, "the kept table's path is printed")
	os.RemoveAll(filepath.Dir(tbl))
}

func TestStressFlock(t *testing.T) {
	r, rep := stressJSON(t, nil, "--backend", "flock", "--duration", "1s", "--procs", "3")
	require.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
	require.Equal(t, "flock", rep["backend"])
	require.EqualValues(t, 0, rep["violations"])
	require.Greater(t, rep["ops"].(float64), 0.0)
}

func TestStressBothBackendsWithTable(t *testing.T) {
	if testing.Short() {
		t.Skip("two runs")
	}
	r := shm(t, nil, "stress", "--backend", "shmlocks,flock", "--duration", "500ms", "--ops", "0")
	require.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
	require.Regexp(t, `\s+shmlocks\s+flock\n`, r.stdout)

	// --json: the same shape as with one backend, one report per run.
	r, out := stressJSONRuns(t, nil, "--backend", "shmlocks,flock", "--duration", "300ms")
	require.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
	runs := out["runs"].([]any)
	require.Len(t, runs, 2)
	for i, b := range []string{"shmlocks", "flock"} {
		rep := runs[i].(map[string]any)
		require.Equal(t, b, rep["backend"])
		requireOutcomesAddUp(t, rep)
	}
	require.EqualValues(t, 0, out["violations"])

	// --table: the given file is used and kept; its check file is removed.
	tbl := filepath.Join(t.TempDir(), "mine.tbl")
	r = shm(t, nil, "stress", "--table", tbl, "--ops", "50", "--procs", "2")
	require.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
	require.FileExists(t, tbl)
	require.NoFileExists(t, tbl+".check")
	r = shm(t, nil, "dump", "--check", "--table", tbl)
	require.Equal(t, exitOK, r.code, r.stderr)
}
