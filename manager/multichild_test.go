package manager_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/shmlocks/shmlocks/manager"
)

// More commands of the child agent (TestHelperProcess), for the multi-name
// and deadlock tests:
//
//	nest A B [timeout=DUR] [handle] -> Request(A) (handle: Acquire(A), then B through WithLock) prints "acquired A TOKEN" and waits for "gonest A";
//	                          then, in A's callback and with its ctx, Acquire(B):
//	                          "acquired B TOKEN" (released at once) | "deadlock B MSG" |
//	                          "aborted B"; then the callback returns (releasing A): "done A"
//	go A                   -> lets the nest on A go on
//	victimpause DUR        -> a deadlock victim pauses DUR before it withdraws
//	all N1,N2.. [shared] [ifavailable] [timeout=DUR] [hold]
//	                       -> AcquireAll: "acquiredall N1,N2.. T1,T2.." (released at once
//	                          unless hold) | "deadlock N1,N2.. MSG" | "aborted N1,N2.." |
//	                          "notavailable N1,N2.."
//	releaseall N1,N2..     -> releases a held "all": "releasedall N1,N2.."
//	loopall N1,N2.. COUNT  -> COUNT AcquireAll+ReleaseAll rounds: "loopdone N1,N2.. COUNT"
//	churn NAME             -> acquire and release NAME in a loop, until "stopchurn NAME":
//	                          "churning NAME", then "churned NAME COUNT"
var (
	childMu    sync.Mutex
	nestGates  = map[string]chan struct{}{}
	childAlls  = map[string][]*Lock{}
	childChurn = map[string]chan struct{}{}
)

func childGate(name string) chan struct{} {
	childMu.Lock()
	defer childMu.Unlock()
	g := nestGates[name]
	if g == nil {
		g = make(chan struct{})
		nestGates[name] = g
	}
	return g
}

func childTimeout(args []string) time.Duration {
	for _, a := range args {
		if d, ok := strings.CutPrefix(a, "timeout="); ok {
			v, _ := time.ParseDuration(d)
			return v
		}
	}
	return time.Minute
}

func childCommand(m *Manager, f []string) {
	switch f[0] {
	case "nest":
		a, b := f[1], f[2]
		gate := childGate(a)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), childTimeout(f[3:]))
			defer cancel()
			hold := func(ctx context.Context, a string, fn func(context.Context, *Lock) error) error {
				return m.Request(ctx, a, RequestOptions{}, fn)
			}
			if slices.Contains(f[3:], "handle") {
				// The handle form: Acquire, and the second request made
				// through WithLock, which carries the first hold.
				hold = func(ctx context.Context, a string, fn func(context.Context, *Lock) error) error {
					l, err := m.Acquire(ctx, a, RequestOptions{})
					if err != nil {
						return err
					}
					defer l.Release()
					return fn(WithLock(ctx, l), l)
				}
			}
			err := hold(ctx, a, func(ctx context.Context, l *Lock) error {
				say("acquired %s %d", a, l.Token())
				select {
				case <-gate:
					childMu.Lock()
					delete(nestGates, a) // the next nest on a waits for its own go
					childMu.Unlock()
				case <-ctx.Done():
					return ctx.Err()
				}
				lb, err := m.Acquire(ctx, b, RequestOptions{})
				switch {
				case err == nil:
					say("acquired %s %d", b, lb.Token())
					return lb.Release()
				case isErr(err, ErrDeadlock):
					say("deadlock %s %s", b, strings.ReplaceAll(err.Error(), "\n", "; "))
				case isErr(err, ErrAborted):
					say("aborted %s", b)
				default:
					say("error %s %v", b, err)
				}
				return err
			})
			_ = err
			say("done %s", a)
		}()
	case "victimpause": // victimpause DUR: a victim pauses before it withdraws
		d, _ := time.ParseDuration(f[1])
		SetVictimHook(func() { time.Sleep(d) })
		say("victimpause %v", d)
	case "gonest":
		close(childGate(f[1]))
	case "all":
		names := f[1]
		var o RequestOptions
		hold := false
		for _, a := range f[2:] {
			switch a {
			case "shared":
				o.Mode = Shared
			case "ifavailable":
				o.IfAvailable = true
			case "hold":
				hold = true
			}
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), childTimeout(f[2:]))
			defer cancel()
			locks, err := m.AcquireAll(ctx, strings.Split(names, ","), o)
			switch {
			case err == nil:
				toks := make([]string, len(locks))
				for i, l := range locks {
					toks[i] = fmt.Sprint(l.Token())
				}
				if hold {
					childMu.Lock()
					childAlls[names] = locks
					childMu.Unlock()
				} else if err := ReleaseAll(locks); err != nil {
					say("error %s %v", names, err)
					return
				}
				say("acquiredall %s %s", names, strings.Join(toks, ","))
			case isErr(err, ErrDeadlock):
				say("deadlock %s %s", names, strings.ReplaceAll(err.Error(), "\n", "; "))
			case isErr(err, ErrAborted):
				say("aborted %s", names)
			case isErr(err, ErrNotAvailable):
				say("notavailable %s", names)
			default:
				say("error %s %v", names, err)
			}
		}()
	case "releaseall":
		childMu.Lock()
		locks := childAlls[f[1]]
		delete(childAlls, f[1])
		childMu.Unlock()
		if err := ReleaseAll(locks); err != nil || locks == nil {
			say("error %s release: %v (held %d)", f[1], err, len(locks))
			return
		}
		say("releasedall %s", f[1])
	case "loopall":
		names := strings.Split(f[1], ",")
		var count int
		fmt.Sscan(f[2], &count)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for i := 0; i < count; i++ {
				locks, err := m.AcquireAll(ctx, names, RequestOptions{})
				if err != nil {
					say("error %s round %d: %v", f[1], i, err)
					return
				}
				if err := ReleaseAll(locks); err != nil {
					say("error %s round %d release: %v", f[1], i, err)
					return
				}
			}
			say("loopdone %s %d", f[1], count)
		}()
	case "churn":
		name := f[1]
		stop := make(chan struct{})
		childMu.Lock()
		childChurn[name] = stop
		childMu.Unlock()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			n := 0
			say("churning %s", name)
			for {
				select {
				case <-stop:
					say("churned %s %d", name, n)
					return
				default:
				}
				l, err := m.Acquire(ctx, name, RequestOptions{})
				if err != nil {
					say("error %s churn: %v", name, err)
					return
				}
				time.Sleep(200 * time.Microsecond) // hold a little, so that the queue is never empty
				if err := l.Release(); err != nil {
					say("error %s churn release: %v", name, err)
					return
				}
				n++
			}
		}()
	case "stopchurn":
		childMu.Lock()
		stop := childChurn[f[1]]
		delete(childChurn, f[1])
		childMu.Unlock()
		if stop != nil {
			close(stop)
		}
	default:
		childGrantCommand(m, f) // childgrant_proc_test.go
	}
}
