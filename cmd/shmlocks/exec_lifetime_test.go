//go:build unix

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

	"github.com/shmlocks/shmlocks/internal/proctest"
	"github.com/shmlocks/shmlocks/manager"
)

// The lock of shmlocks exec lives exactly as long as the command and the
// processes of its group, whatever kills the wrapper. Each test runs the
// built binary; the commands print their pids, and every process a test
// starts is killed at its end.

// quietPeriod is how long a request must stay ungranted to count as
// refused while the command runs; within is the bound for a grant once
// the command's group is gone (a bound for a hang, not a speed claim).
const (
	quietPeriod = 300 * time.Millisecond
	within      = 10 * time.Second
)

// startExecProc starts `shmlocks exec ARGS`: its stdout read line by line
// (the command's too, even after the wrapper died: the pipe is the
// command's), its stderr in a file (a pipe would keep Wait waiting for the
// command), its stdin /dev/null; every wait bounded by within.
func startExecProc(t *testing.T, args ...string) *proctest.Child {
	t.Helper()
	null, err := os.Open(os.DevNull)
	require.NoError(t, err)
	t.Cleanup(func() { null.Close() })
	cmd := exec.Command(binary, append([]string{"exec"}, args...)...)
	cmd.Env = cleanEnv()
	cmd.Stdin = null
	return proctest.Start(t, cmd, proctest.Options{CaptureStderr: true, Within: within})
}

// exitCode waits (bounded) for the wrapper to exit and returns its status
// (128+N for a death by signal N).
func exitCode(p *proctest.Child) int {
	return proctest.ExitCode(p.Wait())
}

// commandPID reads the pid the command printed first, checks that it leads
// its own process group, and kills that group when the test ends.
func commandPID(t *testing.T, p *proctest.Child) int {
	t.Helper()
	pid, err := strconv.Atoi(p.Next())
	require.NoError(t, err)
	pg, err := syscall.Getpgid(pid)
	require.NoError(t, err)
	require.Equal(t, pid, pg, "the command leads a process group of its own")
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
	return pid
}

// killWait SIGKILLs pid and waits (bounded) until it is no longer running
// (an orphan is reaped by init: a zombie counts as gone).
func killWait(t *testing.T, pid int) {
	t.Helper()
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	waitFor(t, func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return true
		}
		i := strings.LastIndexByte(string(b), ')')
		return i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
	}, "process "+strconv.Itoa(pid)+" to die")
}

// busy asserts that `exec -n NAME` is refused, silently, without running.
func busy(t *testing.T, tbl, name string) {
	t.Helper()
	r := shm(t, nil, "exec", "-t", tbl, "-n", name, "echo", "ran")
	require.Equal(t, exitFailure, r.code, "exec -n %s: %s", name, r.stderr)
	require.Empty(t, r.stdout, "the second command must not run")
	require.Empty(t, r.stderr, "-n is silent on a busy name")
}

// waiter queues `exec NAME echo granted` and checks that it waits.
func waiter(t *testing.T, m *manager.Manager, tbl, name string) *proctest.Child {
	t.Helper()
	w := startExecProc(t, "-t", tbl, name, "echo", "granted")
	waitFor(t, func() bool {
		q, err := m.Query(ctxFor(t, within))
		if err != nil {
			return false
		}
		for _, li := range q.Pending {
			if li.PID == w.Pid {
				return true
			}
		}
		return false
	}, "the waiter to queue")
	w.Quiet("", quietPeriod)
	return w
}

// granted asserts that the waiter gets the lock within the bound, once the
// last process of the holder's group is gone, and logs how long it took.
func granted(t *testing.T, w *proctest.Child, since time.Time) {
	t.Helper()
	require.Equal(t, "granted", w.Next())
	t.Logf("granted %v after the last process of the group died", time.Since(since).Round(time.Millisecond))
	require.Equal(t, 0, exitCode(w), w.Stderr())
}

// P: exec A holds "job", its command C prints its pid and sleeps.
// P: SIGKILL A (C runs on, reparented).
// P: exec -n job is refused; waiter W queues and stays queued.
// P: SIGKILL C.  W: granted.
func TestExecWrapperKilledCommandKeepsLock(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	m := openManager(t, tbl)
	a := startExecProc(t, "-t", tbl, "job", "sh", "-c", "echo $$; exec sleep 60")
	c := commandPID(t, a)
	require.NoError(t, a.Cmd.Process.Kill())
	require.Equal(t, 128+int(syscall.SIGKILL), exitCode(a))

	busy(t, tbl, "job")
	q, err := m.Query(ctxFor(t, within))
	require.NoError(t, err)
	require.Len(t, q.Held, 1)
	require.Equal(t, a.Pid, q.Held[0].PID, "still held by the dead wrapper's agent")
	w := waiter(t, m, tbl, "job")
	busy(t, tbl, "job")

	killWait(t, c)
	granted(t, w, time.Now())
}

// The command dies with the wrapper alive: the wrapper exits with 128+9 and
// the name is free at once.
func TestExecCommandKilled(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	m := openManager(t, tbl)
	a := startExecProc(t, "-t", tbl, "job", "sh", "-c", "echo $$; exec sleep 60")
	c := commandPID(t, a)
	w := waiter(t, m, tbl, "job")
	killWait(t, c)
	require.Equal(t, 128+int(syscall.SIGKILL), exitCode(a), a.Stderr())
	granted(t, w, time.Now())
	r := shm(t, nil, "exec", "-t", tbl, "-n", "job", "echo", "free")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "free\n", r.stdout)
}

// Both die, the wrapper first: the name is free once they are gone.
func TestExecWrapperAndCommandKilled(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	m := openManager(t, tbl)
	a := startExecProc(t, "-t", tbl, "job", "sh", "-c", "echo $$; exec sleep 60")
	c := commandPID(t, a)
	w := waiter(t, m, tbl, "job")
	require.NoError(t, a.Cmd.Process.Kill())
	killWait(t, c)
	since := time.Now()
	require.Equal(t, 128+int(syscall.SIGKILL), exitCode(a))
	granted(t, w, since)
}

// The command exits and leaves a child in its group: the wrapper exits
// with the command's status, the child keeps the lock until it dies; the
// wrapper then killed changes nothing. With -o the lock goes with the
// command.
func TestExecGroupMemberKeepsLock(t *testing.T) {
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	m := openManager(t, tbl)
	a := startExecProc(t, "-t", tbl, "job", "sh", "-c", "sleep 60 & echo $!; exit 3")
	member, err := strconv.Atoi(a.Next())
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Kill(member, syscall.SIGKILL) })
	require.Equal(t, 3, exitCode(a), "the wrapper exits with the command's status")
	busy(t, tbl, "job")
	w := waiter(t, m, tbl, "job")
	killWait(t, member)
	granted(t, w, time.Now())

	// -o: released when the command exits.
	o := startExecProc(t, "-t", tbl, "-o", "job", "sh", "-c", "sleep 60 & echo $!")
	member, err = strconv.Atoi(o.Next())
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Kill(member, syscall.SIGKILL) })
	require.Equal(t, 0, exitCode(o))
	r := shm(t, nil, "exec", "-t", tbl, "-n", "job", "echo", "free")
	require.Equal(t, 0, r.code, r.stderr)
}

// What is not guaranteed: a process that leaves the group (setsid) and
// closes the keep-alive descriptor (fd 3) does not keep the lock. (One
// that keeps the descriptor does, as with flock(1):
// TestExecKeepAliveDescriptorKeepsLock.)
func TestExecProcessLeavingGroupDoesNotKeepLock(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid(1)")
	}
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	a := startExecProc(t, "-t", tbl, "job", "sh", "-c", "setsid sh -c 'exec 3>&-; exec sleep 60' & echo $!")
	gone, err := strconv.Atoi(a.Next())
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Kill(gone, syscall.SIGKILL) })
	require.Equal(t, 0, exitCode(a))
	// Free while that process runs (the wrapper, or the table's reapers
	// once fd 3 is closed, free it: waited for, within 10 s).
	r := shm(t, nil, "exec", "-t", tbl, "-w", "10", "job", "echo", "free")
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, syscall.Kill(gone, 0), "the process that left still runs")
}

// The command's process waits for the go-ahead: if the wrapper dies before
// the command's group co-owns the lock (the pipe ends without a byte), the
// command never runs.
func TestExecChildWithoutGoAheadRunsNothing(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	touch, err := exec.LookPath("touch")
	require.NoError(t, err)
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	cmd := exec.Command(binary, execChildArg, touch, "touch", marker)
	cmd.ExtraFiles = []*os.File{pr}
	require.NoError(t, cmd.Start())
	pr.Close()
	pw.Close() // the wrapper "died": EOF
	err = cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, exitFailure, ee.ExitCode())
	require.NoFileExists(t, marker, "the command must not run without the lock")

	// With the byte it runs.
	pr, pw, err = os.Pipe()
	require.NoError(t, err)
	cmd = exec.Command(binary, execChildArg, touch, "touch", marker)
	cmd.ExtraFiles = []*os.File{pr}
	require.NoError(t, cmd.Start())
	pr.Close()
	_, err = pw.Write([]byte{1})
	require.NoError(t, err)
	pw.Close()
	require.NoError(t, cmd.Wait())
	require.FileExists(t, marker)
}

// The command's keep-alive descriptor (fd 3) keeps the lock, like the
// descriptor flock(1) hands its command: a process that left the group
// but kept it keeps the lock after the wrapper and the command are gone,
// until it exits.
func TestExecKeepAliveDescriptorKeepsLock(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid(1)")
	}
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	a := startExecProc(t, "-t", tbl, "job", "sh", "-c", "setsid sleep 60 & echo $!")
	kept, err := strconv.Atoi(a.Next())
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Kill(kept, syscall.SIGKILL) })
	require.Equal(t, 0, exitCode(a))
	r := shm(t, nil, "exec", "-t", tbl, "-n", "job", "echo", "free")
	require.Equal(t, 1, r.code, "the process holding fd 3 keeps the lock: %s", r.stdout)
	require.NoError(t, syscall.Kill(kept, syscall.SIGKILL))
	deadline := time.Now().Add(10 * time.Second)
	for {
		r = shm(t, nil, "exec", "-t", tbl, "-w", "5", "job", "echo", "free")
		if r.code == 0 || time.Now().After(deadline) {
			break
		}
	}
	require.Equal(t, 0, r.code, r.stderr)
}
