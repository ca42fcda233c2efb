//go:build unix

package proctest

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestHelperProcess(t *testing.T) {
	Main(t, Roles{
		// echo: "ready ARGS", then "echo LINE" per command until stdin closes, exit 0.
		"echo": func(args []string) int {
			Say("ready %s", strings.Join(args, ","))
			for f := range Commands() {
				if f[0] == "exit" {
					return 7
				}
				Say("echo %s", strings.Join(f, " "))
			}
			return 0
		},
		// stuck: never returns (the watchdog ends it).
		"stuck": func([]string) int {
			Say("ready")
			select {}
		},
	})
}

// P: spawn E with arguments; E: "ready a,b c".
// P: send two commands; E echoes them in order, which Expect finds by prefix
// whatever the order it asks in. P closes stdin: E exits 0.
func TestSpawnExpectSend(t *testing.T) {
	c := Spawn(t, "echo", "a", "b c")
	if l := c.Expect("ready"); l != "ready a,b c" {
		t.Fatalf("ready line %q", l)
	}
	c.Send("one")
	c.Send("two %d", 2)
	if l := c.Expect("echo two"); l != "echo two 2" {
		t.Fatalf("got %q", l)
	}
	if l := c.Expect("echo"); l != "echo one" {
		t.Fatalf("the earlier line stays unread: got %q", l)
	}
	c.Quiet("echo", 50*time.Millisecond)
	if err := c.Wait(); err != nil {
		t.Fatalf("exit: %v", err)
	}
	c.Kill() // after Wait: nothing left to do
}

func TestExitCode(t *testing.T) {
	c := Spawn(t, "echo")
	c.Expect("ready")
	c.Send("exit")
	if got := ExitCode(c.Wait()); got != 7 {
		t.Fatalf("exit code %d, want 7", got)
	}
	k := Spawn(t, "stuck")
	k.Expect("ready")
	k.Kill()
	select {
	case <-k.exited:
	default:
		t.Fatal("Kill returned before the child was reaped")
	}
	if got := ExitCode(k.waitErr); got != 128+int(syscall.SIGKILL) {
		t.Fatalf("exit code %d after SIGKILL", got)
	}
	if err := syscall.Kill(k.Pid, 0); err == nil {
		t.Fatalf("pid %d still answers kill(pid, 0) after Kill", k.Pid)
	}
}

// A stuck child reports and exits 3 at its watchdog.
func TestWatchdog(t *testing.T) {
	c := SpawnWith(t, Options{Watchdog: 200 * time.Millisecond}, "stuck")
	c.Expect("ready")
	if l := c.Expect("error watchdog"); !strings.Contains(l, "stuck child") {
		t.Fatalf("watchdog line %q", l)
	}
	if got := ExitCode(c.Wait()); got != 3 {
		t.Fatalf("exit code %d, want 3", got)
	}
}

// Start reads the lines of any command; Next takes them in order.
func TestStartCommand(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	c := Start(t, exec.Command(sh, "-c", "echo first; echo second; echo oops >&2; exit 4"), Options{CaptureStderr: true})
	if l := c.Next(); l != "first" {
		t.Fatalf("got %q", l)
	}
	if l := c.Next(); l != "second" {
		t.Fatalf("got %q", l)
	}
	c.Closed()
	if got := ExitCode(c.Wait()); got != 4 {
		t.Fatalf("exit code %d", got)
	}
	if c.Stderr() != "oops\n" {
		t.Fatalf("stderr %q", c.Stderr())
	}
}

// A child's environment carries its role, not the parent's.
func TestEnv(t *testing.T) {
	t.Setenv(RoleEnv, "parent")
	t.Setenv("GORACE", "halt_on_error=1")
	cmd := Command("echo")
	if r := roleOf(cmd.Env); r != "echo" {
		t.Fatalf("role %q", r)
	}
	var gorace []string
	for _, kv := range cmd.Env {
		if strings.HasPrefix(kv, "GORACE=") {
			gorace = append(gorace, kv)
		}
	}
	if len(gorace) != 1 || gorace[0] != "GORACE=halt_on_error=1 atexit_sleep_ms=0" {
		t.Fatalf("GORACE %q", gorace)
	}
}
