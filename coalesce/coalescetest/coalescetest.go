// Package coalescetest is the test kit of package coalesce on every
// backend: it runs the same tests on the table (coalesce's own tests) and
// on a backend with a record store (etcd's tests, on an embedded cluster),
// as manager/managertest does for the manager contract.
//
//	func TestCoalesceKit(t *testing.T) {
//		path := managertest.TablePath(t)
//		coalescetest.Run(t, coalescetest.Bucket{Open: func(t *testing.T) *manager.Manager {
//			return managertest.Open(t, path, nil)
//		}})
//	}
//
// Every Manager Open returns is an agent of one bucket (on etcd, one with
// a client of its own: a machine); the tests use keys of their own, so the
// bucket may hold other locks and records. Waits are bounded by
// managertest.Eventually.
package coalescetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/coalesce"
	"github.com/shmlocks/shmlocks/coalesce/internal/members"
	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/manager/managertest"
)

// Bucket is the bucket under test.
type Bucket struct {
	// Open returns a new Manager of the bucket, closed at t's cleanup.
	Open func(t *testing.T) *manager.Manager
	// Cut, when not nil, takes every grant of m away as the death of its
	// process or its being cut off would (etcd: its lease revoked); m
	// stays usable. Without it, LeaderCut is skipped (on the table, a
	// leader dies with its process: coalesce's multi-process tests).
	Cut func(t *testing.T, m *manager.Manager)
}

// Run runs every test of the kit as a subtest of t.
func Run(t *testing.T, b Bucket) {
	tests := []struct {
		name string
		fn   func(*testing.T, Bucket)
	}{
		{"OneFlightAcrossManagers", testOneFlight},
		{"ErrorShared", testErrorShared},
		{"ResultTooLarge", testTooLarge},
		{"LeaderCtxHandover", testLeaderCtx},
		{"LeaderCut", testLeaderCut},
		{"DoWithin", testDoWithin},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, b) })
	}
}

// Result is the outcome of a Do made by DoAsync.
type Result struct {
	Res    []byte
	Shared bool
	Err    error
}

// DoAsync calls coalesce.New(m).Do in a goroutine; its outcome comes on
// the channel.
func DoAsync(ctx context.Context, m *manager.Manager, key string, fn func(context.Context) ([]byte, error)) <-chan Result {
	ch := make(chan Result, 1)
	go func() {
		r, s, err := coalesce.New(m).Do(ctx, key, fn)
		ch <- Result{r, s, err}
	}()
	return ch
}

// Recv waits up to managertest.Eventually for the outcome on ch.
func Recv(t testing.TB, ch <-chan Result, what string) Result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(managertest.Eventually):
		t.Fatalf("%s: Do did not return within %v", what, managertest.Eventually)
	}
	return Result{}
}

// WaitMembers waits up to managertest.Eventually until n callers wait in
// m's flight on key (besides the one running fn, if m leads).
func WaitMembers(t testing.TB, m *manager.Manager, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(managertest.Eventually)
	for members.Count(m, key) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d callers in the flight on %q, want %d", members.Count(m, key), key, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// WaitPilots waits until k Managers other than the leader's queue for
// key's flight lock (each Manager's callers share one pilot).
func WaitPilots(t testing.TB, m *manager.Manager, key string, k int) {
	t.Helper()
	managertest.WaitPending(t, m, "-c:"+key, k)
}

// mustNotRun is the fn of a caller that must be a follower.
func mustNotRun(t testing.TB, what string) func(context.Context) ([]byte, error) {
	return func(context.Context) ([]byte, error) {
		t.Errorf("%s: fn ran", what)
		return nil, errors.New("must not run")
	}
}

// gated is a leader's fn: it signals started, waits for the gate (or its
// ctx) and returns res, err; runs counts its runs.
type gated struct {
	started, gate chan struct{}
	runs          atomic.Int32
}

func newGated() *gated { return &gated{started: make(chan struct{}), gate: make(chan struct{})} }

func (g *gated) fn(res []byte, err error) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		if g.runs.Add(1) == 1 {
			close(g.started)
		}
		select {
		case <-g.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return res, err
	}
}

func (g *gated) waitStarted(t testing.TB) {
	t.Helper()
	select {
	case <-g.started:
	case <-time.After(managertest.Eventually):
		t.Fatal("the leader's fn did not start")
	}
}

// followers starts n callers of key on each of ms (all followers: fn must
// not run) and waits until they wait in their Managers' flights and each
// Manager's pilot is queued behind the leader, whose Manager is lm.
func followers(t *testing.T, ctx context.Context, lm *manager.Manager, key string, n int, ms ...*manager.Manager) [][]<-chan Result {
	t.Helper()
	out := make([][]<-chan Result, len(ms))
	for i, m := range ms {
		for j := 0; j < n; j++ {
			out[i] = append(out[i], DoAsync(ctx, m, key, mustNotRun(t, fmt.Sprintf("follower %d.%d", i, j))))
		}
	}
	pilots := 0
	for _, m := range ms {
		WaitMembers(t, m, key, n)
		if m != lm {
			pilots++
		}
	}
	WaitPilots(t, lm, key, pilots)
	return out
}

// One flight per key across Managers: the leader's fn blocks; 4 callers on
// each of 3 Managers (the leader's included) join; every caller gets the
// leader's bytes, fn ran once. Over, the next caller runs fn again
// (nothing cached).
func testOneFlight(t *testing.T, b Bucket) {
	ms := []*manager.Manager{b.Open(t), b.Open(t), b.Open(t)}
	ctx := managertest.Context(t, 2*managertest.Eventually)
	key := "one"
	g := newGated()
	lead := DoAsync(ctx, ms[0], key, g.fn([]byte("v1"), nil))
	g.waitStarted(t)
	fs := followers(t, ctx, ms[0], key, 4, ms...)
	close(g.gate)
	if r := Recv(t, lead, "leader"); r.Err != nil || r.Shared || string(r.Res) != "v1" {
		t.Fatalf("leader: %q shared=%v err=%v", r.Res, r.Shared, r.Err)
	}
	for i, chs := range fs {
		for j, ch := range chs {
			r := Recv(t, ch, "follower")
			if r.Err != nil || !r.Shared || string(r.Res) != "v1" {
				t.Fatalf("follower %d.%d: %q shared=%v err=%v", i, j, r.Res, r.Shared, r.Err)
			}
		}
	}
	if n := g.runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	if err := coalesce.New(ms[2]).Check(); err != nil {
		t.Fatalf("Check of the outcome records: %v", err)
	}
	r, shared, err := coalesce.New(ms[1]).Do(ctx, key, func(context.Context) ([]byte, error) { return []byte("v2"), nil })
	if err != nil || shared || string(r) != "v2" {
		t.Fatalf("a caller after the flight: %q shared=%v err=%v, want its own run", r, shared, err)
	}
}

// The leader's error: its own Manager's followers get the error value, the
// other Managers' ErrLeaderFailed with its text.
func testErrorShared(t *testing.T, b Bucket) {
	ms := []*manager.Manager{b.Open(t), b.Open(t)}
	ctx := managertest.Context(t, 2*managertest.Eventually)
	key := "err"
	boom := errors.New("boom")
	g := newGated()
	lead := DoAsync(ctx, ms[0], key, g.fn(nil, boom))
	g.waitStarted(t)
	fs := followers(t, ctx, ms[0], key, 2, ms...)
	close(g.gate)
	if r := Recv(t, lead, "leader"); r.Err != boom || r.Shared {
		t.Fatalf("leader: shared=%v err=%v, want its own error", r.Shared, r.Err)
	}
	for _, ch := range fs[0] {
		if r := Recv(t, ch, "local follower"); r.Err != boom || !r.Shared {
			t.Fatalf("follower of the leader's Manager: shared=%v err=%v, want the error value", r.Shared, r.Err)
		}
	}
	for _, ch := range fs[1] {
		r := Recv(t, ch, "other follower")
		if !errors.Is(r.Err, coalesce.ErrLeaderFailed) || !strings.Contains(r.Err.Error(), "boom") || !r.Shared {
			t.Fatalf("follower of another Manager: shared=%v err=%v, want ErrLeaderFailed with the text", r.Shared, r.Err)
		}
	}
}

// A result longer than MaxResultSize is ErrResultTooLarge for the leader
// and every follower, never a truncation.
func testTooLarge(t *testing.T, b Bucket) {
	ms := []*manager.Manager{b.Open(t), b.Open(t)}
	ctx := managertest.Context(t, 2*managertest.Eventually)
	key := "big"
	g := newGated()
	lead := DoAsync(ctx, ms[0], key, g.fn(make([]byte, coalesce.MaxResultSize+1), nil))
	g.waitStarted(t)
	fs := followers(t, ctx, ms[0], key, 1, ms...)
	close(g.gate)
	all := append([]<-chan Result{lead}, fs[0]...)
	all = append(all, fs[1]...)
	for i, ch := range all {
		r := Recv(t, ch, "caller")
		if !errors.Is(r.Err, coalesce.ErrResultTooLarge) || r.Res != nil {
			t.Fatalf("caller %d: %d bytes, err=%v, want ErrResultTooLarge and no bytes", i, len(r.Res), r.Err)
		}
	}
}

// The leader's ctx ends and its fn fails: the first queued Manager's
// caller leads with its own fn, the other Manager's follower gets that
// result, the leader ErrAborted.
func testLeaderCtx(t *testing.T, b Bucket) {
	ms := []*manager.Manager{b.Open(t), b.Open(t), b.Open(t)}
	ctx := managertest.Context(t, 2*managertest.Eventually)
	key := "handover"
	leadCtx, cancelLead := context.WithCancel(ctx)
	defer cancelLead()
	g := newGated()
	lead := DoAsync(leadCtx, ms[0], key, g.fn([]byte("first"), nil))
	g.waitStarted(t)
	var runs atomic.Int32
	next := DoAsync(ctx, ms[1], key, func(context.Context) ([]byte, error) {
		runs.Add(1)
		return []byte("second"), nil
	})
	WaitPilots(t, ms[0], key, 1)
	other := DoAsync(ctx, ms[2], key, mustNotRun(t, "the third Manager's caller"))
	WaitPilots(t, ms[0], key, 2)
	cancelLead()
	if r := Recv(t, lead, "leader"); !errors.Is(r.Err, manager.ErrAborted) {
		t.Fatalf("leader whose ctx ended: err=%v, want ErrAborted", r.Err)
	}
	if r := Recv(t, next, "next"); r.Err != nil || r.Shared || string(r.Res) != "second" {
		t.Fatalf("the next Manager's caller: %q shared=%v err=%v, want to lead", r.Res, r.Shared, r.Err)
	}
	if r := Recv(t, other, "other"); r.Err != nil || !r.Shared || string(r.Res) != "second" {
		t.Fatalf("the third Manager's caller: %q shared=%v err=%v, want the new leader's result", r.Res, r.Shared, r.Err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the new leader's fn ran %d times", n)
	}
}

// The leader's grants are taken away while its fn runs (etcd: its lease
// revoked): a waiting caller of another Manager leads, the followers get
// its complete result; the cut leader's late outcome is never published
// (a DoWithin afterwards finds the new leader's).
func testLeaderCut(t *testing.T, b Bucket) {
	if b.Cut == nil {
		t.Skip("the bucket has no Cut")
	}
	ms := []*manager.Manager{b.Open(t), b.Open(t), b.Open(t)}
	ctx := managertest.Context(t, 2*managertest.Eventually)
	key := "cut"
	g := newGated()
	lead := DoAsync(ctx, ms[0], key, g.fn([]byte("stale"), nil))
	g.waitStarted(t)
	var runs atomic.Int32
	next := DoAsync(ctx, ms[1], key, func(context.Context) ([]byte, error) {
		runs.Add(1)
		return []byte("second"), nil
	})
	WaitPilots(t, ms[0], key, 1)
	others := []<-chan Result{
		DoAsync(ctx, ms[2], key, mustNotRun(t, "the third Manager's caller")),
		DoAsync(ctx, ms[2], key, mustNotRun(t, "the third Manager's caller")),
	}
	WaitMembers(t, ms[2], key, 2)
	WaitPilots(t, ms[1], key, 2)
	b.Cut(t, ms[0])
	if r := Recv(t, next, "next"); r.Err != nil || r.Shared || string(r.Res) != "second" {
		t.Fatalf("the next Manager's caller: %q shared=%v err=%v, want to lead", r.Res, r.Shared, r.Err)
	}
	for _, ch := range others {
		if r := Recv(t, ch, "other"); r.Err != nil || !r.Shared || string(r.Res) != "second" {
			t.Fatalf("the third Manager's caller: %q shared=%v err=%v, want the new leader's result", r.Res, r.Shared, r.Err)
		}
	}
	close(g.gate)
	Recv(t, lead, "the cut leader") // its own fn's result or an error: it was cut off
	r, shared, err := coalesce.New(ms[2]).DoWithin(ctx, key, time.Hour, mustNotRun(t, "DoWithin"))
	if err != nil || !shared || string(r) != "second" {
		t.Fatalf("DoWithin after the cut leader returned: %q shared=%v err=%v, want the new leader's outcome", r, shared, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the new leader's fn ran %d times", n)
	}
}

// DoWithin accepts an outcome of any Manager published at most maxAge ago,
// without a flight; an older one is not accepted; errors never are.
func testDoWithin(t *testing.T, b Bucket) {
	ms := []*manager.Manager{b.Open(t), b.Open(t)}
	ctx := managertest.Context(t, 2*managertest.Eventually)
	key := "within"
	r, _, err := coalesce.New(ms[0]).Do(ctx, key, func(context.Context) ([]byte, error) { return []byte("v1"), nil })
	if err != nil || string(r) != "v1" {
		t.Fatalf("first flight: %q %v", r, err)
	}
	r, shared, err := coalesce.New(ms[1]).DoWithin(ctx, key, time.Hour, mustNotRun(t, "DoWithin(1h)"))
	if err != nil || !shared || string(r) != "v1" {
		t.Fatalf("DoWithin(1h): %q shared=%v err=%v, want the published v1", r, shared, err)
	}
	r, shared, err = coalesce.New(ms[1]).DoWithin(ctx, key, time.Nanosecond, func(context.Context) ([]byte, error) { return []byte("v2"), nil })
	if err != nil || shared || string(r) != "v2" {
		t.Fatalf("DoWithin(1ns): %q shared=%v err=%v, want its own run", r, shared, err)
	}
	boom := errors.New("boom")
	if _, _, err := coalesce.New(ms[0]).Do(ctx, key, func(context.Context) ([]byte, error) { return nil, boom }); err != boom {
		t.Fatalf("failing flight: %v", err)
	}
	r, shared, err = coalesce.New(ms[1]).DoWithin(ctx, key, time.Hour, func(context.Context) ([]byte, error) { return []byte("v3"), nil })
	if err != nil || shared || string(r) != "v3" {
		t.Fatalf("DoWithin(1h) after an error: %q shared=%v err=%v, want its own run (errors are never reused)", r, shared, err)
	}
}
