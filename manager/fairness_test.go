//go:build unix

package manager_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

// boundedTable is smallTable created with Bounded(d).
func boundedTable(d time.Duration) *OpenOptions {
	o := *smallTable
	o.Fairness = Bounded(d)
	return &o
}

// TestFairnessOption: the fairness is the table's, recorded at creation (an
// existing file keeps its own whatever the opener asks for); a bound out of
// range is refused; the spellings round-trip, in JSON too.
func TestFairnessOption(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, boundedTable(3*time.Millisecond))
	require.Equal(t, Bounded(3*time.Millisecond), m.Fairness())
	m2 := openM(t, path, smallTable)
	require.Equal(t, Bounded(3*time.Millisecond), m2.Fairness(), "an existing file keeps its own")
	require.Equal(t, FIFO, openM(t, tablePath(t), nil).Fairness())

	for _, d := range []time.Duration{0, -time.Millisecond, MaxFairnessBound + 1} {
		_, err := Open(tablePath(t), boundedTable(d))
		require.ErrorIs(t, err, ErrNotSupported, "Bounded(%v)", d)
	}
	for _, c := range []struct {
		s string
		f Fairness
	}{{"fifo", FIFO}, {"bounded:1ms", Bounded(time.Millisecond)}, {"bounded:2.5s", Bounded(2500 * time.Millisecond)}} {
		f, err := ParseFairness(c.s)
		require.NoError(t, err)
		require.Equal(t, c.f, f)
		require.Equal(t, c.s, f.String())
		b, err := json.Marshal(OpenOptions{Fairness: f})
		require.NoError(t, err)
		var o OpenOptions
		require.NoError(t, json.Unmarshal(b, &o))
		require.Equal(t, f, o.Fairness)
	}
	for _, s := range []string{"", "FIFO", "bounded", "bounded:", "bounded:0s", "bounded:-1ms", "bounded:2h", "lifo"} {
		_, err := ParseFairness(s)
		require.ErrorIs(t, err, ErrNotSupported, "%q", s)
	}
	d, ok := Bounded(time.Second).IsBounded()
	require.True(t, ok)
	require.Equal(t, time.Second, d)
	_, ok = FIFO.IsBounded()
	require.False(t, ok)
}

// stop and cont SIGSTOP and SIGCONT a child: its requests stay in the table
// but its goroutines cannot run. stop returns once the child is stopped
// (its state in /proc, where there is one; elsewhere after the signal).
func stop(t *testing.T, c *child) {
	t.Helper()
	require.NoError(t, c.Cmd.Process.Signal(syscall.SIGSTOP))
	t.Cleanup(func() { c.Cmd.Process.Signal(syscall.SIGCONT) })
	deadline := time.Now().Add(eventually)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.Pid))
		if err != nil {
			return // no /proc
		}
		// The state follows the command name's closing parenthesis.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'T' {
			return
		}
		require.True(t, time.Now().Before(deadline), "child %d not stopped within %v", c.Pid, eventually)
		time.Sleep(100 * time.Microsecond)
	}
}

func cont(t *testing.T, c *child) {
	t.Helper()
	require.NoError(t, c.Cmd.Process.Signal(syscall.SIGCONT))
}

// pendingOn returns the held and pending requests on name in m's Query.
func pendingOn(t *testing.T, m *Manager, name string) (held, pending []LockInfo) {
	t.Helper()
	s, err := m.Query(context.Background())
	require.NoError(t, err)
	for _, li := range s.Held {
		if li.Name == name {
			held = append(held, li)
		}
	}
	for _, li := range s.Pending {
		if li.Name == name {
			pending = append(pending, li)
		}
	}
	return held, pending
}

// TestBoundedBargeAcrossProcesses: on a table created with Bounded (a bound
// no request reaches here), a release leaves the name free to the queue's
// head, in another process, and a request of ours takes it first (IfAvailable
// too: grantable at once), while Query still shows the head waiting; once
// the head's process runs again, it takes its turn. P/C script:
//
//	P holds x; C requests x (queued); C is stopped;
//	P releases: nothing held, C still pending;
//	P requests x IfAvailable, then plainly: granted at once, tokens increase;
//	C continues: C gets x (woken by the release that left it the name).
func TestBoundedBargeAcrossProcesses(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, boundedTable(time.Hour))
	ctx := ctxT(t, eventually)
	l, err := m.Acquire(ctx, "x", RequestOptions{})
	require.NoError(t, err)
	c := spawn(t, path, nil)
	c.Send("acquire x")
	waitPending(t, m, "x", 1)
	stop(t, c)
	last := l.Token()
	require.NoError(t, l.Release())
	held, pending := pendingOn(t, m, "x")
	require.Empty(t, held, "the name is left free to the head")
	require.Len(t, pending, 1)
	require.Equal(t, c.client, pending[0].ClientID)
	for _, o := range []RequestOptions{{IfAvailable: true}, {}, {Mode: Shared, IfAvailable: true}} {
		b, err := m.Acquire(ctx, "x", o)
		require.NoError(t, err, "%+v: a request takes the free name ahead of the queue", o)
		require.Greater(t, b.Token(), last)
		last = b.Token()
		_, pending = pendingOn(t, m, "x")
		require.Len(t, pending, 1, "the head still waits, in its place")
		check(t, m)
		require.NoError(t, b.Release())
	}
	cont(t, c)
	require.Greater(t, tokenOf(c.Expect("acquired x")), last)
	check(t, m)
	c.Send("release x")
	c.Expect("released x")
}

// TestBoundedStarvedHeadIsServed: once the head has waited the bound, a
// release hands the name to it even while its process is stopped (FIFO's
// hand-off), and no request takes the name ahead of it: the requests of P
// made after that queue behind it (IfAvailable is refused). Every barge P
// made before began before the head had waited the bound (by the enqueue
// time the table shows).
func TestBoundedStarvedHeadIsServed(t *testing.T) {
	const bound = 30 * time.Millisecond
	path := tablePath(t)
	m := openM(t, path, boundedTable(bound))
	ctx := ctxT(t, eventually)
	l, err := m.Acquire(ctx, "x", RequestOptions{})
	require.NoError(t, err)
	c := spawn(t, path, nil)
	c.Send("acquire x")
	waitPending(t, m, "x", 1)
	stop(t, c)
	_, pending, err := m.Table().Snapshot(nil)
	require.NoError(t, err)
	require.Len(t, pending, 1)
	enq := time.Unix(0, pending[0].Since)
	require.NoError(t, l.Release())
	// Barge while allowed: P's requests are granted at once until the head
	// has waited the bound; the first refusal ends it for good.
	barges := 0
	for {
		t0 := time.Now()
		b, err := m.Acquire(ctx, "x", RequestOptions{IfAvailable: true})
		if err != nil {
			require.ErrorIs(t, err, ErrNotAvailable)
			break
		}
		barges++
		require.Less(t, t0.Sub(enq), bound+2*time.Millisecond, "a barge began after the head had waited the bound")
		require.NoError(t, b.Release())
		require.NoError(t, ctx.Err(), "still barging after %v", eventually)
	}
	held, _ := pendingOn(t, m, "x")
	if len(held) == 0 {
		// The refusal came from a free name whose head has waited the bound:
		// the next release (or arrival) serves it. A plain request queues.
		ch := acquireAsync(ctx, m, "x", RequestOptions{})
		waitPending(t, m, "x", 2)
		mustBlock(t, ch, "a request behind a starved head")
		cont(t, c)
		c.Expect("acquired x")
		c.Send("release x")
		c.Expect("released x")
		require.NoError(t, mustGrant(t, ch, "P after the head").Release())
	} else {
		// The last barge's release handed the name to the starved head.
		require.Equal(t, c.client, held[0].ClientID)
		ch := acquireAsync(ctx, m, "x", RequestOptions{})
		waitPending(t, m, "x", 1)
		mustBlock(t, ch, "a request behind a starved head's hold")
		cont(t, c)
		c.Expect("acquired x")
		c.Send("release x")
		c.Expect("released x")
		require.NoError(t, mustGrant(t, ch, "P after the head").Release())
	}
	t.Logf("%d barges before the head had waited %v", barges, bound)
	check(t, m)
}

// TestBoundedWaitUnlocked: on a bounded table WaitUnlocked returns when a
// request in its mode would be granted at once, a request ahead of the
// queue included: P holds x, C waits for x (stopped), H waits for x to be
// unlocked; P's release leaves x to C, and H returns while C still waits.
func TestBoundedWaitUnlocked(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, boundedTable(time.Hour))
	ctx := ctxT(t, eventually)
	l, err := m.Acquire(ctx, "x", RequestOptions{})
	require.NoError(t, err)
	c := spawn(t, path, nil)
	c.Send("acquire x")
	waitPending(t, m, "x", 1)
	stop(t, c)
	h := spawn(t, path, nil)
	h.Send("waitunlocked x")
	h.Quiet("unlocked", quietPeriod)
	require.NoError(t, l.Release())
	h.Expect("unlocked x")
	_, pending := pendingOn(t, m, "x")
	require.Len(t, pending, 1, "C still waits")
	cont(t, c)
	c.Expect("acquired x")
	c.Send("release x")
	c.Expect("released x")
	check(t, m)
}

// TestBoundedDeadlock: deadlock detection is the same on a bounded table
// (its wait-for graph is: a queued request's out-edges include those of
// every request ahead of it, so which of them is granted first never makes
// or breaks a cycle): A holds x and asks for y, B holds y and asks for x; exactly
// one of them is the victim and the other proceeds (TestDeadlockTwoProcesses
// on a table created with Bounded).
func TestBoundedDeadlock(t *testing.T) {
	path := tablePath(t)
	o := boundedTable(time.Millisecond)
	o.DeadlockDelay = testDeadlockDelay
	m := openM(t, path, o)
	a, b := spawn(t, path, dlOpts(testDeadlockDelay)), spawn(t, path, dlOpts(testDeadlockDelay))
	a.Send("nest x y")
	a.Expect("acquired x")
	b.Send("nest y x")
	b.Expect("acquired y")
	a.Send("gonest x")
	b.Send("gonest y")
	a.Expect("done x")
	b.Expect("done y")
	dead := append(a.Lines("deadlock"), b.Lines("deadlock")...)
	got := append(a.Lines("acquired y"), b.Lines("acquired x")...)
	require.Len(t, dead, 1, "exactly one victim: %q", dead)
	require.Len(t, got, 1, "the other proceeds")
	a.Kill()
	b.Kill()
	check(t, m)
}
