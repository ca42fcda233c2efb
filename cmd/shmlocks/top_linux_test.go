package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/shmlocks/shmlocks/manager"
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

// liveView is dump --watch running on a pseudo-terminal: stdin, stdout
// and stderr are the terminal, which is its controlling terminal (so a
// typed Ctrl-C is a SIGINT from the terminal driver).
type liveView struct {
	t             *testing.T
	cmd           *exec.Cmd
	master, slave *os.File
	out           syncBuffer
	readDone      chan struct{}
}

func startLiveView(t *testing.T, cols, rows int, args ...string) *liveView {
	master, slave := openPTY(t, cols, rows)
	ctx := ctxFor(t, time.Minute)
	v := &liveView{t: t, master: master, slave: slave, readDone: make(chan struct{})}
	v.cmd = exec.CommandContext(ctx, binary, append([]string{"dump", "--watch"}, args...)...)
	v.cmd.Env = cleanEnv()
	v.cmd.Stdin, v.cmd.Stdout, v.cmd.Stderr = slave, slave, slave
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	require.NoError(t, v.cmd.Start())
	go func() {
		defer close(v.readDone)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			v.out.mu.Lock()
			v.out.b.Write(buf[:n])
			v.out.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return v
}

// frames returns the complete frames drawn so far, without the terminal's
// \r and the view's clear-to-end escapes.
func (v *liveView) frames() []string {
	s := v.out.String()
	parts := strings.Split(s, escHome)
	if len(parts) < 2 {
		return nil
	}
	var out []string
	for _, p := range parts[1 : len(parts)-1] {
		out = append(out, strings.NewReplacer("\r", "", escClearEOL, "", escClearEOS, "").Replace(p))
	}
	return out
}

// waitFrame waits until a complete frame drawn after the first skip frames
// satisfies cond, and returns it.
func (v *liveView) waitFrame(skip int, cond func(string) bool, what string) string {
	v.t.Helper()
	var got string
	waitFor(v.t, func() bool {
		fs := v.frames()
		for i := skip; i < len(fs); i++ {
			if cond(fs[i]) {
				got = fs[i]
				return true
			}
		}
		return false
	}, what)
	return got
}

// type_ writes keys to the terminal, as typed.
func (v *liveView) type_(keys string) {
	_, err := v.master.Write([]byte(keys))
	require.NoError(v.t, err)
}

// wait waits for the view to exit with status 0 and checks that it left
// the alternate screen and put the terminal's settings back (echo, line
// editing). It returns everything the view wrote.
func (v *liveView) wait() string {
	v.t.Helper()
	require.NoError(v.t, v.cmd.Wait(), "the live view exits with status 0")
	tio, err := unix.IoctlGetTermios(int(v.slave.Fd()), unix.TCGETS)
	require.NoError(v.t, err)
	require.NotZero(v.t, tio.Lflag&unix.ECHO, "echo restored")
	require.NotZero(v.t, tio.Lflag&unix.ICANON, "line editing restored")
	v.slave.Close() // the master reads EOF/EIO now
	v.master.SetReadDeadline(time.Now().Add(10 * time.Second))
	<-v.readDone
	s := v.out.String()
	require.True(v.t, strings.HasPrefix(s, escAltScreen), "starts on the alternate screen: %q", s[:min(len(s), 40)])
	require.True(v.t, strings.HasSuffix(s, escMainScr), "ends back on the main screen: %q", s[max(0, len(s)-40):])
	return s
}

// namesIn lists the lock names of a frame's lines, in order.
func namesIn(frame string, known ...string) []string {
	var names []string
	for _, l := range strings.Split(frame, "\n") {
		if f := strings.Fields(l); len(f) > 0 && slices.Contains(known, f[0]) {
			names = append(names, f[0])
		}
	}
	return names
}

// On a terminal, dump --watch is the full-screen live view: on the
// alternate screen, redrawn in place, the name with a waiter first, its
// holder's token, pid, command and hold time (granted at once: known too),
// its queue; SIGINT restores the screen and exits 0.
func TestDumpWatchTerminal(t *testing.T) {
	path, _, _ := liveTable(t)
	v := startLiveView(t, 120, 30, "--interval", "30ms", "--table", path)
	v.waitFrame(2, func(string) bool { return true }, "three frames")
	require.NoError(t, v.cmd.Process.Signal(syscall.SIGINT))
	v.wait()

	fs := v.frames()
	last := fs[len(fs)-1]
	require.Regexp(t, `^shmlocks dump --watch  \d\d:\d\d:\d\d  sorted by longest wait \(w/h/n/s sort, q quits\)  every 30ms  `+regexp.QuoteMeta(path[:20]), last)
	require.Regexp(t, `names 2/\d+  requests 3/\d+ \(held 2, waiting 1\)  longest wait \S+`, last)
	require.Regexp(t, `agents 2/\d+ \(0 dead\)  reaps \d+ \([0-9.]+/s\)  repairs \d+`, last)
	require.Equal(t, []string{"jobs", "config"}, namesIn(last, "jobs", "config"), "the name with a waiter first")
	pid := strconv.Itoa(os.Getpid())
	comm := regexp.QuoteMeta(procCommand(os.Getpid()))
	age := `\d+(\.\d+)?(µs|ms|s)`
	comm += `[^\n]*?` // the command line, cut to the column
	require.Regexp(t, regexp.MustCompile(`jobs\s+excl\s+\d+\s+`+pid+`\s+`+comm+`\s+`+age+`\s+1 \(0x/1s\)\s+\S+`), last)
	require.Regexp(t, `config\s+shrd\s+\d+\s+`+pid+`\s+`+comm+`\s+`+age+`\s+0\s+-`, last)
	for _, l := range strings.Split(last, "\n") {
		require.LessOrEqual(t, len([]rune(l)), 120, "cut to the width: %q", l)
	}
}

// The live view takes keys like top: typed keys are not echoed, n, h and
// w change the order (the header says which), q quits and the terminal's
// settings come back.
func TestDumpWatchKeys(t *testing.T) {
	path, _, _ := liveTable(t)
	v := startLiveView(t, 120, 30, "--interval", "50ms", "--table", path)
	v.waitFrame(0, func(f string) bool { return strings.Contains(f, "sorted by longest wait") }, "a first frame")
	v.type_("zyx")
	n := len(v.frames())
	v.waitFrame(n+1, func(string) bool { return true }, "two frames after the typing")
	require.NotContains(t, v.out.String(), "zyx", "typed keys are not echoed")

	v.type_("n")
	f := v.waitFrame(0, func(f string) bool { return strings.Contains(f, "sorted by name") }, "the order by name")
	require.Equal(t, []string{"config", "jobs"}, namesIn(f, "jobs", "config"))
	v.type_("w")
	f = v.waitFrame(len(v.frames()), func(f string) bool { return strings.Contains(f, "sorted by longest wait") }, "the order by wait")
	require.Equal(t, []string{"jobs", "config"}, namesIn(f, "jobs", "config"))
	v.type_("h")
	v.waitFrame(len(v.frames()), func(f string) bool { return strings.Contains(f, "sorted by longest hold") }, "the order by hold")
	v.type_("s")
	v.waitFrame(len(v.frames()), func(f string) bool { return strings.Contains(f, "sorted by name") }, "s: the next order")
	v.type_("q")
	v.wait()
}

// Ctrl-C typed on the terminal quits too (the terminal driver's SIGINT).
func TestDumpWatchCtrlC(t *testing.T) {
	path, _, _ := liveTable(t)
	v := startLiveView(t, 100, 20, "--interval", "50ms", "--table", path)
	v.waitFrame(0, func(f string) bool { return strings.Contains(f, "jobs") }, "a frame")
	v.type_("\x03")
	v.wait()
}

// Like serve, the live view waits for a table that does not exist yet and
// shows it once it appears.
func TestDumpWatchWaitsForTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "later.tbl")
	v := startLiveView(t, 100, 20, "--interval", "30ms", "--table", path)
	v.waitFrame(0, func(f string) bool { return strings.Contains(f, "no table here yet") }, "the waiting frame")
	m, err := manager.Open(path, nil)
	require.NoError(t, err)
	defer m.Close()
	_, err = m.Acquire(ctxFor(t, 10*time.Second), "arrived", manager.RequestOptions{})
	require.NoError(t, err)
	v.waitFrame(0, func(f string) bool { return strings.Contains(f, "arrived") }, "the table's names")
	v.type_("q")
	v.wait()
}

// Ctrl-Z stops the live view with the terminal as it found it (echo, line
// editing, the main screen), and the SIGCONT of a fg resumes it: the
// alternate screen, keys not echoed, q quits. The view runs as the leader
// of its own session here, an orphaned process group, where the kernel
// would drop the stop of a terminal's SIGTSTP: the view stops itself.
func TestDumpWatchSuspend(t *testing.T) {
	path, _, _ := liveTable(t)
	v := startLiveView(t, 100, 20, "--interval", "30ms", "--table", path)
	v.waitFrame(0, func(f string) bool { return strings.Contains(f, "jobs") }, "a frame")
	pid := v.cmd.Process.Pid

	v.type_("\x1a") // Ctrl-Z
	waitFor(t, func() bool { return procState(pid) == 'T' }, "the view stopped")
	tio, err := unix.IoctlGetTermios(int(v.slave.Fd()), unix.TCGETS)
	require.NoError(t, err)
	require.NotZero(t, tio.Lflag&unix.ECHO, "echo restored while stopped")
	require.NotZero(t, tio.Lflag&unix.ICANON, "line editing restored while stopped")
	waitFor(t, func() bool { return strings.HasSuffix(v.out.String(), escMainScr) }, "back on the main screen while stopped")
	stoppedAt := len(v.out.String())

	require.NoError(t, v.cmd.Process.Signal(syscall.SIGCONT)) // fg
	waitFor(t, func() bool { return procState(pid) != 'T' }, "the view running again")
	waitFor(t, func() bool {
		after := v.out.String()[stoppedAt:]
		return strings.HasPrefix(after, escAltScreen) && strings.Count(after, escHome) >= 2
	}, "the alternate screen and a frame again")
	tio, err = unix.IoctlGetTermios(int(v.slave.Fd()), unix.TCGETS)
	require.NoError(t, err)
	require.Zero(t, tio.Lflag&(unix.ECHO|unix.ICANON), "cbreak mode again")
	v.type_("zyx")
	n := len(v.frames())
	v.waitFrame(n+1, func(string) bool { return true }, "two frames after the typing")
	require.NotContains(t, v.out.String(), "zyx", "typed keys are not echoed after fg")
	v.type_("q")
	v.wait()
}
