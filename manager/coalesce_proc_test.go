package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// Child-side commands of the Coalesce and reentrancy tests (see proc_test.go
// for the protocol):
//
//	coalesce NAME TAG COUNTER MODE
//	        -> "coalesced TAG shared=BOOL result=RES errkind=KIND"
//	           fn appends "start TAG PID" to COUNTER (O_APPEND), then by MODE:
//	           quick: appends "run RES" and returns RES (unique per run)
//	           block: says "running TAG", waits for "go TAG", then as quick
//	           hang:  says "running TAG" and returns only if told "go TAG" (the test kills us)
//	           fail:  appends "run fail" and returns an error "boom TAG"
//	           big:   returns MaxResultSize+1 bytes
//	           block+fail, block+big: blocks first
//	members NAME N      -> "members NAME N" once N callers wait in our flight on NAME
//	go TAG              -> releases a blocked fn
//	pause POINT         -> at coalesce crash point POINT: says "paused POINT", waits for "resume"
//	reenter NAME MODE   -> "reentered NAME outer=TOK child=TOK nested=TOK reentries=N upgrade=KIND":
//	                       outer = Acquire(NAME), child = Acquire through WithLock(outer),
//	                       nested = a shared Request through WithLock(child) and a helper's
//	                       Acquire with its fn's ctx; upgrade = an exclusive IfAvailable sibling
//	                       of child
//	releasechild NAME   -> "childreleased NAME errkind=KIND"
//	releaseouter NAME   -> "outerreleased NAME errkind=KIND"
var (
	childGates   sync.Map // tag -> chan struct{}
	childResume  = make(chan struct{})
	childLocksMu sync.Mutex
	childOuter   = map[string]*Lock{}
	childChild   = map[string]*Lock{}
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
	case errors.Is(err, ErrWouldDeadlock):
		return "wouldDeadlock"
	case errors.Is(err, ErrAborted):
		return "aborted"
	case errors.Is(err, ErrNotAvailable):
		return "notavailable"
	case errors.Is(err, ErrStolen):
		return "stolen"
	case errors.Is(err, ErrReleased):
		return "released"
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

// flightMembers is the number of callers waiting in m's flight on name.
func flightMembers(m *Manager, name string) int {
	m.co.mu.Lock()
	defer m.co.mu.Unlock()
	if f := m.co.flights[name]; f != nil {
		return len(f.waiting)
	}
	return 0
}

func childCoalesce(m *Manager, f []string) {
	switch f[0] {
	case "coalesce":
		name, tag, counter, mode := f[1], f[2], f[3], f[4]
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, shared, err := m.Coalesce(ctx, name, func(ctx context.Context) ([]byte, error) {
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
	case "loop":
		// loop NAME G ROUNDS COUNTER: G goroutines call Coalesce ROUNDS
		// times each (fn as quick, 1 ms long) -> "loopdone calls=N led=L
		// failed=E results=R1,R2,..." (the distinct results received).
		name, counter := f[1], f[4]
		var g, rounds int
		fmt.Sscan(f[2], &g)
		fmt.Sscan(f[3], &rounds)
		go func() {
			var mu sync.Mutex
			seen := map[string]bool{}
			calls, led, failed := 0, 0, 0
			var wg sync.WaitGroup
			for i := 0; i < g; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for r := 0; r < rounds; r++ {
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						res, shared, err := m.Coalesce(ctx, name, func(ctx context.Context) ([]byte, error) {
							appendLine(counter, fmt.Sprintf("start loop %d", os.Getpid()))
							time.Sleep(time.Millisecond)
							r := fmt.Sprintf("%d-loop-%d", os.Getpid(), time.Now().UnixNano())
							appendLine(counter, "run "+r)
							return []byte(r), nil
						})
						cancel()
						mu.Lock()
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
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			var rs []string
			for r := range seen {
				rs = append(rs, r)
			}
			say("loopdone calls=%d led=%d failed=%d results=%s", calls, led, failed, strings.Join(rs, ","))
		}()
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
		hook := func(p string) {
			if p == point {
				say("paused %s", p)
				<-childResume
			}
		}
		coalesceCrashHook.Store(&hook)
		say("armed %s", point)
	case "resume":
		close(childResume)
	case "reenter":
		name, mode := f[1], Exclusive
		if f[2] == "shared" {
			mode = Shared
		}
		ctx, cancel := context.WithTimeout(context.Background(), eventually)
		defer cancel()
		outer, err := m.Acquire(ctx, name, RequestOptions{Mode: mode})
		if err != nil {
			say("error reenter %v", err)
			return
		}
		lctx := WithLock(ctx, outer)
		child, err := m.Acquire(lctx, name, RequestOptions{Mode: mode})
		if err != nil {
			say("error reenter child %v", err)
			return
		}
		var nested uint64
		err = m.Request(WithLock(ctx, child), name, RequestOptions{Mode: Shared}, func(ctx context.Context, l *Lock) error {
			// A helper that requests its caller's lock again, through
			// the ctx it was given.
			l2, err := m.Acquire(ctx, name, RequestOptions{Mode: Shared})
			if err != nil {
				return err
			}
			nested = l2.Token()
			return l2.Release()
		})
		if err != nil {
			say("error reenter nested %v", err)
			return
		}
		reentries := outer.Reentries()
		ul, uerr := m.Acquire(lctx, name, RequestOptions{IfAvailable: true})
		if uerr == nil {
			ul.Release()
		}
		childLocksMu.Lock()
		childOuter[name], childChild[name] = outer, child
		childLocksMu.Unlock()
		say("reentered %s outer=%d child=%d nested=%d reentries=%d upgrade=%s", name, outer.Token(), child.Token(), nested, reentries, errKind(uerr))
	case "releasechild", "releaseouter":
		childLocksMu.Lock()
		l := childChild[f[1]]
		if f[0] == "releaseouter" {
			l = childOuter[f[1]]
		}
		childLocksMu.Unlock()
		if l == nil {
			say("error %s not held", f[1])
			return
		}
		what := strings.TrimPrefix(f[0], "release")
		say("%sreleased %s errkind=%s", what, f[1], errKind(l.Release()))
	}
}
