//go:build unix

package main

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFlockHabits: exec takes flock's long options by any unambiguous
// prefix (--verb, --excl), answers flock's fd form (exec -n 9) with what to
// do instead, and the small messages are plain.
func TestFlockHabits(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "h.tbl")
	r := shm(t, nil, "exec", "--verb", "--excl", "--tab", tbl, "job", "true")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, `getting lock "job" took`, "--verb is --verbose")

	r = shm(t, nil, "exec", "--n", "--table", tbl, "job", "true")
	require.Equal(t, exitUsage, r.code, r.stderr)
	require.Contains(t, r.stderr, "option --n is ambiguous")

	for _, args := range [][]string{{"exec", "-n", "9"}, {"exec", "9"}, {"exec", "-w", "3", "200"}} {
		r = shm(t, nil, args...)
		require.Equal(t, exitUsage, r.code, "%q: %s", args, r.stderr)
		require.Contains(t, r.stderr, "not supported: use exec NAME COMMAND", "%q", args)
	}
	var o execOptions
	require.True(t, errors.Is(parseExecArgs([]string{"-n", "9"}, &o), ErrFDForm))

	// Long-option prefixes on every command; durations in seconds too.
	r = shm(t, nil, "dump", "--tab", tbl, "--js")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `"held"`)
	r = shm(t, nil, "dump", "--watch", "--interval", "1ns", "--table", tbl)
	require.Equal(t, exitUsage, r.code, r.stderr)
	require.Contains(t, r.stderr, "below the minimum")
	r = shm(t, nil, "dump", "--interval", "x")
	require.Equal(t, exitUsage, r.code, r.stderr)
	require.Contains(t, r.stderr, "not a number of seconds")
	require.NotContains(t, r.stderr, "parse error")
	r = shm(t, nil, "stress", "--duration", "0")
	require.Equal(t, exitUsage, r.code, r.stderr)
	require.Contains(t, r.stderr, "--duration must be more than 0")

	// --table before the command.
	r = shm(t, nil, "--table", tbl, "dump", "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, tbl)
	r = shm(t, nil, "-t", tbl, "path")
	require.Equal(t, exitUsage, r.code, r.stderr)
}
