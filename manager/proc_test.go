package manager

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/table"
)

// Multi-process tests re-exec this test binary as a child agent
// (TestHelperProcess) that obeys one command per stdin line and reports one
// result per stdout line:
//
//	acquire NAME [shared] [ifavailable] [steal] [timeout=DUR]
//	                       -> "acquired NAME TOKEN" | "notavailable NAME" | "aborted NAME" | "error NAME MSG"
//	                          (runs in the background; several may be outstanding)
//	release NAME           -> "released NAME" | "stolen NAME" | "error NAME MSG"
//	watch NAME             -> "lost NAME" once the held lock's Lost channel closes
//	waitunlocked NAME [shared] [timeout=DUR]
//	                       -> "unlocked NAME" | "aborted NAME" | "error NAME MSG" (in the background)
//	query                  -> "query JSON"
//	check                  -> "checked" | "error check MSG"
//	acqlog NAME ID LOG     -> "logged ID TOKEN" (a goroutine acquires NAME, appends "PID ID TOKEN" to LOG while holding, releases)
//	crash POINT            -> arms a crash point: the child SIGKILLs itself when it reaches it
//	exit | close | panic   -> exit without Close, Close then exit 0, or panic
//	(the commands of childCommands, in other test files)
//
// The child prints "ready PID CLIENTID" after Open. A watchdog makes a stuck
// child exit with a message instead of hanging the test.
const (
	envRole  = "SHMLOCKS_TEST_ROLE"
	envTable = "SHMLOCKS_TEST_TABLE"
	envOpts  = "SHMLOCKS_TEST_OPTS"
	envCrash = "SHMLOCKS_TEST_CRASH" // arm a crash point before Open
)

// armCrash makes this process SIGKILL itself when it reaches the crash point.
func armCrash(point string) {
	hook := func(p string) {
		if p == point {
			self, _ := os.FindProcess(os.Getpid())
			self.Kill() // SIGKILL: no deferred code, no Close
			select {}
		}
	}
	table.SetCrashHook(hook)
}

func TestHelperProcess(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		t.Skip("helper process for the multi-process tests")
	}
	go func() {
		time.Sleep(60 * time.Second)
		fmt.Println("error watchdog child stuck for 60s")
		os.Exit(3)
	}()
	os.Exit(childMain(role))
}

var childOut sync.Mutex

func say(format string, args ...any) {
	childOut.Lock()
	fmt.Printf(format+"\n", args...)
	childOut.Unlock()
}

func childMain(role string) int {
	opts := smallTable
	if s := os.Getenv(envOpts); s != "" {
		opts = &OpenOptions{}
		if err := json.Unmarshal([]byte(s), opts); err != nil {
			say("error open %v", err)
			return 2
		}
	}
	if point := os.Getenv(envCrash); point != "" {
		armCrash(point)
	}
	m, err := Open(os.Getenv(envTable), opts)
	if err != nil {
		say("error open %v", err)
		return 2
	}
	say("ready %d %s", os.Getpid(), m.ClientID())
	var mu sync.Mutex
	held := map[string]*Lock{}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "acquire":
			name := f[1]
			var o RequestOptions
			timeout := time.Minute
			for _, a := range f[2:] {
				switch {
				case a == "shared":
					o.Mode = Shared
				case a == "ifavailable":
					o.IfAvailable = true
				case a == "steal":
					o.Steal = true
				case strings.HasPrefix(a, "timeout="):
					timeout, _ = time.ParseDuration(strings.TrimPrefix(a, "timeout="))
				}
			}
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				l, err := m.Acquire(ctx, name, o)
				switch {
				case err == nil:
					mu.Lock()
					held[name] = l
					mu.Unlock()
					say("acquired %s %d", name, l.Token())
				case isErr(err, ErrNotAvailable):
					say("notavailable %s", name)
				case isErr(err, ErrAborted):
					say("aborted %s", name)
				case isErr(err, ErrDeadlock):
					say("deadlock %s %v", name, err)
				default:
					say("error %s %v", name, err)
				}
			}()
		case "release":
			mu.Lock()
			l := held[f[1]]
			delete(held, f[1])
			mu.Unlock()
			if l == nil {
				say("error %s not held", f[1])
				continue
			}
			switch err := l.Release(); {
			case err == nil:
				say("released %s", f[1])
			case isErr(err, ErrStolen):
				say("stolen %s", f[1])
			default:
				say("error %s %v", f[1], err)
			}
		case "watch":
			mu.Lock()
			l := held[f[1]]
			mu.Unlock()
			if l == nil {
				say("error %s not held", f[1])
				continue
			}
			go func() {
				<-l.Lost()
				say("lost %s", l.Name())
			}()
		case "waitunlocked":
			name, mode, timeout := f[1], Exclusive, time.Minute
			for _, a := range f[2:] {
				switch {
				case a == "shared":
					mode = Shared
				case strings.HasPrefix(a, "timeout="):
					timeout, _ = time.ParseDuration(strings.TrimPrefix(a, "timeout="))
				}
			}
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				switch err := m.WaitUnlocked(ctx, name, mode); {
				case err == nil:
					say("unlocked %s", name)
				case isErr(err, ErrAborted):
					say("aborted %s", name)
				default:
					say("error %s %v", name, err)
				}
			}()
		case "query":
			s, err := m.Query(context.Background())
			if err != nil {
				say("error query %v", err)
				continue
			}
			b, _ := json.Marshal(s)
			say("query %s", b)
		case "check":
			if err := m.Check(); err != nil {
				say("error check %v", strings.ReplaceAll(err.Error(), "\n", "; "))
				continue
			}
			say("checked")
		case "acqlog": // acqlog NAME ID LOGPATH: see acquireLogged (goroutines_proc_test.go)
			go acquireLogged(m, f[1], f[2], f[3])
		case "crash":
			armCrash(f[1])
			say("armed %s", f[1])
		case "flock": // flock PATH: hold an exclusive flock on PATH (benchmark baseline)
			f, err := os.OpenFile(f[1], os.O_CREATE|os.O_RDWR, 0o600)
			if err == nil {
				err = flockExclusive(f)
			}
			if err != nil {
				say("error flock %v", err)
				continue
			}
			say("flocked")
		case "coowner": // coowner PGID -> "coowned" (coowner_test.go)
			childCoOwner(m, f)
		case "reenter", "releasechild", "releaseouter":
			childReentrant(m, f) // reentrant_proc_test.go
		case "exit":
			os.Exit(0)
		case "close":
			m.Close()
			say("closed")
			return 0
		case "panic":
			panic("child told to panic")
		default:
			childCommand(m, f) // more commands, in other test files
		}
	}
	return 0 // stdin closed: exit without Close
}

var isErr = errors.Is

// child is a running helper process.
type child struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	buf    []string
	pid    int
	client string
	waited bool
}

// spawn starts a child agent on the table at path and waits for "ready".
func spawn(t testing.TB, path string, opts *OpenOptions, extraEnv ...string) *child {
	t.Helper()
	c := start(t, path, opts, extraEnv...)
	f := strings.Fields(c.expect("ready"))
	c.pid, _ = strconv.Atoi(f[1])
	c.client = f[2]
	return c
}

func start(t testing.TB, path string, opts *OpenOptions, extraEnv ...string) *child {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^TestHelperProcess$", "-test.v=false")
	cmd.Env = append(os.Environ(), envRole+"=agent", envTable+"="+path)
	if opts != nil {
		b, _ := json.Marshal(opts)
		cmd.Env = append(cmd.Env, envOpts+"="+string(b))
	}
	cmd.Env = append(cmd.Env, extraEnv...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &child{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() { c.kill() })
	return c
}

func (c *child) send(format string, args ...any) {
	c.t.Helper()
	_, err := fmt.Fprintf(c.stdin, format+"\n", args...)
	require.NoError(c.t, err)
}

// expect returns the first line starting with prefix (waiting up to
// eventually); an "error" line or the child's exit fails the test.
func (c *child) expect(prefix string) string {
	c.t.Helper()
	return c.expectWithin(prefix, eventually)
}

func (c *child) expectWithin(prefix string, d time.Duration) string {
	c.t.Helper()
	for i, l := range c.buf {
		if strings.HasPrefix(l, prefix) {
			c.buf = append(c.buf[:i], c.buf[i+1:]...)
			return l
		}
	}
	deadline := time.After(d)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("child %d exited while expecting %q (unread: %q)", c.pid, prefix, c.buf)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
			if strings.HasPrefix(l, "error") {
				c.t.Fatalf("child %d: %s (expecting %q)", c.pid, l, prefix)
			}
			c.buf = append(c.buf, l)
		case <-deadline:
			c.t.Fatalf("child %d: no %q within %v (unread: %q)", c.pid, prefix, d, c.buf)
		}
	}
}

// quiet asserts that no line starting with prefix arrives during the quiet period.
func (c *child) quiet(prefix string) {
	c.t.Helper()
	for _, l := range c.buf {
		require.False(c.t, strings.HasPrefix(l, prefix), "child %d: unexpected %q", c.pid, l)
	}
	deadline := time.After(quietPeriod)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				return
			}
			require.False(c.t, strings.HasPrefix(l, prefix), "child %d: unexpected %q", c.pid, l)
			c.buf = append(c.buf, l)
		case <-deadline:
			return
		}
	}
}

// kill SIGKILLs the child and waits for it (a zombie would still look alive to kill(pid, 0)).
func (c *child) kill() {
	if c.waited {
		return
	}
	c.cmd.Process.Kill()
	c.wait()
}

// wait reaps the child process.
func (c *child) wait() error {
	if c.waited {
		return nil
	}
	c.waited = true
	c.stdin.Close()
	return c.cmd.Wait()
}

func (c *child) query() Snapshot {
	c.t.Helper()
	c.send("query")
	l := c.expect("query ")
	var s Snapshot
	require.NoError(c.t, json.Unmarshal([]byte(strings.TrimPrefix(l, "query ")), &s))
	return s
}

func tokenOf(line string) uint64 {
	f := strings.Fields(line)
	v, _ := strconv.ParseUint(f[len(f)-1], 10, 64)
	return v
}
