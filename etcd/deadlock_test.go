package etcd

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

func openDL(t *testing.T, c *cluster, delay time.Duration) *manager.Manager {
	t.Helper()
	m, _ := openOn(t, c.client(t), "/dl", &Options{TTL: 5 * time.Second, DeadlockDelay: delay})
	return m
}

// cross makes m hold first (through Request's callback ctx, or a handle
// passed on with WithLock) and then request second with that ctx; it
// returns the second request's outcome once the first is released.
func cross(ctx context.Context, m *manager.Manager, form, first, second string, holding chan<- struct{}, proceed <-chan struct{}) error {
	inner := func(ctx context.Context) error {
		holding <- struct{}{}
		<-proceed
		l, err := m.Acquire(ctx, second, manager.RequestOptions{})
		if err != nil {
			return err
		}
		return l.Release()
	}
	if form == "handle" {
		l, err := m.Acquire(ctx, first, manager.RequestOptions{})
		if err != nil {
			return err
		}
		err = inner(manager.WithLock(ctx, l))
		if rerr := l.Release(); rerr != nil {
			return errors.Join(err, rerr)
		}
		return err
	}
	return m.Request(ctx, first, manager.RequestOptions{}, func(ctx context.Context, _ *manager.Lock) error { return inner(ctx) })
}

// TestDeadlockTwoManagers: a holds x and waits for y, b holds y and waits
// for x (each through its ctx, so the task edges are in the keys). The
// request that closed the cycle (b's, made after a's) is the victim: it
// fails with ErrDeadlock naming the cycle, not before DeadlockDelay; a is
// granted y once b's Request has released it.
func TestDeadlockTwoManagers(t *testing.T) {
	c := startCluster(t, 1)
	const delay = 150 * time.Millisecond
	for _, form := range []string{"request", "handle"} {
		t.Run(form, func(t *testing.T) {
			a, b := openDL(t, c, delay), openDL(t, c, delay)
			ctx := ctxT(t, 30*time.Second)
			x, y := form+"-x", form+"-y"
			ha, hb := make(chan struct{}, 1), make(chan struct{}, 1)
			pa, pb := make(chan struct{}), make(chan struct{})
			ea, eb := make(chan error, 1), make(chan error, 1)
			go func() { ea <- cross(ctx, a, form, x, y, ha, pa) }()
			go func() { eb <- cross(ctx, b, form, y, x, hb, pb) }()
			<-ha
			<-hb
			close(pa)
			waitPending(t, ctx, a, 1) // a waits for y first
			start := time.Now()
			close(pb)
			select { // b's wait ends first: a is granted y only once b's Request released it
			case err := <-eb:
				if !errors.Is(err, manager.ErrDeadlock) || !strings.Contains(err.Error(), "back to the first") {
					t.Fatalf("b: %v, want ErrDeadlock with the cycle", err)
				}
				if d := time.Since(start); d < delay {
					t.Fatalf("b gave up after %v, before DeadlockDelay %v", d, delay)
				}
				t.Logf("victim: %v", err)
			case <-ctx.Done():
				t.Fatal("the deadlock was not broken")
			}
			if err := <-ea; err != nil {
				t.Fatalf("a: %v", err)
			}
			s, err := a.Query(ctx)
			if err != nil || len(s.Held)+len(s.Pending) != 0 {
				t.Fatalf("left behind: %+v %v", s, err)
			}
		})
	}
}

// TestDeadlockOneVictim: three Managers in one cycle check at the same
// moment (the victim pauses before it gives up, so that the others' rounds
// run meanwhile): exactly one of them gives up, and the others finish.
func TestDeadlockOneVictim(t *testing.T) {
	c := startCluster(t, 1)
	const delay = 60 * time.Millisecond
	testHookVictim.set(func() { time.Sleep(3 * delay) })
	t.Cleanup(func() { testHookVictim.set(nil) })
	ms := []*manager.Manager{openDL(t, c, delay), openDL(t, c, delay), openDL(t, c, delay)}
	ctx := ctxT(t, 30*time.Second)
	names := []string{"1-a", "1-b", "1-c"}
	holding := make(chan struct{}, 3)
	proceed := make(chan struct{})
	errs := make(chan error, 3)
	for i, m := range ms {
		go func() { errs <- cross(ctx, m, "request", names[i], names[(i+1)%3], holding, proceed) }()
	}
	for range ms {
		<-holding
	}
	close(proceed)
	var deadlocks int
	for range ms {
		select {
		case err := <-errs:
			switch {
			case errors.Is(err, manager.ErrDeadlock):
				deadlocks++
			case err != nil:
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("the deadlock was not broken")
		}
	}
	if deadlocks != 1 {
		t.Fatalf("%d victims for one cycle", deadlocks)
	}
}

// TestWaitGraphOnEtcd: who waits for whom, and a cycle that nobody breaks
// (both Managers have checks off) listed from its victim; a Manager with
// checks off is never chosen: the cycle stays until a ctx ends.
func TestWaitGraphOnEtcd(t *testing.T) {
	c := startCluster(t, 1)
	a, b := openDL(t, c, -1), openDL(t, c, -1)
	ctx := ctxT(t, 30*time.Second)
	g, err := a.WaitGraph(ctx)
	if err != nil || len(g.Waits) != 0 || len(g.Cycles) != 0 || g.Waits == nil || g.Cycles == nil {
		t.Fatalf("empty graph: %+v %v", g, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ha, hb := make(chan struct{}, 1), make(chan struct{}, 1)
	pa, pb := make(chan struct{}), make(chan struct{})
	ea, eb := make(chan error, 1), make(chan error, 1)
	go func() { ea <- cross(cctx, a, "request", "x", "y", ha, pa) }()
	go func() { eb <- cross(cctx, b, "request", "y", "x", hb, pb) }()
	<-ha
	<-hb
	close(pa)
	waitPending(t, ctx, a, 1)
	g, err = a.WaitGraph(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Waits) != 1 || g.Waits[0].Request.ClientID != a.ClientID() || g.Waits[0].Request.Name != "y" ||
		len(g.Waits[0].WaitsFor) != 1 || !g.Waits[0].WaitsFor[0].Held || g.Waits[0].WaitsFor[0].ClientID != b.ClientID() {
		t.Fatalf("a waits for b's hold of y: %+v", g.Waits)
	}
	if len(g.Cycles) != 0 {
		t.Fatalf("cycles before the cycle closed: %+v", g.Cycles)
	}
	close(pb)
	waitPending(t, ctx, a, 2)
	g, err = a.WaitGraph(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Cycles) != 1 || len(g.Cycles[0]) != 4 || g.Cycles[0][0].ClientID != b.ClientID() || g.Cycles[0][0].Held || g.Cycles[0][0].Name != "x" {
		t.Fatalf("one cycle from b's request of x: %+v", g.Cycles)
	}
	var ended atomic.Int32
	select {
	case err := <-ea:
		t.Fatalf("a ended with checks off: %v", err)
	case err := <-eb:
		t.Fatalf("b ended with checks off: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	cancel()
	for _, ch := range []chan error{ea, eb} {
		if err := <-ch; !errors.Is(err, manager.ErrAborted) {
			t.Fatalf("after cancel: %v", err)
		}
		ended.Add(1)
	}
}

// TestDeadlockLeaseLost: the lease of a member of a cycle ends while the
// victim is giving up (its round found the cycle; a's lease is revoked
// before the victim's withdrawal): the withdrawal's compare sees that the
// cycle no longer stands, so the victim does not give up: it is granted the
// name a's lease released. a learns that its lease ended (its waiting
// request fails with ErrSessionLost, its held lock is lost).
func TestDeadlockLeaseLost(t *testing.T) {
	c := startCluster(t, 1)
	const delay = 100 * time.Millisecond
	a, ab := openOn(t, c.client(t), "/dl", &Options{TTL: 5 * time.Second, DeadlockDelay: -1})
	b := openDL(t, c, delay)
	ctx := ctxT(t, 30*time.Second)
	var victims atomic.Int32
	testHookVictim.set(func() {
		if victims.Add(1) == 1 {
			revokeLease(t, ctx, c, ab)
		}
	})
	t.Cleanup(func() { testHookVictim.set(nil) })
	ha, hb := make(chan struct{}, 1), make(chan struct{}, 1)
	pa, pb := make(chan struct{}), make(chan struct{})
	ea, eb := make(chan error, 1), make(chan error, 1)
	go func() { ea <- cross(ctx, a, "request", "x", "y", ha, pa) }()
	go func() { eb <- cross(ctx, b, "request", "y", "x", hb, pb) }()
	<-ha
	<-hb
	close(pa)
	waitPending(t, ctx, b, 1)
	close(pb)
	select {
	case err := <-eb:
		if err != nil {
			t.Fatalf("b: %v, want granted x once a's lease ended", err)
		}
	case <-ctx.Done():
		t.Fatal("b not granted")
	}
	if victims.Load() == 0 {
		t.Fatal("no deadlock round found the cycle")
	}
	select {
	case err := <-ea:
		if !errors.Is(err, ErrSessionLost) {
			t.Fatalf("a: %v, want ErrSessionLost", err)
		}
	case <-ctx.Done():
		t.Fatal("a not told that its lease ended")
	}
}
