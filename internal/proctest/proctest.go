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
	"fmt"
	"iter"
	"os"
	"strings"
	"sync"
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
