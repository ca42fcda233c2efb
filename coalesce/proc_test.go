package coalesce

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/internal/proctest"
	"github.com/shmlocks/shmlocks/internal/testhooks"
	"github.com/shmlocks/shmlocks/manager"
)

// Multi-process tests re-exec this test binary as a child agent
// (TestHelperProcess) that opens the table (smallTable), prints
// "ready PID", obeys one command per stdin line and reports one result per
// stdout line:
//
//	coalesce KEY TAG COUNTER MODE
//	        -> "coalesced TAG shared=BOOL result=RES errkind=KIND"
//	           fn appends "start TAG PID" to COUNTER (O_APPEND), then by MODE:
//	           quick: appends "run RES" and returns RES (unique per run)
//	           block: says "running TAG", waits for "go TAG", then as quick
//	           hang:  says "running TAG" and returns only if told "go TAG" (the test kills us)
//	           fail:  appends "run fail" and returns an error "boom TAG"
//	           big:   returns MaxResultSize+1 bytes
//	           block+fail, block+big: blocks first
//	loop KEY G ROUNDS COUNTER
//	        -> G goroutines call Do ROUNDS times each (fn as quick, 1 ms
//	           long), then "loopdone calls=N led=L failed=E results=R1,R2,..."
//	members KEY N       -> "members KEY N" once N callers wait in our flight on KEY
//	go TAG              -> releases a blocked fn
//	pause POINT         -> at crash point POINT: says "paused POINT", waits for "resume"
//	crash POINT         -> at crash point POINT: SIGKILLs itself
//	refreshround K G DIR WANT401 -> seed_tokenrefresh_test.go
//
// The child is a role of internal/proctest (its watchdog makes a stuck
// child exit with a message instead of hanging the test).
func TestHelperProcess(t *testing.T) {
	proctest.Main(t, proctest.Roles{"agent": childMain})
}

var say = proctest.Say

var (
	childGates  sync.Map // tag -> chan struct{}
	childResume = make(chan struct{})
)

func gate(tag string) chan struct{} {
	c, _ := childGates.LoadOrStore(tag, make(chan struct{}))
	return c.(chan struct{})
}

func errKind(err error) string {
	switch {
	case err == nil:
		return "none"
	case errors.Is(err, ErrResultTooLarge):
		return "toolarge"
	case errors.Is(err, ErrLeaderFailed):
		return "leaderfailed"
	case errors.Is(err, manager.ErrWouldDeadlock):
		return "wouldDeadlock"
	case errors.Is(err, manager.ErrAborted):
		return "aborted"
	}
	return "other:" + strings.ReplaceAll(err.Error(), " ", "_")
}

func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		say("error append %v", err)
		return
	}
	fmt.Fprintln(f, line)
	f.Close()
}

func childMain(args []string) int {
	m, err := manager.Open(args[0], smallTable)
	if err != nil {
		say("error open %v", err)
		return 2
	}
	g := New(m)
	say("ready %d", os.Getpid())
	for f := range proctest.Commands() {
		switch f[0] {
		case "coalesce":
			childDo(g, f[1], f[2], f[3], f[4])
		case "loop":
			var n, rounds int
			fmt.Sscan(f[2], &n)
			fmt.Sscan(f[3], &rounds)
			go childLoop(g, f[1], n, rounds, f[4])
		case "members":
			var n int
			fmt.Sscan(f[2], &n)
			go func() {
				for deadline := time.Now().Add(eventually); flightMembers(m, f[1]) < n; time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						say("error members %s: %d, want %d", f[1], flightMembers(m, f[1]), n)
						return
					}
				}
				say("members %s %d", f[1], n)
			}()
		case "go":
			close(gate(f[1]))
		case "pause":
			point := f[1]
			testhooks.SetCrash(func(p string) {
				if p == point {
					say("paused %s", p)
					<-childResume
				}
			})
			say("armed %s", point)
		case "resume":
			close(childResume)
		case "crash":
			point := f[1]
			testhooks.SetCrash(func(p string) {
				if p == point {
					self, _ := os.FindProcess(os.Getpid())
					self.Kill() // SIGKILL: no deferred code, no Close
					select {}
				}
			})
			say("armed %s", point)
		case "refreshround":
			childRefreshRound(g, m, f) // seed_tokenrefresh_test.go
		default:
			say("error unknown command %q", f[0])
		}
	}
	return 0 // stdin closed: exit without Close
}

// childDo runs "coalesce KEY TAG COUNTER MODE" in the background.
func childDo(g *Group, key, tag, counter, mode string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, shared, err := g.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
			appendLine(counter, fmt.Sprintf("start %s %d", tag, os.Getpid()))
			if strings.HasPrefix(mode, "block") || mode == "hang" {
				say("running %s", tag)
				select {
				case <-gate(tag):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			switch strings.TrimPrefix(mode, "block") {
			case "+fail", "fail":
				appendLine(counter, "run fail")
				return nil, fmt.Errorf("boom %s", tag)
			case "+big", "big":
				return make([]byte, MaxResultSize+1), nil
			}
			r := fmt.Sprintf("%d-%s-%d", os.Getpid(), tag, time.Now().UnixNano())
			appendLine(counter, "run "+r)
			return []byte(r), nil
		})
		say("coalesced %s shared=%v result=%s errkind=%s", tag, shared, res, errKind(err))
	}()
}

// childLoop runs "loop KEY G ROUNDS COUNTER".
func childLoop(g *Group, key string, n, rounds int, counter string) {
	var resMu sync.Mutex
	seen := map[string]bool{}
	calls, led, failed := 0, 0, 0
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				res, shared, err := g.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
					appendLine(counter, fmt.Sprintf("start loop %d", os.Getpid()))
					time.Sleep(time.Millisecond)
					r := fmt.Sprintf("%d-loop-%d", os.Getpid(), time.Now().UnixNano())
					appendLine(counter, "run "+r)
					return []byte(r), nil
				})
				cancel()
				resMu.Lock()
				calls++
				if err != nil {
					failed++
					say("loopfail %s", errKind(err))
				} else {
					seen[string(res)] = true
					if !shared {
						led++
					}
				}
				resMu.Unlock()
			}
		}()
	}
	wg.Wait()
	var rs []string
	for r := range seen {
		rs = append(rs, r)
	}
	say("loopdone calls=%d led=%d failed=%d results=%s", calls, led, failed, strings.Join(rs, ","))
}

// spawn starts a child agent on the table at path and waits for "ready".
func spawn(t testing.TB, path string) *proctest.Child {
	t.Helper()
	c := proctest.SpawnWith(t, proctest.Options{Within: eventually}, "agent", path)
	c.Expect("ready")
	return c
}

// parseFields maps the key=value fields of a line.
func parseFields(line string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

func atoi(s string) int {
	var n int
	fmt.Sscan(s, &n)
	return n
}
