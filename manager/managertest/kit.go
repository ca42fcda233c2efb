package managertest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

// The test kit of the packages built on a Manager (and of the suite).

// SmallTable are the OpenOptions of a small table: quick to create, its
// limits within a test's reach.
var SmallTable = &manager.OpenOptions{MaxResources: 64, MaxRequests: 256, MaxAgents: 32, MaxNameLen: 64}

// TablePath is the path of a new table file in t's temporary directory.
func TablePath(t testing.TB) string { return filepath.Join(t.TempDir(), "locks.tbl") }

// Open opens a Manager on the table at path (opts nil: SmallTable), closed
// at t's cleanup.
func Open(t testing.TB, path string, opts *manager.OpenOptions) *manager.Manager {
	t.Helper()
	if opts == nil {
		opts = SmallTable
	}
	m, err := manager.Open(path, opts)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// Check runs the invariant checker of m's table.
func Check(t testing.TB, m *manager.Manager) {
	t.Helper()
	if err := m.Check(); err != nil {
		t.Fatalf("check: %v", err)
	}
}

// Context is a context that ends after d, or at t's cleanup.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Result is the outcome of a request made by AcquireAsync.
type Result struct {
	Lock *manager.Lock
	Err  error
}

// AcquireAsync makes the request in a goroutine; its outcome comes on the
// channel.
func AcquireAsync(ctx context.Context, m *manager.Manager, name string, o manager.RequestOptions) <-chan Result {
	ch := make(chan Result, 1)
	go func() {
		l, err := m.Acquire(ctx, name, o)
		ch <- Result{l, err}
	}()
	return ch
}

// MustBlock asserts that no outcome comes on ch during QuietPeriod.
func MustBlock(t testing.TB, ch <-chan Result, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: expected to stay blocked, got lock=%v err=%v", what, r.Lock != nil, r.Err)
	case <-time.After(QuietPeriod):
	}
}

// MustGrant waits up to Eventually for a grant on ch and returns its Lock.
func MustGrant(t testing.TB, ch <-chan Result, what string) *manager.Lock {
	t.Helper()
	select {
	case r := <-ch:
		if r.Err != nil || r.Lock == nil {
			t.Fatalf("%s: %v", what, r.Err)
		}
		return r.Lock
	case <-time.After(Eventually):
		t.Fatalf("%s: not granted within %v", what, Eventually)
	}
	return nil
}

// MustFail waits up to Eventually for an error matching target on ch and
// returns it.
func MustFail(t testing.TB, ch <-chan Result, target error, what string) error {
	t.Helper()
	select {
	case r := <-ch:
		if !errors.Is(r.Err, target) {
			t.Fatalf("%s: got lock=%v err=%v, want %v", what, r.Lock != nil, r.Err, target)
		}
		return r.Err
	case <-time.After(Eventually):
		t.Fatalf("%s: no result within %v", what, Eventually)
	}
	return nil
}

// WaitBound waits out m's fairness bound when it is shorter than
// QuietPeriod (a table of bounded fairness): the requests queued before the
// call have then waited the bound, so the releases that follow serve them in
// arrival order (no aging batch of the releasing process goes ahead of an
// older head). A longer bound is not reached within a test and leaves every
// freed name to its head, so there is nothing to wait for. The time waited
// is the condition itself, not a stand-in for an event.
func WaitBound(m *manager.Manager) {
	if d, bounded := m.Fairness().IsBounded(); bounded && d < QuietPeriod {
		time.Sleep(d)
	}
}

// WaitPending waits up to Eventually until m's Query shows k pending
// requests on n, and returns them.
func WaitPending(t testing.TB, m *manager.Manager, n string, k int) []manager.LockInfo {
	t.Helper()
	deadline := time.Now().Add(Eventually)
	for {
		_, p := infos(t, m, n)
		if len(p) == k {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pending on %q, want %d: %+v", len(p), n, k, p)
		}
		time.Sleep(time.Millisecond)
	}
}

// The suite's own helpers.

// name is a lock name of the running test, so that tests sharing a bucket
// never meet.
func name(t *testing.T, s string) string { return fmt.Sprintf("%s/%s", t.Name(), s) }

// ctxT bounds a test of the suite.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Eventually+5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustAcquire(t *testing.T, ctx context.Context, m *manager.Manager, name string, o manager.RequestOptions) *manager.Lock {
	t.Helper()
	l, err := m.Acquire(ctx, name, o)
	if err != nil {
		t.Fatalf("acquire %q %+v: %v", name, o, err)
	}
	return l
}

func mustRelease(t *testing.T, l *manager.Lock) {
	t.Helper()
	if err := l.Release(); err != nil {
		t.Fatalf("release %q: %v", l.Name(), err)
	}
}

func mustBeClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(Eventually):
		t.Fatalf("%s: not closed within %v", what, Eventually)
	}
}

func mustBeOpen(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
		t.Fatalf("%s: closed", what)
	default:
	}
}

// infos returns the held and pending requests on n in a snapshot.
func infos(t testing.TB, m *manager.Manager, n string) (held, pending []manager.LockInfo) {
	t.Helper()
	s, err := m.Query(context.Background())
	if err != nil {
		t.Fatalf("query: %v", err)
	}
	if s.Held == nil || s.Pending == nil {
		t.Fatalf("query: nil lists in %+v", s)
	}
	for _, li := range s.Held {
		if li.Name == n {
			held = append(held, li)
		}
	}
	for _, li := range s.Pending {
		if li.Name == n {
			pending = append(pending, li)
		}
	}
	return held, pending
}
