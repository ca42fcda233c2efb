//go:build linux

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// childrenOf lists the children of pid as this process's /proc shows them.
func childrenOf(pid int) []int {
	var out []int
	tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	for _, tk := range tasks {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + tk.Name() + "/children")
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// exec keeps its promise across PID namespaces: a wrapper and its command
// in a container of their own (a PID namespace whose init is a shell), the
// waiters on the host. The wrapper SIGKILLed, the command holds the lock (its
// keep-alive descriptor: the host cannot see its group); the command
// SIGKILLed, the waiter is granted.
//
// P: in a new PID namespace, init sh runs exec A on "job"; A's command C sleeps.
// P: SIGKILL A.   P: exec -n job is refused; waiter W queues.
// P: SIGKILL C.   W: granted.
func TestExecAcrossPIDNamespaces(t *testing.T) {
	probe := exec.Command("/bin/true")
	probe.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := probe.Run(); err != nil {
		t.Skipf("cannot create PID namespaces here (%v): run as root to test containers", err)
	}
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	m := openManager(t, tbl)
	init := exec.Command("sh", "-c", binary+" exec -t "+tbl+" job sleep 60 & exec sleep 600") // the namespace lives while its init does
	init.Env = cleanEnv()
	init.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	require.NoError(t, init.Start())
	t.Cleanup(func() { init.Process.Kill(); init.Wait() }) // the namespace's init: its death ends every process in it
	var wrapper, command int
	waitFor(t, func() bool {
		q, err := m.Query(ctxFor(t, within))
		if err != nil || len(q.Held) != 1 {
			return false
		}
		for _, w := range childrenOf(init.Process.Pid) {
			for _, c := range childrenOf(w) {
				if comm, _ := os.ReadFile("/proc/" + strconv.Itoa(c) + "/comm"); strings.TrimSpace(string(comm)) == "sleep" {
					wrapper, command = w, c // the command runs: past the go-ahead
				}
			}
		}
		return command != 0
	}, "the wrapper in its namespace to hold job and start its command")
	require.NoError(t, syscall.Kill(wrapper, syscall.SIGKILL))
	waitFor(t, func() bool { return syscall.Kill(wrapper, 0) != nil || zombie(wrapper) }, "the wrapper to die")
	require.NoError(t, syscall.Kill(command, 0), "the command runs on")

	busy(t, tbl, "job")
	w := waiter(t, m, tbl, "job")
	busy(t, tbl, "job")
	killWait(t, command)
	granted(t, w, time.Now())
}

func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}
