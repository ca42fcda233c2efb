// Package proctest is the multi-process test kit of the project: a test
// re-executes its own test binary as a child process playing a role, and
// talks to it over a line protocol, commands on the child's stdin and one
// result per line on its stdout (the model of Go's
// cmd/go/internal/lockedfile tests).
//
// The child side is one TestHelperProcess per package, which runs the role
// named in the environment and exits (in an ordinary test run it skips):
//
//	func TestHelperProcess(t *testing.T) {
//		proctest.Main(t, proctest.Roles{"agent": agentMain})
//	}
//
//	func agentMain(args []string) int {
//		m, err := manager.Open(args[0], nil)
//		...
//		proctest.Say("ready")
//		for f := range proctest.Commands() {
//			switch f[0] {
//			case "acquire":
//				...
//				proctest.Say("acquired %s %d", f[1], l.Token())
//			}
//		}
//		return 0 // stdin closed
//	}
//
// The parent side:
//
//	c := proctest.Spawn(t, "agent", path)
//	c.Expect("ready")
//	c.Send("acquire %s", name)
//	line := c.Expect("acquired " + name)
//
// Every wait of the parent is bounded: Expect fails the test when no line
// with the prefix arrives within Within (or the child exits first), or when
// the child reports a line starting with "error". The child carries a
// watchdog: still running after its Watchdog, it prints "error watchdog
// ..." and exits 3, so a stuck child reports instead of hanging the test.
//
// A child is SIGKILLed and reaped at the test's cleanup. A test that
// expects the survivors to notice a child's death calls Kill, which also
// reaps it: a zombie still answers kill(pid, 0).
package proctest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The environment of a child: its role, and its watchdog's bound.
const (
	RoleEnv     = "SHMLOCKS_TEST_ROLE"
	watchdogEnv = "SHMLOCKS_TEST_WATCHDOG"
)

// Default bounds: a child's lifetime (Watchdog) and the parent's waits for
// a line or an exit (Within).
const (
	DefaultWatchdog = 60 * time.Second
	DefaultWithin   = 10 * time.Second
)

// helperRun selects the child side in the re-executed test binary.
const helperRun = "-test.run=^TestHelperProcess$"

// Roles maps a role's name to the child's main: it gets the arguments
// given to Spawn and returns the exit status.
type Roles map[string]func(args []string) int

// Main is the child side: called from the package's TestHelperProcess, it
// runs the role named in the environment with the arguments given to
// Spawn and exits with its status. In an ordinary test run (no role) it
// skips the test.
func Main(t *testing.T, roles Roles) {
	role := os.Getenv(RoleEnv)
	if role == "" {
		t.Skip("helper process for the multi-process tests")
	}
	os.Exit(Run(roles))
}

// Run runs the role named in the environment, under the watchdog, and
// returns its exit status (2 for an unknown role). Main calls it; a
// TestMain hook may too.
func Run(roles Roles) int {
	role := os.Getenv(RoleEnv)
	fn, ok := roles[role]
	if !ok {
		Say("error unknown role %q", role)
		return 2
	}
	d := DefaultWatchdog
	if v, err := time.ParseDuration(os.Getenv(watchdogEnv)); err == nil && v > 0 {
		d = v
	}
	time.AfterFunc(d, func() {
		Say("error watchdog: %s child %d still running after %v", role, os.Getpid(), d)
		os.Exit(3)
	})
	return fn(Args())
}

// Args returns the arguments given to Spawn (in the child).
func Args() []string {
	for i, a := range os.Args {
		if a == "--" {
			return os.Args[i+1:]
		}
	}
	return nil
}

var sayMu sync.Mutex

// Say prints one line of the protocol on stdout (the child side); safe for
// concurrent use: lines never interleave.
func Say(format string, args ...any) {
	sayMu.Lock()
	defer sayMu.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

// Commands yields the fields of each non-blank line of stdin until it is
// closed (the child side).
func Commands() iter.Seq[[]string] {
	return func(yield func([]string) bool) {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			if f := strings.Fields(in.Text()); len(f) > 0 && !yield(f) {
				return
			}
		}
	}
}

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
