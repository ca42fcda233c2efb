package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

// waitState polls State (a test's bounded wait, not the product's) until
// ok says yes.
func waitState(t *testing.T, ctx context.Context, m *manager.Manager, name string, ok func(manager.NameState) bool) manager.NameState {
	t.Helper()
	for {
		st, err := m.State(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if ok(st) {
			return st
		}
		select {
		case <-ctx.Done():
			t.Fatalf("state of %q never as wanted; last %+v", name, st)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// TestStateOnEtcd: holders with their tokens, pending requests in queue
// order with the time they were made, and the watchers of the name.
func TestStateOnEtcd(t *testing.T) {
	c := startCluster(t, 1)
	a, _ := openB(t, c, 5*time.Second)
	b, _ := openB(t, c, 5*time.Second)
	ctx := ctxT(t, 30*time.Second)
	st, err := a.State(ctx, "n")
	if err != nil || len(st.Held)+len(st.Pending)+st.Watchers != 0 || st.Held == nil || st.Pending == nil {
		t.Fatalf("state of a free name: %+v, %v", st, err)
	}
	h, err := a.Acquire(ctx, "n", manager.RequestOptions{Mode: manager.Shared})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	go b.Acquire(ctx, "n", manager.RequestOptions{})
	waitPending(t, ctx, a, 1)
	go a.Acquire(ctx, "n", manager.RequestOptions{Mode: manager.Shared})
	waitPending(t, ctx, a, 2)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	if _, err := b.Watch(wctx, "n"); err != nil {
		t.Fatal(err)
	}
	st, err = a.State(ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Held) != 1 || st.Held[0].ClientID != a.ClientID() || st.Held[0].Token != h.Token() || st.Held[0].Mode != manager.Shared {
		t.Fatalf("held %+v, want a's shared grant with token %d", st.Held, h.Token())
	}
	if len(st.Pending) != 2 || st.Pending[0].ClientID != b.ClientID() || st.Pending[0].Mode != manager.Exclusive ||
		st.Pending[1].ClientID != a.ClientID() || st.Pending[1].Mode != manager.Shared {
		t.Fatalf("pending %+v, want b exclusive then a shared", st.Pending)
	}
	for _, p := range st.Pending {
		if p.Token != 0 || p.Since.Before(before.Add(-time.Minute)) || p.Since.After(time.Now().Add(time.Minute)) {
			t.Fatalf("pending %+v: token or since", p)
		}
	}
	if st.Watchers != 1 {
		t.Fatalf("watchers %d, want 1", st.Watchers)
	}
	if _, err := a.State(ctx, "-x"); !errors.Is(err, manager.ErrNotSupported) {
		t.Fatalf("State of a bad name: %v", err)
	}
	wcancel()
	waitState(t, ctx, a, "n", func(st manager.NameState) bool { return st.Watchers == 0 })
}

// TestWaitUnlockedOnEtcd: WaitUnlocked returns at once when the name is
// free for the mode, otherwise it waits, woken by the release only: its
// client makes no read while it waits. Its watcher key is gone after.
func TestWaitUnlockedOnEtcd(t *testing.T) {
	c := startCluster(t, 1)
	a, _ := openB(t, c, 5*time.Second)
	cli := c.client(t)
	fkv := newFaultKV(cli)
	b, bb := openOn(t, cli, "/faults", nil)
	ctx := ctxT(t, 30*time.Second)
	if err := b.WaitUnlocked(ctx, "n", manager.Exclusive); err != nil {
		t.Fatal(err)
	}
	h, err := a.Acquire(ctx, "n", manager.RequestOptions{Mode: manager.Shared})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WaitUnlocked(ctx, "n", manager.Shared); err != nil {
		t.Fatalf("shared WaitUnlocked on a shared hold: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- b.WaitUnlocked(ctx, "n", manager.Exclusive) }()
	waitState(t, ctx, a, "n", func(st manager.NameState) bool { return st.Watchers == 1 })
	reads := fkv.reads.Load()
	select {
	case err := <-done:
		t.Fatalf("WaitUnlocked returned while the name is held: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if n := fkv.reads.Load() - reads; n != 0 {
		t.Fatalf("%d reads while waiting: polling", n)
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("WaitUnlocked not woken by the release")
	}
	// Its watcher key goes in the background, after it returned.
	waitState(t, ctx, a, "n", func(st manager.NameState) bool { return st.Watchers == 0 })
	if n := fkv.reads.Load() - reads; n != 1 { // the deletion of its watcher key
		t.Fatalf("%d calls after the wake-up, want 1", n)
	}

	// ctx ends the wait; the lease's end too.
	h, err = a.Acquire(ctx, "n", manager.RequestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := b.WaitUnlocked(actx, "n", manager.Shared); !errors.Is(err, manager.ErrAborted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitUnlocked past its ctx: %v", err)
	}
	go func() { done <- b.WaitUnlocked(ctx, "n", manager.Shared) }()
	waitState(t, ctx, a, "n", func(st manager.NameState) bool { return st.Watchers == 1 })
	revokeLease(t, ctx, c, bb)
	select {
	case err := <-done:
		if !errors.Is(err, ErrSessionLost) {
			t.Fatalf("WaitUnlocked when its lease ended: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("WaitUnlocked not told that its lease ended")
	}
	h.Release()
}

// revokeLease revokes the current lease of b.
func revokeLease(t *testing.T, ctx context.Context, c *cluster, b *backend) {
	t.Helper()
	b.mu.Lock()
	s := b.sess
	b.mu.Unlock()
	if s == nil {
		t.Fatal("no lease")
	}
	if _, err := c.client(t).Revoke(ctx, s.Lease()); err != nil {
		t.Fatal(err)
	}
}

// collect receives states from ch until ok says yes.
func collect(t *testing.T, ctx context.Context, ch <-chan manager.NameState, what string, ok func(manager.NameState) bool) manager.NameState {
	t.Helper()
	for {
		select {
		case st, open := <-ch:
			if !open {
				t.Fatalf("%s: watch closed", what)
			}
			if ok(st) {
				return st
			}
		case <-ctx.Done():
			t.Fatalf("%s: not delivered", what)
		}
	}
}

func heldBy(m *manager.Manager, token uint64) func(manager.NameState) bool {
	return func(st manager.NameState) bool {
		return len(st.Held) == 1 && st.Held[0].ClientID == m.ClientID() && st.Held[0].Token == token
	}
}

func free(st manager.NameState) bool { return len(st.Held) == 0 && len(st.Pending) == 0 }

// TestWatchOnEtcd: the first state, then each change in order (each
// change waits until the previous one was delivered); a watch whose start
// revision was compacted away reads the name again and delivers the
// current state; the channel closes when ctx ends.
func TestWatchOnEtcd(t *testing.T) {
	c := startCluster(t, 1)
	admin := c.client(t)
	a, _ := openB(t, c, 5*time.Second)
	b, _ := openB(t, c, 5*time.Second)
	d, _ := openB(t, c, 5*time.Second)
	ctx := ctxT(t, 30*time.Second)
	var starts atomic.Int32
	var first *manager.Lock
	testHookFollow.set(func(base string, rev int64) {
		if starts.Add(1) != 1 {
			return
		}
		// A change the watch from rev+1 would have shown, then compacted away.
		l, err := a.Acquire(ctx, "n", manager.RequestOptions{})
		if err != nil {
			t.Error(err)
			return
		}
		first = l
		if err := compactPast(ctx, admin, base, rev); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() { testHookFollow.set(nil) })
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	ch, err := d.Watch(wctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	if st := <-ch; !free(st) || st.Watchers != 1 {
		t.Fatalf("first state %+v", st)
	}
	collect(t, ctx, ch, "the grant made before a compacted watch start", func(st manager.NameState) bool {
		return first != nil && heldBy(a, first.Token())(st)
	})
	for deadline := time.Now().Add(10 * time.Second); starts.Load() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) { // the follower delivers what it read, then watches again
			t.Fatalf("%d watch starts: the compacted one was not replaced", starts.Load())
		}
	}
	got := make(chan *manager.Lock, 1)
	go func() {
		l, err := b.Acquire(ctx, "n", manager.RequestOptions{})
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	collect(t, ctx, ch, "b queued", func(st manager.NameState) bool {
		return len(st.Pending) == 1 && st.Pending[0].ClientID == b.ClientID() && heldBy(a, first.Token())(st)
	})
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	l := <-got
	collect(t, ctx, ch, "b granted", heldBy(b, l.Token()))
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	collect(t, ctx, ch, "free again", free)
	wcancel()
	for range ch {
	}
	waitState(t, ctx, a, "n", func(st manager.NameState) bool { return st.Watchers == 0 })
}

// TestWatchReconnect: the watching client is cut off (a proxy) while the
// name changes several times and the cluster compacts past the changes;
// when the path is restored, the watch delivers the last state (the one
// the name is in), not a stale one, and goes on with the next changes.
func TestWatchReconnect(t *testing.T) {
	c := startCluster(t, 1)
	admin := c.client(t)
	p := newProxy(t, c.endpoints()[0])
	a, _ := openB(t, c, 5*time.Second)
	b, _ := openB(t, c, 5*time.Second)
	d, _ := openOn(t, clientOf(t, p.addr()), "/faults", &Options{TTL: 10 * time.Second})
	ctx := ctxT(t, 40*time.Second)
	var starts atomic.Int32
	testHookFollow.set(func(string, int64) { starts.Add(1) })
	t.Cleanup(func() { testHookFollow.set(nil) })
	ch, err := d.Watch(ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	collect(t, ctx, ch, "first", free)
	p.setCut(true)
	var last *manager.Lock
	for i := range 3 {
		m := []*manager.Manager{a, b}[i%2]
		l, err := m.Acquire(ctx, "n", manager.RequestOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if i < 2 {
			if err := l.Release(); err != nil {
				t.Fatal(err)
			}
		}
		last = l
	}
	if err := compactNow(ctx, admin); err != nil {
		t.Fatal(err)
	}
	p.setCut(false)
	collect(t, ctx, ch, fmt.Sprintf("the last state (held by a, token %d)", last.Token()), heldBy(a, last.Token()))
	// The follower delivers the state it read, then starts its next watch.
	for deadline := time.Now().Add(10 * time.Second); starts.Load() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d watch starts: the resumed watch was not refused as compacted", starts.Load())
		}
	}
	if err := last.Release(); err != nil {
		t.Fatal(err)
	}
	collect(t, ctx, ch, "free after the reconnect", free)
}
