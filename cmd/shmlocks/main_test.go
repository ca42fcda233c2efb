package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/manager"
)

// binary is the shmlocks command built once for the tests (with the race
// detector and the build tags of the test binary itself).
var binary string

// buildFlags are added by the files built with the race detector or the
// polling tag.
var buildFlags []string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shmlocks-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "shmlocks")
	if runtime.GOOS == "windows" {
		binary += ".exe"
	}
	args := append([]string{"build", "-o", binary}, buildFlags...)
	out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result of one run of the binary.
type result struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

// shm runs the binary with args (bounded by a minute) and extra environment.
func shm(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(cleanEnv(), env...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: so.String(), stderr: se.String(), took: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("run %v: %v", args, err)
	}
	require.NoError(t, ctx.Err(), "shmlocks %v did not finish within a minute", args)
	return r
}

// cleanEnv is the environment without the variables that select a table
// or a fault, so a developer's settings cannot leak into the tests.
//
// A binary built with the race detector sleeps a second at exit
// (GORACE atexit_sleep_ms); the tests do not need that.
func cleanEnv() []string {
	var env []string
	gorace := "atexit_sleep_ms=0"
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, envTable+"=") || strings.HasPrefix(kv, "SHMLOCKS_FAULT=") ||
			strings.HasPrefix(kv, "SHMLOCKS_STRESS_WORKER=") {
			continue
		}
		if v, ok := strings.CutPrefix(kv, "GORACE="); ok {
			gorace = v + " " + gorace
			continue
		}
		env = append(env, kv)
	}
	return append(env, "GORACE="+gorace)
}

func TestHelp(t *testing.T) {
	for _, c := range []string{"dump", "exec", "stress", "demo"} {
		r := shm(t, nil, c, "--help")
		require.Equal(t, exitOK, r.code, "%s --help: %s", c, r.stderr)
		require.Contains(t, r.stdout, "usage: shmlocks "+c)
		require.Contains(t, r.stdout, "examples:")
		if c != "demo" {
			require.Contains(t, r.stdout, "SHMLOCKS_TABLE", "%s --help documents the table location", c)
			require.Contains(t, r.stdout, manager.DefaultPath())
		}
	}
	r := shm(t, nil, "--help")
	require.Equal(t, exitOK, r.code)
	for _, c := range []string{"dump", "exec", "stress", "demo"} {
		require.Contains(t, r.stdout, c)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"dump", "--bogus"},
		{"dump", "extra"},
		{"dump", "--check", "--json"},
		{"dump", "--watch", "--interval", "0s"},
		{"exec"},
		{"exec", "name"},
		{"exec", "name", "--"},
		{"exec", "name", "--shared", "--", "true"},
		{"exec", "--steal", "--shared", "name", "--", "true"},
		{"exec", "--conflict-exit-code", "300", "name", "--", "true"},
		{"exec", "-dash", "--", "true"},
		{"exec", "-w", "soon", "name", "true"},
		{"exec", "-w", "-1", "name", "true"},
		{"exec", "-E", "256", "name", "true"},
		{"exec", "-u", "name"},
		{"exec", "-F", "name", "true"},
		{"exec", "name", "-c"},
		{"exec", "name", "-c", "true", "extra"},
		{"exec", "-c", "true", "name", "false"},
		{"exec", "--shared=yes", "name", "true"},
		{"exec", "--bogus", "name", "true"},
		{"exec", "-q", "name", "true"},
		{"exec", "-w"},
		{"stress", "--procs", "0"},
		{"stress", "--shared", "2"},
		{"stress", "--hold", "sometimes"},
		{"stress", "--backend", "mutex"},
		{"stress", "extra"},
		{"stress", "--progress", "-1s"},
		{"demo", "--procs", "0"},
	} {
		r := shm(t, nil, args...)
		require.Equal(t, exitUsage, r.code, "shmlocks %q: stdout %q stderr %q", args, r.stdout, r.stderr)
		require.NotEmpty(t, r.stderr, "shmlocks %q explains the usage error", args)
	}
}

// The default table depends on the user only: the same path with or
// without XDG_RUNTIME_DIR, TMPDIR, HOME or SUDO_USER; $SHMLOCKS_TABLE is an
// explicit choice, like --table.
func TestDefaultTablePath(t *testing.T) {
	t.Setenv(envTable, "")
	want := manager.DefaultPath()
	require.Contains(t, want, strconv.Itoa(os.Getuid()))
	for _, env := range [][2]string{
		{"XDG_RUNTIME_DIR", "/run/user/42"}, {"XDG_RUNTIME_DIR", ""}, {"TMPDIR", "/var/tmp/x"},
		{"HOME", "/nonexistent"}, {"SUDO_USER", "someone"}, {"LOGNAME", "other"},
	} {
		t.Setenv(env[0], env[1])
		require.Equal(t, want, defaultTablePath(), "with %s=%q", env[0], env[1])
	}
	t.Setenv(envTable, "/x/explicit.tbl")
	require.Equal(t, "/x/explicit.tbl", defaultTablePath())

	// The binary prints it, whatever the environment.
	r := shm(t, nil, "path")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Equal(t, want+"\n", r.stdout)
	r = shm(t, []string{"XDG_RUNTIME_DIR=/run/user/42", "TMPDIR=/var/tmp"}, "path")
	require.Equal(t, want+"\n", r.stdout)
	r = shm(t, []string{envTable + "=/x/explicit.tbl"}, "path")
	require.Equal(t, "/x/explicit.tbl\n", r.stdout)
}

// TestDumpDefaultLocation: without --table, dump looks where the help says.
func TestDumpDefaultLocation(t *testing.T) {
	p := filepath.Join(t.TempDir(), "via-env.tbl")
	r := shm(t, []string{envTable + "=" + p}, "dump")
	require.Equal(t, exitNoTable, r.code)
	require.Contains(t, r.stderr, p)
	require.Contains(t, r.stderr, "no table")
}
