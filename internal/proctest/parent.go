package proctest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The parent side: starting a child, its lines, its end.

// Options adjust a child.
type Options struct {
	// Env is added to the child's environment.
	Env []string
	// Watchdog bounds the child's life (0: DefaultWatchdog).
	Watchdog time.Duration
	// Within bounds every wait of the parent for a line or an exit (0:
	// DefaultWithin); ExpectWithin and WaitWithin take their own.
	Within time.Duration
	// CaptureStderr keeps the child's stderr in a file (Stderr) instead of
	// passing it to the test's: a pipe could keep Wait waiting on a
	// grandchild that inherited it.
	CaptureStderr bool
	// Start starts the command (nil: (*exec.Cmd).Start), for a parent that
	// must start it its own way (e.g. pinned to a CPU).
	Start func(*exec.Cmd) error
}

// Command returns the command that runs role with args in a child of this
// test binary, not started (Spawn starts it).
func Command(role string, args ...string) *exec.Cmd {
	return CommandWith(Options{}, role, args...)
}

// CommandWith is Command with o's environment and watchdog.
func CommandWith(o Options, role string, args ...string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	argv := append([]string{helperRun, "-test.v=false", "--"}, args...)
	cmd := exec.Command(exe, argv...)
	cmd.Env = append(Env(), RoleEnv+"="+role)
	if o.Watchdog > 0 {
		cmd.Env = append(cmd.Env, watchdogEnv+"="+o.Watchdog.String())
	}
	cmd.Env = append(cmd.Env, o.Env...)
	return cmd
}

// Env is the environment of a child: this process's, without a role of
// its own, and with the race runtime's exit sleep (1 s by default) off.
func Env() []string {
	env := make([]string, 0, len(os.Environ())+1)
	gorace := "atexit_sleep_ms=0"
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, RoleEnv+"="), strings.HasPrefix(kv, watchdogEnv+"="):
		case strings.HasPrefix(kv, "GORACE="):
			gorace = strings.TrimSpace(strings.TrimPrefix(kv, "GORACE=") + " " + gorace)
		default:
			env = append(env, kv)
		}
	}
	return append(env, "GORACE="+gorace)
}

// Child is a running child process and the lines it printed.
type Child struct {
	// Cmd is the child's command; Pid its process id.
	Cmd *exec.Cmd
	Pid int

	t      testing.TB
	within time.Duration
	stdin  io.WriteCloser
	errOut *os.File // CaptureStderr

	mu     sync.Mutex
	unread []string      // lines not taken by Expect yet, in order
	eof    bool          // stdout closed
	more   chan struct{} // signalled when a line arrives or stdout closes

	waitOnce sync.Once
	exited   chan struct{} // closed when Cmd.Wait returned
	waitErr  error
}

// Spawn starts role with args in a child of this test binary.
func Spawn(t testing.TB, role string, args ...string) *Child {
	t.Helper()
	return SpawnWith(t, Options{}, role, args...)
}

// SpawnWith is Spawn with options.
func SpawnWith(t testing.TB, o Options, role string, args ...string) *Child {
	t.Helper()
	return Start(t, CommandWith(o, role, args...), o)
}

// Start starts cmd (any command: the test binary in a role, or a built
// program) with its stdin a pipe and its stdout read line by line. o.Env,
// o.Watchdog only apply to Spawn's commands.
func Start(t testing.TB, cmd *exec.Cmd, o Options) *Child {
	t.Helper()
	c := &Child{Cmd: cmd, t: t, within: o.Within, more: make(chan struct{}, 1), exited: make(chan struct{})}
	if c.within <= 0 {
		c.within = DefaultWithin
	}
	var err error
	if cmd.Stdin == nil {
		if c.stdin, err = cmd.StdinPipe(); err != nil {
			t.Fatalf("proctest: %v", err)
		}
	}
	// Stdout is an os.Pipe, not StdoutPipe: the lines of grandchildren that
	// inherited it can still be read after the child exits.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatalf("proctest: %v", err)
	}
	cmd.Stdout = pw
	switch {
	case o.CaptureStderr:
		if c.errOut, err = os.CreateTemp(t.TempDir(), "stderr"); err != nil {
			t.Fatalf("proctest: %v", err)
		}
		cmd.Stderr = c.errOut
	case cmd.Stderr == nil:
		cmd.Stderr = os.Stderr
	}
	start := o.Start
	if start == nil {
		start = (*exec.Cmd).Start
	}
	err = start(cmd)
	pw.Close()
	if err != nil {
		pr.Close()
		t.Fatalf("proctest: start %v: %v", cmd.Args, err)
	}
	c.Pid = cmd.Process.Pid
	go c.read(pr)
	t.Cleanup(func() { c.Kill() })
	return c
}

func (c *Child) read(r *os.File) {
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		c.mu.Lock()
		c.unread = append(c.unread, sc.Text())
		c.mu.Unlock()
		c.signal()
	}
	r.Close()
	c.mu.Lock()
	c.eof = true
	c.mu.Unlock()
	c.signal()
}

func (c *Child) signal() {
	select {
	case c.more <- struct{}{}:
	default:
	}
}

func (c *Child) name() string {
	if role := roleOf(c.Cmd.Env); role != "" {
		return fmt.Sprintf("%s child %d", role, c.Pid)
	}
	return fmt.Sprintf("%s child %d", filepath.Base(c.Cmd.Path), c.Pid)
}

// roleOf is the role in a child's environment ("": not a role of this kit).
func roleOf(env []string) string {
	role := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, RoleEnv+"="); ok {
			role = v
		}
	}
	return role
}

// Send writes one command line to the child's stdin.
func (c *Child) Send(format string, args ...any) {
	c.t.Helper()
	if c.stdin == nil {
		c.t.Fatalf("%s: no stdin pipe", c.name())
	}
	if _, err := fmt.Fprintf(c.stdin, format+"\n", args...); err != nil {
		c.t.Fatalf("%s: send %q: %v", c.name(), fmt.Sprintf(format, args...), err)
	}
}

// CloseStdin closes the child's stdin (a role's Commands loop ends).
func (c *Child) CloseStdin() {
	if c.stdin != nil {
		c.stdin.Close()
	}
}

// Expect returns the first line starting with prefix that no Expect took
// yet, waiting for it up to Within. It fails the test if the child exits
// first, or if a line starting with "error" comes before it; other lines
// stay for later.
func (c *Child) Expect(prefix string) string {
	c.t.Helper()
	return c.ExpectWithin(prefix, c.within)
}

// ExpectWithin is Expect with its own bound.
func (c *Child) ExpectWithin(prefix string, d time.Duration) string {
	c.t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		for i, l := range c.unread {
			if strings.HasPrefix(l, prefix) {
				c.unread = append(c.unread[:i:i], c.unread[i+1:]...)
				c.mu.Unlock()
				return l
			}
			if strings.HasPrefix(l, "error") {
				c.mu.Unlock()
				c.t.Fatalf("%s: %s (expecting %q)", c.name(), l, prefix)
			}
		}
		eof, unread := c.eof, append([]string(nil), c.unread...)
		c.mu.Unlock()
		if eof {
			c.t.Fatalf("%s: exited while expecting %q (unread: %q)%s", c.name(), prefix, unread, c.stderrNote())
		}
		select {
		case <-c.more:
		case <-deadline.C:
			c.t.Fatalf("%s: no %q within %v (unread: %q)%s", c.name(), prefix, d, unread, c.stderrNote())
		}
	}
}

// Next returns the next line no Expect took, whatever it is, waiting for
// it up to Within.
func (c *Child) Next() string {
	c.t.Helper()
	return c.ExpectWithin("", c.within)
}

// Quiet asserts that no line starting with prefix ("": no line at all)
// arrives, or is unread, during d. The child exiting ends the wait.
func (c *Child) Quiet(prefix string, d time.Duration) {
	c.t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		for _, l := range c.unread {
			if strings.HasPrefix(l, prefix) {
				c.mu.Unlock()
				c.t.Fatalf("%s: unexpected %q", c.name(), l)
			}
		}
		eof := c.eof
		c.mu.Unlock()
		if eof && prefix != "" {
			return
		}
		if eof {
			c.t.Fatalf("%s: exited during a quiet period%s", c.name(), c.stderrNote())
		}
		select {
		case <-c.more:
		case <-deadline.C:
			return
		}
	}
}

// Lines returns the unread lines starting with prefix (they stay unread).
func (c *Child) Lines(prefix string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range c.unread {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// Drop forgets the unread lines.
func (c *Child) Drop() {
	c.mu.Lock()
	c.unread = nil
	c.mu.Unlock()
}

// Closed waits up to Within for the child's stdout to close (the child
// exited, and any grandchild that inherited it too), failing the test on
// an unread line starting with "error".
func (c *Child) Closed() {
	c.t.Helper()
	deadline := time.NewTimer(c.within)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		eof := c.eof
		for _, l := range c.unread {
			if strings.HasPrefix(l, "error") {
				c.mu.Unlock()
				c.t.Fatalf("%s: %s", c.name(), l)
			}
		}
		c.mu.Unlock()
		if eof {
			return
		}
		select {
		case <-c.more:
		case <-deadline.C:
			c.t.Fatalf("%s: still running after %v", c.name(), c.within)
		}
	}
}

func (c *Child) startWait() {
	c.waitOnce.Do(func() {
		go func() {
			c.waitErr = c.Cmd.Wait()
			close(c.exited)
		}()
	})
}

// Wait closes the child's stdin and reaps it, waiting up to Within; it
// returns the error of (*exec.Cmd).Wait (ExitCode reads it).
func (c *Child) Wait() error {
	c.t.Helper()
	return c.WaitWithin(c.within)
}

// WaitWithin is Wait with its own bound.
func (c *Child) WaitWithin(d time.Duration) error {
	c.t.Helper()
	c.CloseStdin()
	c.startWait()
	select {
	case <-c.exited:
		return c.waitErr
	case <-time.After(d):
		c.t.Fatalf("%s: did not exit within %v%s", c.name(), d, c.stderrNote())
		return nil
	}
}

// Kill SIGKILLs the child and reaps it (idempotent).
func (c *Child) Kill() {
	select {
	case <-c.exited:
		return
	default:
	}
	c.Cmd.Process.Kill()
	c.CloseStdin()
	c.startWait()
	<-c.exited
}

// Stderr returns what the child wrote on stderr (Options.CaptureStderr).
func (c *Child) Stderr() string {
	if c.errOut == nil {
		return ""
	}
	b, _ := os.ReadFile(c.errOut.Name())
	return string(b)
}

func (c *Child) stderrNote() string {
	if s := c.Stderr(); s != "" {
		return "\nstderr:\n" + s
	}
	return ""
}

// ExitCode is the exit status in err, an error of (*exec.Cmd).Wait: 0 for
// nil, 128+N for a death by signal N (as a shell reports it), -1 for an
// error that is not an exit.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return -1
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}
