package manager_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/proctest"
	"github.com/shmlocks/shmlocks/internal/testhooks"

	. "github.com/shmlocks/shmlocks/manager"
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
// The child is the role "agent" of internal/proctest, spawned with the
// table's path and its OpenOptions (JSON; "" for smallTable), and a crash
// point to arm before Open ("" for none). It prints "ready PID CLIENTID"
// after Open.

// childRoles are the roles of this package's children (more are added by
// the init functions of other test files).
var childRoles = proctest.Roles{"agent": childMain}

func TestHelperProcess(t *testing.T) {
	proctest.Main(t, childRoles)
}

// armCrash makes this process SIGKILL itself when it reaches the crash point.
func armCrash(point string) {
	hook := func(p string) {
		if p == point {
			self, _ := os.FindProcess(os.Getpid())
			self.Kill() // SIGKILL: no deferred code, no Close
			select {}
		}
	}
	testhooks.SetCrash(hook)
}

var say = proctest.Say

func childMain(args []string) int {
	path, js, crash := args[0], args[1], args[2]
	opts := smallTable
	if js != "" {
		opts = &OpenOptions{}
		if err := json.Unmarshal([]byte(js), opts); err != nil {
			say("error open %v", err)
			return 2
		}
	}
	if crash != "" {
		armCrash(crash)
	}
	if os.Getenv(noProcEnv) != "" {
		if err := hideProc(); err != nil {
			say("error noproc %v", err)
			return 2
		}
	}
	if as := os.Getenv(asUserEnv); as != "" {
		if err := becomeUser(as); err != nil {
			say("error as-user %v", err)
			return 2
		}
	}
	m, err := Open(path, opts)
	if err != nil {
		say("error open %v", err)
		return 2
	}
	say("ready %d %s", os.Getpid(), m.ClientID())
	var mu sync.Mutex
	held := map[string]*Lock{}
	for f := range proctest.Commands() {
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
		case "skew": // skew DURATION: how old a bounded table's queued requests look to us
			d, _ := time.ParseDuration(f[1])
			testhooks.FairnessSkew.Store(int64(d))
			say("skewed %s", f[1])
		case "ownwaiting": // -> "ownwaiting" once a request of ours is parked or spinning (within 10 s)
			for deadline := time.Now().Add(10 * time.Second); !OwnWaiting(m) && time.Now().Before(deadline); {
				time.Sleep(100 * time.Microsecond)
			}
			say("ownwaiting %v", OwnWaiting(m))
		case "turns": // turns N: every N-th grant a release of ours makes a turn (manager/turns.go)
			n, _ := strconv.ParseUint(f[1], 10, 64)
			testhooks.TurnEvery.Store(n)
			say("turns %d", n)
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

// child is a running child agent: a proctest.Child with the client id of
// its Manager.
type child struct {
	*proctest.Child
	t      testing.TB
	client string
}

// spawn starts a child agent on the table at path (opts nil: smallTable)
// and waits for "ready".
func spawn(t testing.TB, path string, opts *OpenOptions) *child {
	t.Helper()
	c := start(t, path, opts, "")
	c.ready()
	return c
}

// start starts a child agent armed with the crash point crash ("": none)
// before its Open, without waiting for it (ready does).
func start(t testing.TB, path string, opts *OpenOptions, crash string) *child {
	t.Helper()
	js := ""
	if opts != nil {
		b, err := json.Marshal(opts)
		require.NoError(t, err)
		js = string(b)
	}
	return &child{Child: proctest.SpawnWith(t, proctest.Options{Within: eventually}, "agent", path, js, crash), t: t}
}

// ready waits for the child's "ready PID CLIENTID".
func (c *child) ready() {
	c.t.Helper()
	f := strings.Fields(c.Expect("ready"))
	c.client = f[2]
}

func (c *child) query() Snapshot {
	c.t.Helper()
	c.Send("query")
	l := c.Expect("query ")
	var s Snapshot
	require.NoError(c.t, json.Unmarshal([]byte(strings.TrimPrefix(l, "query ")), &s))
	return s
}

func tokenOf(line string) uint64 {
	f := strings.Fields(line)
	v, _ := strconv.ParseUint(f[len(f)-1], 10, 64)
	return v
}

// noProcEnv makes an agent child unmount /proc in its own mount namespace
// before it opens the table (namespaces_linux_test.go).
const noProcEnv = "SHMLOCKS_TEST_NOPROC"

// asUserEnv ("UID:GID" or "UID:GID:hidepid") makes an agent child, started
// as root, become that user before it opens the table, first mounting, in
// its own mount namespace, a /proc that hides other users' processes
// (hidepid=invisible) if asked (namespaces_linux_test.go).
const asUserEnv = "SHMLOCKS_TEST_AS_USER"
