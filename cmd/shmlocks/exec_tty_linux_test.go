package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// ptyPair opens a pseudo-terminal: the master (the emulator's side) and the
// slave (the programs' terminal).
func ptyPair(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	unlock := 0
	_, _, e := unix.Syscall(unix.SYS_IOCTL, m.Fd(), unix.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock)))
	require.Zero(t, e, "unlockpt")
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	require.NoError(t, err)
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return m, s
}

// procState returns the state letter of pid ('T' stopped), 0 if gone.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// On a terminal the command is the foreground job, as under flock: it
// reads the terminal, Ctrl-Z stops it and the wrapper with it (so the shell
// sees the job stopped), SIGCONT resumes both, Ctrl-C ends it.
//
//	P: start `shmlocks exec` as the session leader of a pty (its foreground job).
//	C: prints its pid, reads a line.      P: types "hello".   C: "got hello".
//	P: types Ctrl-Z.  C and the wrapper: stopped.   P: SIGCONT to the wrapper.
//	C: running again, in the foreground: reads "again".  P: types Ctrl-C.  wrapper: exits 130.
func TestExecTerminalForeground(t *testing.T) {
	master, slave := ptyPair(t)
	tbl := filepath.Join(t.TempDir(), "exec.tbl")
	cmd := exec.Command(binary, "exec", "-t", tbl, "job", "sh", "-c",
		`echo "pid $$"; read a; echo "got $a"; read b; echo "got $b"; exec sleep 60`)
	cmd.Env = cleanEnv()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	require.NoError(t, cmd.Start())
	slave.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var mu sync.Mutex
	var out bytes.Buffer
	go func() {
		buf := make([]byte, 1024)
		for {
			n, err := master.Read(buf)
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	output := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
	t.Cleanup(func() {
		cmd.Process.Kill()
		select {
		case <-done:
		default:
		}
	})
	waitFor(t, func() bool { return strings.Contains(output(), "pid ") }, "the command to start")
	f := strings.Fields(output()[strings.Index(output(), "pid "):])
	pid, err := strconv.Atoi(strings.TrimSpace(f[1]))
	require.NoError(t, err, output())
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
	fg, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPGRP)
	require.NoError(t, err)
	require.Equal(t, pid, fg, "the command's group is the terminal's foreground job")

	_, err = master.Write([]byte("hello\n"))
	require.NoError(t, err)
	waitFor(t, func() bool { return strings.Contains(output(), "got hello") }, "the command to read the terminal")

	_, err = master.Write([]byte{0x1a}) // Ctrl-Z
	require.NoError(t, err)
	waitFor(t, func() bool { return procState(pid) == 'T' }, "the command to stop")
	waitFor(t, func() bool { return procState(cmd.Process.Pid) == 'T' }, "the wrapper to stop with it")
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	waitFor(t, func() bool { s := procState(pid); return s != 'T' && s != 0 }, "the command to resume")
	_, err = master.Write([]byte("again\n"))
	require.NoError(t, err)
	waitFor(t, func() bool { return strings.Contains(output(), "got again") }, "the command to read the terminal again")

	_, err = master.Write([]byte{0x03}) // Ctrl-C
	require.NoError(t, err)
	var werr error
	waitFor(t, func() bool {
		select {
		case werr = <-done:
			return true
		default:
			return false
		}
	}, "the wrapper to exit after Ctrl-C")
	var ee *exec.ExitError
	require.ErrorAs(t, werr, &ee)
	require.Equal(t, 128+int(syscall.SIGINT), ee.ExitCode(), output())
}
