//go:build linux

package main

import (
	"os/exec"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStressChaosNamespaces: the chaos run with every other worker in PID,
// network and mount namespaces of its own (containers sharing the table),
// every feature, SIGKILLs: no violation. Skipped where this process may
// not create namespaces (not root).
func TestStressChaosNamespaces(t *testing.T) {
	probe := exec.Command("/bin/true")
	probe.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNET | syscall.CLONE_NEWNS}
	if err := probe.Run(); err != nil {
		t.Skipf("cannot create namespaces here (%v): run as root to test containers", err)
	}
	r, rep := stressJSON(t, nil, "--namespaces", "--chaos", "20", "--duration", "4s")
	require.Equal(t, exitOK, r.code, "violations %v: %v\nstderr: %s", rep["violationsByKind"], rep["violationMessages"], r.stderr)
	require.EqualValues(t, 0, rep["violations"])
	require.Greater(t, rep["kills"].(float64), 0.0)
	feats, _ := rep["features"].(map[string]any)
	for f, v := range feats {
		t.Logf("%s: %v", f, v)
	}
}
