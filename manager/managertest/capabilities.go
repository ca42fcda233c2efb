package managertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

// The v2/v3 capabilities: observing a name (State, WaitUnlocked, Watch),
// several names at once (AcquireAll), child grants through a ctx, and
// deadlocks between Managers (ErrDeadlock, WaitGraph).

// state returns m's State of n, failing the test on an error.
func state(t *testing.T, m *manager.Manager, n string) manager.NameState {
	t.Helper()
	st, err := m.State(context.Background(), n)
	if err != nil {
		t.Fatalf("state of %q: %v", n, err)
	}
	if st.Held == nil || st.Pending == nil {
		t.Fatalf("state of %q: nil lists in %+v", n, st)
	}
	return st
}

// waitState waits until m's State of n satisfies ok.
func waitState(t *testing.T, m *manager.Manager, n string, what string, ok func(manager.NameState) bool) manager.NameState {
	t.Helper()
	deadline := time.Now().Add(Eventually)
	for {
		st := state(t, m, n)
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("state of %q: %s not seen within %v; last %+v", n, what, Eventually, st)
		}
		time.Sleep(time.Millisecond)
	}
}

// testState: holders with their tokens, pending requests in queue order,
// the watchers of the name, validation.
func testState(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx := ctxT(t)
	n := name(t, "n")
	if st := state(t, a, n); len(st.Held)+len(st.Pending)+st.Watchers != 0 || st.Name != n {
		t.Fatalf("state of a free name: %+v", st)
	}
	h := mustAcquire(t, ctx, a, n, manager.RequestOptions{Mode: manager.Shared})
	wx := AcquireAsync(ctx, b, n, manager.RequestOptions{})
	WaitPending(t, a, n, 1)
	ws := AcquireAsync(ctx, a, n, manager.RequestOptions{Mode: manager.Shared})
	WaitPending(t, a, n, 2)
	st := state(t, b, n)
	if len(st.Held) != 1 || st.Held[0].ClientID != a.ClientID() || st.Held[0].Mode != manager.Shared || st.Held[0].Token != h.Token() {
		t.Fatalf("held %+v, want a's shared grant with token %d", st.Held, h.Token())
	}
	if len(st.Pending) != 2 || st.Pending[0].ClientID != b.ClientID() || st.Pending[0].Mode != manager.Exclusive ||
		st.Pending[1].ClientID != a.ClientID() || st.Pending[1].Mode != manager.Shared || st.Pending[0].Token != 0 {
		t.Fatalf("pending %+v, want b's exclusive then a's shared", st.Pending)
	}
	wctx, cancel := context.WithCancel(ctx)
	if _, err := b.Watch(wctx, n); err != nil {
		t.Fatal(err)
	}
	waitState(t, a, n, "one watcher", func(st manager.NameState) bool { return st.Watchers == 1 })
	cancel()
	waitState(t, a, n, "no watcher", func(st manager.NameState) bool { return st.Watchers == 0 })
	mustRelease(t, h)
	mustRelease(t, MustGrant(t, wx, "b's exclusive"))
	mustRelease(t, MustGrant(t, ws, "a's shared"))
	if _, err := a.State(ctx, "-bad"); !errors.Is(err, manager.ErrNotSupported) {
		t.Fatalf("State of a name starting with '-': %v", err)
	}
	done, cancel2 := context.WithCancel(ctx)
	cancel2()
	if _, err := a.State(done, n); !errors.Is(err, manager.ErrAborted) {
		t.Fatalf("State with a done ctx: %v", err)
	}
}

// testWaitUnlocked: nil at once when a request in the mode would be
// granted, else blocked until it would (woken by the release), nothing
// acquired; ctx ends it with ErrAborted, Close with ErrClosed.
func testWaitUnlocked(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx := ctxT(t)
	n := name(t, "n")
	if err := b.WaitUnlocked(ctx, n, manager.Exclusive); err != nil {
		t.Fatalf("free name: %v", err)
	}
	h := mustAcquire(t, ctx, a, n, manager.RequestOptions{Mode: manager.Shared})
	if err := b.WaitUnlocked(ctx, n, manager.Shared); err != nil {
		t.Fatalf("shared on a shared hold: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- b.WaitUnlocked(ctx, n, manager.Exclusive) }()
	select {
	case err := <-done:
		t.Fatalf("returned while held shared: %v", err)
	case <-time.After(QuietPeriod):
	}
	mustRelease(t, h)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(Eventually):
		t.Fatal("not woken by the release")
	}
	if held, pending := infos(t, a, n); len(held)+len(pending) != 0 {
		t.Fatalf("WaitUnlocked left something: held %+v pending %+v", held, pending)
	}
	// A queued request is in the way too, even when the name is free for its mode.
	h = mustAcquire(t, ctx, a, n, manager.RequestOptions{Mode: manager.Shared})
	wx := AcquireAsync(ctx, a, n, manager.RequestOptions{})
	WaitPending(t, a, n, 1)
	sctx, cancel := context.WithTimeout(ctx, QuietPeriod)
	defer cancel()
	if err := b.WaitUnlocked(sctx, n, manager.Shared); !errors.Is(err, manager.ErrAborted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("shared behind a queued exclusive: %v, want ErrAborted", err)
	}
	go func() { done <- b.WaitUnlocked(ctx, n, manager.Shared) }()
	waitState(t, a, n, "one watcher", func(st manager.NameState) bool { return st.Watchers == 1 })
	b.Close()
	select {
	case err := <-done:
		if !errors.Is(err, manager.ErrClosed) {
			t.Fatalf("WaitUnlocked when its Manager closed: %v", err)
		}
	case <-time.After(Eventually):
		t.Fatal("WaitUnlocked not ended by Close")
	}
	mustRelease(t, h)
	mustRelease(t, MustGrant(t, wx, "a's exclusive"))
}

// testWatch: the first state, then every change in order (each change
// made once the previous one was delivered), closed when ctx ends and
// when the Manager closes.
func testWatch(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b, w := open(t), open(t), open(t)
	ctx := ctxT(t)
	n := name(t, "n")
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := w.Watch(wctx, n)
	if err != nil {
		t.Fatal(err)
	}
	next := func(what string, ok func(manager.NameState) bool) manager.NameState {
		t.Helper()
		for {
			select {
			case st, open := <-ch:
				if !open {
					t.Fatalf("%s: the watch closed", what)
				}
				if ok(st) {
					return st
				}
			case <-time.After(Eventually):
				t.Fatalf("%s: not delivered within %v", what, Eventually)
			}
		}
	}
	heldBy := func(m *manager.Manager, l *manager.Lock, pending int) func(manager.NameState) bool {
		return func(st manager.NameState) bool {
			return len(st.Held) == 1 && st.Held[0].ClientID == m.ClientID() && st.Held[0].Token == l.Token() && len(st.Pending) == pending
		}
	}
	free := func(st manager.NameState) bool { return len(st.Held)+len(st.Pending) == 0 }
	if st := next("the first state", func(manager.NameState) bool { return true }); !free(st) || st.Name != n {
		t.Fatalf("first state %+v", st)
	}
	h := mustAcquire(t, ctx, a, n, manager.RequestOptions{})
	next("a's grant", heldBy(a, h, 0))
	wb := AcquireAsync(ctx, b, n, manager.RequestOptions{})
	next("b queued", heldBy(a, h, 1))
	mustRelease(t, h)
	lb := MustGrant(t, wb, "b")
	next("b granted", heldBy(b, lb, 0))
	mustRelease(t, lb)
	next("free again", free)
	cancel()
	deadline := time.After(Eventually)
	for open := true; open; {
		select {
		case _, open = <-ch:
		case <-deadline:
			t.Fatal("the watch not closed when its ctx ended")
		}
	}
	ch, err = w.Watch(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	<-ch
	w.Close()
	deadline = time.After(Eventually)
	for open := true; open; {
		select {
		case _, open = <-ch:
		case <-deadline:
			t.Fatal("the watch not closed when its Manager closed")
		}
	}
}

// testAcquireAll: every name or none, in byte order, one token each; with
// IfAvailable and one name not available, nothing is held; an AcquireAll
// whose ctx ends while it waits gives back what it had.
func testAcquireAll(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx := ctxT(t)
	x, y, z := name(t, "x"), name(t, "y"), name(t, "z")
	ls, err := a.AcquireAll(ctx, []string{z, x, y, x}, manager.RequestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 3 || ls[0].Name() != x || ls[1].Name() != y || ls[2].Name() != z {
		t.Fatalf("locks %v, want x, y, z once each", ls)
	}
	if err := manager.ReleaseAll(ls); err != nil {
		t.Fatal(err)
	}
	hy := mustAcquire(t, ctx, b, y, manager.RequestOptions{})
	if _, err := a.AcquireAll(ctx, []string{x, y}, manager.RequestOptions{IfAvailable: true}); !errors.Is(err, manager.ErrNotAvailable) {
		t.Fatalf("IfAvailable with y held: %v", err)
	}
	if held, _ := infos(t, a, x); len(held) != 0 {
		t.Fatalf("x held after a failed AcquireAll: %+v", held)
	}
	actx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() { _, err := a.AcquireAll(actx, []string{x, y}, manager.RequestOptions{}); res <- err }()
	WaitPending(t, b, y, 1)
	behind := AcquireAsync(ctx, b, x, manager.RequestOptions{})
	WaitPending(t, b, x, 1) // queued behind the AcquireAll's hold of x
	cancel()
	select {
	case err := <-res:
		if !errors.Is(err, manager.ErrAborted) {
			t.Fatalf("aborted AcquireAll: %v", err)
		}
	case <-time.After(Eventually):
		t.Fatal("AcquireAll not ended by its ctx")
	}
	mustRelease(t, MustGrant(t, behind, "the request behind the aborted AcquireAll's x"))
	mustRelease(t, hy)
}

// testChildGrants: a request made with the ctx of Request's fn (or
// WithLock) on the same name, in a mode the grant covers, is a child grant
// at once with the grant's token; one that needs an upgrade is
// ErrWouldDeadlock at once. (A ctx whose grant ended carries nothing, and
// children exclude each other: the v3 child-grant rules, tested with their
// implementation.)
func testChildGrants(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx := ctxT(t)
	n := name(t, "n")
	err := a.Request(ctx, n, manager.RequestOptions{}, func(fctx context.Context, l *manager.Lock) error {
		c, err := a.Acquire(fctx, n, manager.RequestOptions{Mode: manager.Shared})
		if err != nil {
			return err
		}
		if c.Token() != l.Token() {
			t.Errorf("child token %d, grant's %d", c.Token(), l.Token())
		}
		if err := c.Release(); err != nil {
			return err
		}
		c, err = a.Acquire(manager.WithLock(ctx, l), n, manager.RequestOptions{})
		if err != nil {
			return err
		}
		return c.Release()
	})
	if err != nil {
		t.Fatal(err)
	}
	err = a.Request(ctx, n, manager.RequestOptions{Mode: manager.Shared}, func(fctx context.Context, l *manager.Lock) error {
		_, err := a.Acquire(fctx, n, manager.RequestOptions{})
		return err
	})
	if !errors.Is(err, manager.ErrWouldDeadlock) {
		t.Fatalf("exclusive through a shared grant's ctx: %v", err)
	}
	h := mustAcquire(t, ctx, b, n, manager.RequestOptions{})
	MustBlock(t, AcquireAsync(ctx, a, n, manager.RequestOptions{}), "a's request without a carried grant")
	mustRelease(t, h)
}

// testDeadlock: a holds x and waits for y, b holds y and waits for x, each
// through Request's callback ctx: WaitGraph shows the cycle; the request
// that closed it (b's, made after a's) fails with ErrDeadlock; a is
// granted y once b's Request has released it.
func testDeadlock(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx := ctxT(t)
	x, y := name(t, "x"), name(t, "y")
	holding := make(chan struct{}, 2)
	proceedA, proceedB := make(chan struct{}), make(chan struct{})
	cross := func(m *manager.Manager, first, second string, proceed chan struct{}) error {
		return m.Request(ctx, first, manager.RequestOptions{}, func(fctx context.Context, _ *manager.Lock) error {
			holding <- struct{}{}
			select {
			case <-proceed:
			case <-fctx.Done():
				return fctx.Err()
			}
			l, err := m.Acquire(fctx, second, manager.RequestOptions{})
			if err != nil {
				return err
			}
			return l.Release()
		})
	}
	ea, eb := make(chan error, 1), make(chan error, 1)
	go func() { ea <- cross(a, x, y, proceedA) }()
	go func() { eb <- cross(b, y, x, proceedB) }()
	for range 2 {
		select {
		case <-holding:
		case <-time.After(Eventually):
			t.Fatal("x and y not held")
		}
	}
	close(proceedA)
	WaitPending(t, a, y, 1)
	g, err := a.WaitGraph(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, wi := range g.Waits {
		if wi.Request.Name == y && wi.Request.ClientID == a.ClientID() {
			found = len(wi.WaitsFor) == 1 && wi.WaitsFor[0].Held && wi.WaitsFor[0].ClientID == b.ClientID()
		}
	}
	if !found {
		t.Fatalf("WaitGraph does not show a waiting for b's hold of y: %+v", g.Waits)
	}
	close(proceedB)
	var errA, errB error
	for range 2 {
		select {
		case errA = <-ea:
			if errA != nil {
				t.Fatalf("a (not the victim): %v", errA)
			}
		case errB = <-eb:
			if !errors.Is(errB, manager.ErrDeadlock) {
				t.Fatalf("b (the request that closed the cycle): %v, want ErrDeadlock", errB)
			}
		case <-time.After(Eventually):
			t.Fatal("the deadlock was not broken")
		}
	}
}
