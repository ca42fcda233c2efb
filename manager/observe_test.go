package manager_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/table"

	. "github.com/shmlocks/shmlocks/manager"
)

// Observing a name (observe.go) with real processes: P is this test
// process, A, B and C children.

// waitUnlockedAsync starts a WaitUnlocked in a goroutine.
func waitUnlockedAsync(ctx context.Context, m *Manager, name string, mode Mode) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- m.WaitUnlocked(ctx, name, mode) }()
	return ch
}

// stillWaiting asserts that ch stays silent for the quiet period.
func stillWaiting(t *testing.T, ch <-chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s: expected WaitUnlocked to stay blocked, it returned %v", what, err)
	case <-time.After(quietPeriod):
	}
}

// unlocked waits (bounded) for a nil result on ch.
func unlocked(t *testing.T, ch <-chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		require.NoError(t, err, what)
	case <-time.After(eventually):
		t.Fatalf("%s: WaitUnlocked did not return within %v", what, eventually)
	}
}

// watchingCount waits until the table shows n watches.
func watchingCount(t *testing.T, m *Manager, n int) {
	t.Helper()
	deadline := time.Now().Add(eventually)
	for m.Table().Usage().Watching != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d watches in the table, want %d", m.Table().Usage().Watching, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// P1: A acquires x.     P2: P WaitUnlocked(x) — still blocked.
// P3: A releases x.     P4: P's WaitUnlocked returns; nothing of it remains.
func TestWaitUnlockedReturnsWhenAnotherProcessReleases(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	a := spawn(t, path, nil)
	a.Send("acquire x")
	tok := tokenOf(a.Expect("acquired x"))
	w := waitUnlockedAsync(ctxT(t, eventually), m, "x", Exclusive)
	stillWaiting(t, w, "x held by A")
	watchingCount(t, m, 1)
	check(t, m)
	st, err := m.State(context.Background(), "x")
	require.NoError(t, err)
	require.True(t, st.Locked())
	require.Equal(t, a.Pid, st.Held[0].PID)
	require.Equal(t, tok, st.Held[0].Token)
	require.Equal(t, 1, st.Watchers)
	a.Send("release x")
	a.Expect("released x")
	unlocked(t, w, "A released x")
	watchingCount(t, m, 0)
	check(t, m)
	// WaitUnlocked acquired nothing: the next grant has the next token.
	l, err := m.Acquire(ctxT(t, eventually), "x", RequestOptions{IfAvailable: true})
	require.NoError(t, err)
	require.Equal(t, tok+1, l.Token(), "WaitUnlocked consumed no token")
	require.NoError(t, l.Release())
	// A free name, and one never used: at once, without allocating an entry.
	require.NoError(t, m.WaitUnlocked(ctxT(t, eventually), "x", Exclusive))
	before := m.Table().Usage()
	require.NoError(t, m.WaitUnlocked(ctxT(t, eventually), "never-used", Shared))
	st, err = m.State(context.Background(), "never-used")
	require.NoError(t, err)
	require.False(t, st.Locked())
	require.True(t, st.Grantable(Exclusive))
	require.Equal(t, before, m.Table().Usage(), "looking at a name changes nothing")
}

// Shared: WaitUnlocked(shared) returns while shared holders remain, unless
// an exclusive request is queued ahead; a watch is not a request: others'
// IfAvailable requests are granted around it and tokens are untouched.
//
// P1: A holds x shared.          P2: P WaitUnlocked(x, shared) returns at once.
// P3: P WaitUnlocked(x, excl) blocks (watch E).
// P4: B IfAvailable shared: granted (E is not in the queue), token A+1.
// P5: C queues exclusive.        P6: P WaitUnlocked(x, shared) blocks (watch S).
// P7: A, B release: C granted; E and S still blocked.
// P8: C releases: E and S return.
func TestWaitUnlockedSharedRules(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	a, b, c := spawn(t, path, nil), spawn(t, path, nil), spawn(t, path, nil)
	ctx := ctxT(t, eventually)
	a.Send("acquire x shared")
	ta := tokenOf(a.Expect("acquired x"))
	require.NoError(t, m.WaitUnlocked(ctx, "x", Shared), "shared holders only: shared is grantable")
	e := waitUnlockedAsync(ctx, m, "x", Exclusive)
	stillWaiting(t, e, "exclusive while A holds shared")
	b.Send("acquire x shared ifavailable")
	tb := tokenOf(b.Expect("acquired x"))
	require.Equal(t, ta+1, tb, "the watch consumed no token and blocked no IfAvailable")
	c.Send("acquire x")
	waitPending(t, m, "x", 1)
	s := waitUnlockedAsync(ctx, m, "x", Shared)
	stillWaiting(t, s, "shared behind a queued exclusive request")
	a.Send("release x")
	a.Expect("released x")
	stillWaiting(t, e, "exclusive while B holds shared")
	b.Send("release x")
	b.Expect("released x")
	tc := tokenOf(c.Expect("acquired x"))
	require.Equal(t, tb+1, tc)
	stillWaiting(t, e, "exclusive while C holds")
	stillWaiting(t, s, "shared while C holds exclusive")
	check(t, m)
	c.Send("release x")
	c.Expect("released x")
	unlocked(t, e, "exclusive after C released")
	unlocked(t, s, "shared after C released")
	watchingCount(t, m, 0)
	check(t, m)
}

// A WaitUnlocked whose ctx ends leaves the table as it found it, and so
// does a dead watcher process once it is reaped.
func TestWaitUnlockedAbortAndDeadWatcher(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	l, err := m.Acquire(ctxT(t, eventually), "x", RequestOptions{})
	require.NoError(t, err)
	usage := func() table.Usage { u := m.Table().Usage(); u.Reaps, u.Repairs = 0, 0; return u }
	before := usage()
	st0, err := m.State(context.Background(), "x")
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = m.WaitUnlocked(ctx, "x", Exclusive)
	require.ErrorIs(t, err, ErrAborted)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, before, usage(), "an aborted WaitUnlocked leaves nothing")
	st1, err := m.State(context.Background(), "x")
	require.NoError(t, err)
	require.Equal(t, st0, st1)
	check(t, m)

	// Validation order: closed, name/mode, ctx.
	done, cancel2 := context.WithCancel(context.Background())
	cancel2()
	require.ErrorIs(t, m.WaitUnlocked(done, "-x", Exclusive), ErrNotSupported)
	require.ErrorIs(t, m.WaitUnlocked(done, "x", Mode(7)), ErrNotSupported)
	err = m.WaitUnlocked(done, "x", Exclusive)
	require.ErrorIs(t, err, ErrAborted)
	require.ErrorIs(t, err, context.Canceled)

	// A watcher process dies waiting: it is reaped, its watch with it.
	v := spawn(t, path, nil)
	v.Send("waitunlocked x")
	watchingCount(t, m, 1)
	v.Quiet("unlocked", quietPeriod)
	v.Kill()
	_, err = m.Query(context.Background()) // reaps the dead
	require.NoError(t, err)
	require.Equal(t, before, usage(), "the dead watcher's watch is gone")
	check(t, m)
	require.NoError(t, l.Release())
	check(t, m)

	// Closing the Manager ends its WaitUnlocked with ErrClosed.
	m2 := openM(t, path, nil)
	l, err = m.Acquire(ctxT(t, eventually), "x", RequestOptions{})
	require.NoError(t, err)
	w := waitUnlockedAsync(ctxT(t, eventually), m2, "x", Shared)
	watchingCount(t, m, 1)
	require.NoError(t, m2.Close())
	select {
	case err := <-w:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(eventually):
		t.Fatal("WaitUnlocked did not end with Close")
	}
	watchingCount(t, m, 0)
	require.ErrorIs(t, m2.WaitUnlocked(context.Background(), "x", Shared), ErrClosed)
	require.NoError(t, l.Release())
	check(t, m)
}

// WaitUnlocked returns at the first instant its name is free, even if
// another request takes the name before its goroutine looks.
//
// P1: A acquires x.     P2: P WaitUnlocked(x) — still blocked.
// P3: A releases x and acquires it again at once.
// P4: P's WaitUnlocked returns (while A holds x again).
func TestWaitUnlockedSeesABriefFreeInstant(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	a := spawn(t, path, nil)
	a.Send("acquire x")
	a.Expect("acquired x")
	w := waitUnlockedAsync(ctxT(t, eventually), m, "x", Exclusive)
	stillWaiting(t, w, "x held by A")
	a.Send("release x")
	a.Send("acquire x")
	a.Expect("released x")
	a.Expect("acquired x")
	unlocked(t, w, "x was free between A's release and its next acquire")
	st, err := m.State(context.Background(), "x")
	require.NoError(t, err)
	require.True(t, st.Locked())
	watchingCount(t, m, 0)
	check(t, m)
}

// A lock taken by the uncontended path (no slot, no latch) is seen by
// State and waited for by WaitUnlocked; a dead holder's lock is reaped for
// a watcher as for a waiter.
func TestWaitUnlockedFastHoldAndDeadHolder(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	l, err := m.Acquire(ctxT(t, eventually), "x", RequestOptions{})
	require.NoError(t, err)
	require.NoError(t, l.Release()) // x's entry is idle: the next exclusive request takes the fast path
	a := spawn(t, path, nil)
	a.Send("acquire x")
	tok := tokenOf(a.Expect("acquired x"))
	st, err := m.State(context.Background(), "x")
	require.NoError(t, err)
	require.Len(t, st.Held, 1)
	require.Equal(t, a.Pid, st.Held[0].PID)
	require.Equal(t, a.client, st.Held[0].ClientID)
	require.Equal(t, tok, st.Held[0].Token)
	require.False(t, st.Held[0].Since.IsZero(), "granted at once by the fast path: its time is known too")
	require.WithinDuration(t, time.Now(), st.Held[0].Since, time.Minute)
	require.False(t, st.Held[0].Since.After(time.Now()))
	require.False(t, st.Grantable(Shared))
	w := waitUnlockedAsync(ctxT(t, eventually), m, "x", Shared)
	stillWaiting(t, w, "x held by A's fast path")
	a.Send("release x")
	a.Expect("released x")
	unlocked(t, w, "A released its fast hold")

	a.Send("acquire x")
	a.Expect("acquired x")
	w = waitUnlockedAsync(ctxT(t, eventually), m, "x", Exclusive)
	stillWaiting(t, w, "x held by A")
	a.Kill()
	unlocked(t, w, "A died holding x")
	watchingCount(t, m, 0)
	check(t, m)
}

// No polling: a blocked WaitUnlocked (and a Watch) looks at the table only
// when its name changes. The counter of their latched looks stays put for
// a quiet period spanning several of the bell loop's 100 ms safety scans,
// and moves when the name changes without becoming free.
func TestWaitUnlockedDoesNotPoll(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	a := spawn(t, path, nil)
	a.Send("acquire x")
	a.Expect("acquired x")
	ctx := ctxT(t, eventually)
	w := waitUnlockedAsync(ctx, m, "x", Exclusive)
	feed, err := m.Watch(ctx, "x")
	require.NoError(t, err)
	<-feed
	watchingCount(t, m, 2)
	settle := func() int64 { // until nothing is in flight
		for last := WatchLooks(m); ; {
			time.Sleep(20 * time.Millisecond)
			if now := WatchLooks(m); now == last {
				return now
			}
			last = WatchLooks(m)
		}
	}
	looks := settle()
	time.Sleep(3*SafetyScan + 50*time.Millisecond)
	require.Equal(t, looks, WatchLooks(m), "a watch looked at the table while nothing changed")

	b := spawn(t, path, nil)
	b.Send("acquire x") // a change that does not free x
	waitPending(t, m, "x", 1)
	deadline := time.Now().Add(eventually)
	for WatchLooks(m) < looks+2 { // both watches looked again
		require.True(t, time.Now().Before(deadline), "the watches were not rung by B's enqueue")
		time.Sleep(time.Millisecond)
	}
	select {
	case st := <-feed:
		require.Len(t, st.Pending, 1)
		require.Equal(t, b.Pid, st.Pending[0].PID)
	case <-time.After(eventually):
		t.Fatal("Watch did not deliver B's enqueue")
	}
	stillWaiting(t, w, "x still held")
	a.Send("release x")
	a.Expect("released x")
	b.Expect("acquired x")
	stillWaiting(t, w, "x held by B")
	b.Send("release x")
	b.Expect("released x")
	unlocked(t, w, "B released x")
}

// Watch delivers the latest state after a burst of changes by another
// process, even to a reader that did not keep up, and closes with its ctx.
func TestWatchDeliversTheLatestState(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	ctx, cancel := context.WithCancel(ctxT(t, eventually))
	feed, err := m.Watch(ctx, "x")
	require.NoError(t, err)
	first := <-feed
	require.False(t, first.Locked())
	require.Equal(t, 1, first.Watchers)
	check(t, m)

	a := spawn(t, path, nil)
	const n = 50
	var last uint64
	for i := 0; i < n; i++ { // the reader does not read meanwhile
		a.Send("acquire x")
		last = tokenOf(a.Expect("acquired x"))
		a.Send("release x")
		a.Expect("released x")
	}
	a.Send("acquire x shared")
	last++
	require.Equal(t, last, tokenOf(a.Expect("acquired x")))
	got := 0
	deadline := time.After(eventually)
	for {
		select {
		case st, ok := <-feed:
			require.True(t, ok)
			got++
			if len(st.Held) == 1 && st.Held[0].Token == last {
				require.Equal(t, Shared, st.Held[0].Mode)
				require.Equal(t, a.Pid, st.Held[0].PID)
				require.LessOrEqual(t, got, 2, "a slow reader gets the latest state, not a backlog")
				a.Send("release x")
				a.Expect("released x")
				select {
				case st := <-feed:
					require.False(t, st.Locked())
				case <-deadline:
					t.Fatal("the release was not delivered")
				}
				cancel()
				for range feed { // closes once ctx ended
				}
				watchingCount(t, m, 0)
				check(t, m)
				return
			}
		case <-deadline:
			t.Fatalf("the last state (token %d) was not delivered", last)
		}
	}
}

// Watch of a name in a full table: ErrTableFull, and nothing is left.
func TestWatchTableFull(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, &OpenOptions{MaxResources: 1, MaxRequests: 4, MaxAgents: 4, MaxNameLen: 16})
	l, err := m.Acquire(ctxT(t, eventually), "a", RequestOptions{Mode: Shared})
	require.NoError(t, err)
	_, err = m.Watch(ctxT(t, eventually), "b")
	require.ErrorIs(t, err, ErrTableFull)
	require.Zero(t, m.Table().Usage().Watching)
	check(t, m)
	require.NoError(t, l.Release())
	require.True(t, errors.Is(m.WaitUnlocked(ctxT(t, eventually), "b", Exclusive), nil))
}
