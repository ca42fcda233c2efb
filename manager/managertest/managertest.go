// Package managertest is the conformance suite of the manager contract
// (W3C Web Locks semantics), for every backend: the table file
// (manager.Open) and the backends made with manager.NewBackendManager,
// like testing/fstest for file systems.
//
//	func TestConformance(t *testing.T) {
//		path := filepath.Join(t.TempDir(), "locks.tbl")
//		managertest.Run(t, func(t *testing.T) *manager.Manager {
//			m, err := manager.Open(path, nil)
//			if err != nil {
//				t.Fatal(err)
//			}
//			t.Cleanup(func() { m.Close() })
//			return m
//		})
//	}
//
// open must return a new agent (Manager) of one bucket shared by all the
// calls of one Run, and close it at t's cleanup. The tests use names of
// their own, so the bucket may hold other locks; a backend that is not
// fast needs no special treatment: every "still blocked" check waits
// QuietPeriod and every "eventually" Eventually.
//
// The suite's helpers are the test kit of every package built on a
// Manager, the manager's own tests included (kit.go): a table for a test
// (TablePath, Open, Check), a request started in the background
// (AcquireAsync) and the bounded checks of its outcome (MustBlock,
// MustGrant, MustFail), and WaitPending.
package managertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

// Bounds of the suite's waits: a request must stay blocked for QuietPeriod
// to count as blocked, and anything expected must happen within Eventually.
var (
	QuietPeriod = 150 * time.Millisecond
	Eventually  = 10 * time.Second
)

// ArrivalOrder names the tests of the suite whose subject is strict
// arrival order between a request and requests made after it (Web Locks'
// FIFO, a table's default): a table created with manager.Bounded lets a
// request take a free name ahead of queued ones, so these fail there by
// design. Its queued requests still never overtake one another, which the
// other tests (FIFOPerRequest among them) check in both modes.
var ArrivalOrder = []string{"NoBargingPastQueue"}

// Run runs every conformance test as a subtest of t.
func Run(t *testing.T, open func(t *testing.T) *manager.Manager) { RunExcept(t, open, nil) }

// RunExcept is Run without the tests named in skip (reported as skipped),
// e.g. ArrivalOrder for a table of bounded fairness.
func RunExcept(t *testing.T, open func(t *testing.T) *manager.Manager, skip []string) {
	tests := []struct {
		name string
		fn   func(*testing.T, func(*testing.T) *manager.Manager)
	}{
		{"ExclusiveAcrossClients", testExclusive},
		{"SharedTogether", testSharedTogether},
		{"SharedNeverOvertakesExclusive", testSharedAfterQueuedExclusive},
		{"FIFOPerRequest", testFIFO},
		{"NoBargingPastQueue", testNoBargingPastQueue},
		{"AbortHeadLetsSharedIn", testAbortHead},
		{"AbortLeavesNothing", testAbortLeavesNothing},
		{"IfAvailable", testIfAvailable},
		{"Steal", testSteal},
		{"RequestContextCancelledOnSteal", testRequestStolen},
		{"QueryOrderAndClients", testQuery},
		{"TokensIncrease", testTokens},
		{"ValidationOrder", testValidation},
		{"ReleaseTwice", testReleaseTwice},
		{"Close", testClose},
		// capabilities.go
		{"State", testState},
		{"WaitUnlocked", testWaitUnlocked},
		{"Watch", testWatch},
		{"AcquireAll", testAcquireAll},
		{"ChildGrants", testChildGrants},
		{"Deadlock", testDeadlock},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if slices.Contains(skip, tc.name) {
				t.Skip("excluded by the caller (e.g. ArrivalOrder on a table of bounded fairness)")
			}
			tc.fn(t, open)
		})
	}
}

func testExclusive(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx, n := ctxT(t), name(t, "x")
	l := mustAcquire(t, ctx, a, n, manager.RequestOptions{})
	if l.Name() != n || l.Mode() != manager.Exclusive {
		t.Fatalf("lock says %q %v", l.Name(), l.Mode())
	}
	ch := AcquireAsync(ctx, b, n, manager.RequestOptions{})
	MustBlock(t, ch, "exclusive of another client while held")
	ch2 := AcquireAsync(ctx, a, n, manager.RequestOptions{})
	WaitPending(t, a, n, 2)
	MustBlock(t, ch2, "exclusive of the same client while held (one key per request)")
	mustRelease(t, l)
	l2 := MustGrant(t, ch, "first waiter after release")
	MustBlock(t, ch2, "second waiter while the first holds")
	if l2.Token() <= l.Token() {
		t.Fatalf("token %d after %d", l2.Token(), l.Token())
	}
	mustRelease(t, l2)
	mustRelease(t, MustGrant(t, ch2, "second waiter"))
}

func testSharedTogether(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx, n := ctxT(t), name(t, "s")
	s1 := mustAcquire(t, ctx, a, n, manager.RequestOptions{Mode: manager.Shared})
	s2 := mustAcquire(t, ctx, b, n, manager.RequestOptions{Mode: manager.Shared})
	if s1.Token() == s2.Token() {
		t.Fatalf("two grants share token %d", s1.Token())
	}
	x := AcquireAsync(ctx, a, n, manager.RequestOptions{})
	MustBlock(t, x, "exclusive while shared held")
	mustRelease(t, s1)
	MustBlock(t, x, "exclusive while one shared holder remains")
	mustRelease(t, s2)
	mustRelease(t, MustGrant(t, x, "exclusive after the shared holders"))
}

func testSharedAfterQueuedExclusive(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx, n := ctxT(t), name(t, "r")
	s1 := mustAcquire(t, ctx, a, n, manager.RequestOptions{Mode: manager.Shared})
	x := AcquireAsync(ctx, b, n, manager.RequestOptions{})
	WaitPending(t, a, n, 1)
	s2 := AcquireAsync(ctx, a, n, manager.RequestOptions{Mode: manager.Shared})
	WaitPending(t, a, n, 2)
	MustBlock(t, s2, "shared behind a queued exclusive")
	mustRelease(t, s1)
	xl := MustGrant(t, x, "exclusive")
	MustBlock(t, s2, "shared while exclusive held")
	mustRelease(t, xl)
	mustRelease(t, MustGrant(t, s2, "shared after the exclusive"))
}

func testFIFO(t *testing.T, open func(*testing.T) *manager.Manager) {
	ms := []*manager.Manager{open(t), open(t)}
	ctx, n := ctxT(t), name(t, "q")
	h := mustAcquire(t, ctx, ms[0], n, manager.RequestOptions{})
	const k = 6
	var chs []<-chan Result
	for i := 0; i < k; i++ {
		mode := manager.Exclusive
		if i%3 == 2 {
			mode = manager.Shared
		}
		chs = append(chs, AcquireAsync(ctx, ms[i%2], n, manager.RequestOptions{Mode: mode}))
		WaitPending(t, ms[0], n, i+1) // queued in this order
	}
	// On a table of bounded fairness, strict order holds for heads that
	// waited the bound (a release could otherwise grant its process's own
	// aging request ahead of an older head of another process).
	WaitBound(ms[0])
	mustRelease(t, h)
	last := h.Token()
	for i, ch := range chs {
		l := MustGrant(t, ch, fmt.Sprintf("request %d", i))
		for _, later := range chs[i+1:] {
			select {
			case r := <-later:
				t.Fatalf("a later request was granted before request %d was released (err %v)", i, r.Err)
			default:
			}
		}
		if l.Token() <= last {
			t.Fatalf("request %d: token %d after %d", i, l.Token(), last)
		}
		last = l.Token()
		mustRelease(t, l)
	}
}

// testNoBargingPastQueue: a release hands the name to the request queued
// for it: a request of another client made right after the release finds
// it taken (IfAvailable: not available) rather than going first.
func testNoBargingPastQueue(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b, c := open(t), open(t), open(t)
	ctx, n := ctxT(t), name(t, "b")
	l := mustAcquire(t, ctx, a, n, manager.RequestOptions{})
	x := AcquireAsync(ctx, b, n, manager.RequestOptions{})
	WaitPending(t, a, n, 1)
	mustRelease(t, l)
	if l, err := c.Acquire(ctx, n, manager.RequestOptions{IfAvailable: true}); !errors.Is(err, manager.ErrNotAvailable) {
		if l != nil {
			l.Release()
		}
		t.Fatalf("a request made after the release went ahead of the queued one: %v", err)
	}
	mustRelease(t, MustGrant(t, x, "the queued request"))
}

func testAbortHead(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx, n := ctxT(t), name(t, "r")
	s1 := mustAcquire(t, ctx, a, n, manager.RequestOptions{Mode: manager.Shared})
	xctx, cancel := context.WithCancel(ctx)
	x := AcquireAsync(xctx, b, n, manager.RequestOptions{})
	WaitPending(t, a, n, 1)
	s2 := AcquireAsync(ctx, b, n, manager.RequestOptions{Mode: manager.Shared})
	s3 := AcquireAsync(ctx, a, n, manager.RequestOptions{Mode: manager.Shared})
	WaitPending(t, a, n, 3)
	MustBlock(t, s2, "shared behind exclusive")
	cancel()
	err := MustFail(t, x, manager.ErrAborted, "aborted exclusive")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("abort error %v does not match context.Canceled", err)
	}
	l2 := MustGrant(t, s2, "s2 after the abort")
	l3 := MustGrant(t, s3, "s3 after the abort")
	for _, l := range []*manager.Lock{s1, l2, l3} {
		mustRelease(t, l)
	}
}

func testAbortLeavesNothing(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx, n := ctxT(t), name(t, "a")
	h := mustAcquire(t, ctx, a, n, manager.RequestOptions{})
	wctx, cancel := context.WithTimeout(ctx, QuietPeriod)
	defer cancel()
	_, err := b.Acquire(wctx, n, manager.RequestOptions{})
	if !errors.Is(err, manager.ErrAborted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline while waiting: %v", err)
	}
	WaitPending(t, a, n, 0)
	mustRelease(t, h)
	mustRelease(t, mustAcquire(t, ctx, b, n, manager.RequestOptions{IfAvailable: true}))
}

func testIfAvailable(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx, n := ctxT(t), name(t, "n")
	l := mustAcquire(t, ctx, a, n, manager.RequestOptions{IfAvailable: true})
	_, err := b.Acquire(ctx, n, manager.RequestOptions{IfAvailable: true})
	if !errors.Is(err, manager.ErrNotAvailable) {
		t.Fatalf("exclusive IfAvailable while held: %v", err)
	}
	ran := false
	err = b.Request(ctx, n, manager.RequestOptions{IfAvailable: true, Mode: manager.Shared}, func(ctx context.Context, l *manager.Lock) error {
		ran = true
		if l != nil {
			t.Error("Request IfAvailable ran with a lock")
		}
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("Request IfAvailable: ran %v, err %v", ran, err)
	}
	if _, p := infos(t, a, n); len(p) != 0 {
		t.Fatalf("a request that was not available left %+v", p)
	}
	mustRelease(t, l)
	s1 := mustAcquire(t, ctx, a, n, manager.RequestOptions{Mode: manager.Shared})
	s2 := mustAcquire(t, ctx, b, n, manager.RequestOptions{Mode: manager.Shared, IfAvailable: true})
	x := AcquireAsync(ctx, a, n, manager.RequestOptions{})
	WaitPending(t, a, n, 1)
	_, err = b.Acquire(ctx, n, manager.RequestOptions{Mode: manager.Shared, IfAvailable: true})
	if !errors.Is(err, manager.ErrNotAvailable) {
		t.Fatalf("shared IfAvailable behind a queued exclusive: %v", err)
	}
	mustRelease(t, s1)
	mustRelease(t, s2)
	mustRelease(t, MustGrant(t, x, "exclusive"))
}

func testSteal(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b, c := open(t), open(t), open(t)
	ctx, n := ctxT(t), name(t, "n")
	l := mustAcquire(t, ctx, a, n, manager.RequestOptions{})
	lost := l.Lost()
	mustBeOpen(t, lost, "Lost of a held lock")
	waiting := AcquireAsync(ctx, b, n, manager.RequestOptions{})
	WaitPending(t, a, n, 1)
	st := mustAcquire(t, ctx, c, n, manager.RequestOptions{Steal: true})
	mustBeClosed(t, lost, "victim's Lost")
	if err := l.Release(); !errors.Is(err, manager.ErrStolen) {
		t.Fatalf("release of a stolen lock: %v", err)
	}
	if st.Token() <= l.Token() {
		t.Fatalf("stealer's token %d after %d", st.Token(), l.Token())
	}
	MustBlock(t, waiting, "request queued before the steal, while the stealer holds")
	if h, p := infos(t, a, n); len(h) != 1 || h[0].ClientID != c.ClientID() || len(p) != 1 || p[0].ClientID != b.ClientID() {
		t.Fatalf("after the steal: held %+v pending %+v", h, p)
	}
	mustRelease(t, st)
	w := MustGrant(t, waiting, "queued request after the stealer")
	if w.Token() <= st.Token() {
		t.Fatalf("token %d granted after the stealer's %d", w.Token(), st.Token())
	}
	mustRelease(t, w)
	next := mustAcquire(t, ctx, a, n, manager.RequestOptions{})
	if next.Token() <= w.Token() {
		t.Fatalf("token %d after %d", next.Token(), w.Token())
	}
	mustRelease(t, next)
}

func testRequestStolen(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx, n := ctxT(t), name(t, "n")
	in := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- a.Request(ctx, n, manager.RequestOptions{}, func(fctx context.Context, l *manager.Lock) error {
			close(in)
			select {
			case <-fctx.Done():
				if fctx.Err() == nil {
					return errors.New("Done closed with a nil Err")
				}
				return nil
			case <-time.After(Eventually):
				return errors.New("fn's ctx not cancelled by the steal")
			}
		})
	}()
	select {
	case <-in:
	case <-time.After(Eventually):
		t.Fatal("Request's fn did not run")
	}
	st := mustAcquire(t, ctx, b, n, manager.RequestOptions{Steal: true})
	select {
	case err := <-done:
		if !errors.Is(err, manager.ErrStolen) {
			t.Fatalf("Request after a steal: %v", err)
		}
	case <-time.After(Eventually + time.Second):
		t.Fatal("Request did not return")
	}
	mustRelease(t, st)
}

func testQuery(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	if a.ClientID() == "" || a.ClientID() == b.ClientID() {
		t.Fatalf("client ids %q %q", a.ClientID(), b.ClientID())
	}
	ctx, n := ctxT(t), name(t, "q")
	h := mustAcquire(t, ctx, a, n, manager.RequestOptions{Mode: manager.Shared})
	want := []struct {
		m    *manager.Manager
		mode manager.Mode
	}{{b, manager.Exclusive}, {a, manager.Shared}, {b, manager.Shared}, {a, manager.Exclusive}}
	var chs []<-chan Result
	for i, w := range want {
		chs = append(chs, AcquireAsync(ctx, w.m, n, manager.RequestOptions{Mode: w.mode}))
		WaitPending(t, b, n, i+1)
	}
	held, pending := infos(t, b, n)
	if len(held) != 1 || held[0].ClientID != a.ClientID() || held[0].Mode != manager.Shared || held[0].PID == 0 {
		t.Fatalf("held %+v", held)
	}
	for i, w := range want {
		if pending[i].ClientID != w.m.ClientID() || pending[i].Mode != w.mode || pending[i].PID == 0 {
			t.Fatalf("pending[%d] = %+v, want client %s mode %v (all: %+v)", i, pending[i], w.m.ClientID(), w.mode, pending)
		}
	}
	mustRelease(t, h)
	for i, ch := range chs {
		mustRelease(t, MustGrant(t, ch, fmt.Sprintf("request %d", i)))
	}
	if h, p := infos(t, a, n); len(h)+len(p) != 0 {
		t.Fatalf("left behind: held %+v pending %+v", h, p)
	}
}

func testTokens(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx, n := ctxT(t), name(t, "t")
	var last uint64
	for i := 0; i < 20; i++ {
		m := a
		if i%2 == 1 {
			m = b
		}
		o := manager.RequestOptions{}
		if i%5 == 4 {
			o.Steal = true
		}
		l := mustAcquire(t, ctx, m, n, o)
		if l.Token() <= last {
			t.Fatalf("grant %d: token %d after %d", i, l.Token(), last)
		}
		last = l.Token()
		mustRelease(t, l)
	}
}

func testValidation(t *testing.T, open func(*testing.T) *manager.Manager) {
	m := open(t)
	ctx, n := ctxT(t), name(t, "v")
	for _, c := range []struct {
		name string
		o    manager.RequestOptions
	}{
		{"-x", manager.RequestOptions{}},
		{n, manager.RequestOptions{Steal: true, IfAvailable: true}},
		{n, manager.RequestOptions{Steal: true, Mode: manager.Shared}},
		{n, manager.RequestOptions{Mode: 7}},
	} {
		if _, err := m.Acquire(ctx, c.name, c.o); !errors.Is(err, manager.ErrNotSupported) {
			t.Fatalf("Acquire(%q, %+v): %v, want ErrNotSupported", c.name, c.o, err)
		}
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	for _, o := range []manager.RequestOptions{{}, {IfAvailable: true}, {Steal: true}, {Mode: manager.Shared}} {
		_, err := m.Acquire(done, n, o)
		if !errors.Is(err, manager.ErrAborted) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire with a done ctx %+v: %v", o, err)
		}
	}
	if _, p := infos(t, m, n); len(p) != 0 {
		t.Fatalf("refused requests left %+v", p)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Acquire(done, "-x", manager.RequestOptions{}); !errors.Is(err, manager.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func testReleaseTwice(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx, n := ctxT(t), name(t, "r")
	l := mustAcquire(t, ctx, a, n, manager.RequestOptions{})
	mustRelease(t, l)
	l2 := mustAcquire(t, ctx, b, n, manager.RequestOptions{})
	if err := l.Release(); !errors.Is(err, manager.ErrReleased) {
		t.Fatalf("second Release: %v", err)
	}
	if h, _ := infos(t, a, n); len(h) != 1 || h[0].ClientID != b.ClientID() {
		t.Fatalf("a second Release touched another holder: %+v", h)
	}
	mustRelease(t, l2)
}

func testClose(t *testing.T, open func(*testing.T) *manager.Manager) {
	a, b := open(t), open(t)
	ctx, n, n2 := ctxT(t), name(t, "c"), name(t, "d")
	l := mustAcquire(t, ctx, a, n, manager.RequestOptions{})
	lost := l.Lost()
	other := mustAcquire(t, ctx, b, n2, manager.RequestOptions{})
	pend := AcquireAsync(ctx, a, n2, manager.RequestOptions{})
	waiter := AcquireAsync(ctx, b, n, manager.RequestOptions{})
	WaitPending(t, b, n, 1)
	WaitPending(t, b, n2, 1)
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	mustBeClosed(t, lost, "Lost of a lock released by Close")
	MustFail(t, pend, manager.ErrClosed, "pending request of a closed Manager")
	w := MustGrant(t, waiter, "waiter of another client after Close")
	if err := l.Release(); err == nil {
		t.Fatal("Release after Close returned nil")
	}
	if err := a.Close(); err != nil && !errors.Is(err, manager.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := a.Acquire(ctx, n, manager.RequestOptions{}); !errors.Is(err, manager.ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
	if _, err := a.Query(ctx); !errors.Is(err, manager.ErrClosed) {
		t.Fatalf("Query after Close: %v", err)
	}
	if h, p := infos(t, b, n2); len(h) != 1 || len(p) != 0 {
		t.Fatalf("after Close, %q: held %+v pending %+v", n2, h, p)
	}
	mustRelease(t, w)
	mustRelease(t, other)
}
