package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair of cols x rows: the master (what a
// terminal emulator reads) and the slave (the program's terminal).
func openPTY(t *testing.T, cols, rows int) (master, slave *os.File) {
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
	require.NoError(t, err, "ptsname")
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	require.NoError(t, unix.IoctlSetWinsize(int(s.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: uint16(cols), Row: uint16(rows)}))
	return m, s
}

// syncBuffer collects what the master reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// On a terminal, dump --watch is the full-screen live view: on the
// alternate screen, redrawn in place, the name with a waiter first, its
// holder's token and pid, its queue; Ctrl-C restores the screen and exits 0.
func TestDumpWatchTerminal(t *testing.T) {
	path, _, _ := liveTable(t)
	master, slave := openPTY(t, 100, 30)
	ctx := ctxFor(t, time.Minute)
	cmd := exec.CommandContext(ctx, binary, "dump", "--watch", "--interval", "30ms", "--table", path)
	cmd.Env = cleanEnv()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	require.NoError(t, cmd.Start())
	slave.Close() // the child has it now: the master reads EOF/EIO when it exits
	var out syncBuffer
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			out.mu.Lock()
			out.b.Write(buf[:n])
			out.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	waitFor(t, func() bool { return strings.Count(out.String(), escHome) >= 3 }, "three frames")
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, cmd.Wait(), "Ctrl-C ends the live view with status 0")
	master.SetReadDeadline(time.Now().Add(10 * time.Second))
	<-readDone

	s := out.String()
	require.True(t, strings.HasPrefix(s, escAltScreen), "starts on the alternate screen: %q", s[:min(len(s), 40)])
	require.True(t, strings.HasSuffix(s, escMainScr), "ends back on the main screen")
	frames := strings.Split(s, escHome)
	last := frames[len(frames)-2] // a complete frame
	require.Contains(t, last, "shmlocks dump --watch  "+path)
	require.Regexp(t, `names 2/\d+  requests 3/\d+ \(held 2, waiting 1\)  longest wait \S+`, last)
	require.Regexp(t, `agents 2/\d+ \(0 dead\)  reaps \d+ \([0-9.]+/s\)  repairs \d+`, last)
	// The terminal adds a \r before each \n (onlcr); the view clears each line's end.
	last = strings.NewReplacer("\r", "", escClearEOL, "", escClearEOS, "").Replace(last)
	lines := strings.Split(last, "\n")
	var names []string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 0 && (f[0] == "jobs" || f[0] == "config") {
			names = append(names, f[0])
		}
	}
	require.Equal(t, []string{"jobs", "config"}, names, "the name with a waiter first")
	pid := strconv.Itoa(os.Getpid())
	require.Regexp(t, regexp.MustCompile(`jobs\s+excl\s+\d+\s+`+pid+`\s+-\s+1 \(0x/1s\)\s+\S+`), last)
	require.Regexp(t, `config\s+shrd\s+\d+\s+`+pid, last)
	for _, l := range lines {
		require.LessOrEqual(t, len([]rune(l)), 100, "cut to the width: %q", l)
	}
}
