package manager

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/table"
)

// Crash-point tests (hard case 3). For every named crash point of the table
// a child process is made to SIGKILL itself exactly there, in the middle of
// the table's own bookkeeping, and the survivors must recover: the dead
// process's locks go to the next waiter, nothing is held twice, a free lock
// is grantable, nothing of the dead process remains, and the checker passes.
//
// Each scenario is a P/Q/R script: P is this test process, V the victim
// armed with the crash point, H another live child, C a child killed first.

// Three entries: a fourth name in use forces the reclaim of an idle entry.
var crashGeometry = &OpenOptions{MaxResources: 3, MaxRequests: 64, MaxAgents: 16, MaxNameLen: 32}

type crashEnv struct {
	t    *testing.T
	path string
	m    *Manager // P
}

// scenarios by crash point; TestCrashPoints fails if a point has none.
var crashScenarios = map[string]func(e *crashEnv, point string){
	// V dies while requesting a free name; P then gets it.
	"slot.claimed":    crashWhileAcquiringFree,
	"latch.acquired":  crashWhileAcquiringFree,
	"entry.allocated": crashWhileAcquiringFree,
	"entry.linked":    crashWhileAcquiringFree,
	// P holds x; V dies while queueing on x; H queued behind gets x when P releases.
	"enqueue.marked": crashWhileEnqueueing,
	"enqueue.linked": crashWhileEnqueueing,
	// V holds x, P waits; V dies while releasing and granting to P.
	"grant.marked":     crashWhileReleasing,
	"grant.linked":     crashWhileReleasing,
	"release.unlinked": crashWhileReleasing,
	"release.freed":    crashWhileReleasing,
	// V uses four names in distinct buckets one after another and dies while
	// freeing an idle entry to reclaim it.
	"entry.unlinked": crashWhileFreeingEntry,
	// P holds x; V's queued request times out and V dies while withdrawing it.
	"abort.unlinked": crashWhileAborting,
	// P holds x, H waits; V dies while stealing x.
	"steal.marked":  crashWhileStealing,
	"steal.granted": crashWhileStealing,
	// C holds x and is killed; V waits on x and dies while reaping C.
	"reap.latches": crashWhileReaping,
	"reap.slot":    crashWhileReaping,
	"reap.slots":   crashWhileReaping,
	// V dies inside Open, while registering.
	"agent.claimed": crashWhileRegistering,
	"agent.alive":   crashWhileRegistering,
	// V holds x, P waits; V dies inside Close.
	"deregister.released": crashWhileClosing,
	// C dies holding x's latch; V takes it over and dies while rebuilding.
	"repair.rebuilt": crashWhileRepairing,
	// x is idle (used before); V dies just after taking it by the fast path.
	"fast.held": crashWhileFastAcquiring,
	// V holds idle x by the fast path and dies while giving it back.
	"fast.released": crashWhileFastReleasing,
	// H holds x by the fast path; V requests x and dies (latch held) while
	// moving H's hold to the held list; P waits, H releases, P gets x.
	"fast.inflating": crashWhileInflating,
	// P holds x, H waits for it to be unlocked; V dies while linking its own
	// watch of x; H's WaitUnlocked returns when P releases.
	"watch.marked": crashWhileWatching,
	"watch.linked": crashWhileWatching,
	// P holds x; V's WaitUnlocked times out and V dies while unlinking its
	// watch; H still waits and returns when P releases.
	"unwatch.unlinked": crashWhileUnwatching,
}

func TestCrashPoints(t *testing.T) {
	for _, point := range table.CrashPoints {
		t.Run(point, func(t *testing.T) {
			sc, ok := crashScenarios[point]
			if !ok {
				t.Fatalf("crash point %q has no multi-process test", point)
			}
			path := tablePath(t)
			e := &crashEnv{t: t, path: path, m: openM(t, path, crashGeometry)}
			sc(e, point)
			e.verify()
		})
	}
	for point := range crashScenarios {
		require.True(t, slices.Contains(table.CrashPoints, point), "scenario for unknown crash point %q", point)
	}
}

// victim spawns a child armed with point.
func (e *crashEnv) victim(point string) *child {
	c := spawn(e.t, e.path, nil)
	c.Send("crash %s", point)
	c.Expect("armed")
	return c
}

// died waits (bounded) for the victim to kill itself at its crash point,
// reaps the process and asserts that it died by SIGKILL.
func (e *crashEnv) died(c *child) {
	e.t.Helper()
	c.Closed()
	err := c.Wait()
	var ee *exec.ExitError
	require.ErrorAs(e.t, err, &ee, "victim must die by its crash point")
	ws, ok := ee.Sys().(syscall.WaitStatus)
	require.True(e.t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "victim died by %v, want SIGKILL", err)
}

// verify: nothing of dead processes remains, the checker passes, and every
// name used is free and grantable.
func (e *crashEnv) verify() {
	t := e.t
	t.Helper()
	ctx := ctxT(t, eventually)
	snap, err := e.m.Query(ctx)
	require.NoError(t, err)
	require.Empty(t, snap.Held, "all locks released by now")
	require.Empty(t, snap.Pending)
	check(t, e.m)
	for _, name := range []string{"x", "y"} {
		l, err := e.m.Acquire(ctx, name, RequestOptions{})
		require.NoError(t, err, "free lock %q grantable after the crash", name)
		require.NoError(t, l.Release())
	}
	for _, ai := range e.m.Table().Agents() {
		require.False(t, e.m.Table().AgentDead(ai.Index), "agent record %d of dead pid %d remains", ai.Index, ai.PID)
	}
	check(t, e.m)
}

func crashWhileAcquiringFree(e *crashEnv, point string) {
	v := e.victim(point)
	v.Send("acquire x")
	e.died(v)
	l := mustGrant(e.t, acquireAsync(ctxT(e.t, eventually), e.m, "x", RequestOptions{}), "x after V died acquiring it")
	check(e.t, e.m)
	require.NoError(e.t, l.Release())
}

func crashWhileEnqueueing(e *crashEnv, point string) {
	ctx := ctxT(e.t, eventually)
	lp, err := e.m.Acquire(ctx, "x", RequestOptions{})
	require.NoError(e.t, err)
	v := e.victim(point)
	v.Send("acquire x")
	e.died(v)
	h := spawn(e.t, e.path, nil)
	h.Send("acquire x")
	h.Quiet("acquired", quietPeriod)
	require.NoError(e.t, lp.Release())
	h.Expect("acquired x")
	check(e.t, e.m)
	h.Send("release x")
	h.Expect("released x")
}

func crashWhileReleasing(e *crashEnv, point string) {
	v := spawn(e.t, e.path, nil)
	v.Send("acquire x")
	tv := tokenOf(v.Expect("acquired x"))
	ctx := ctxT(e.t, eventually)
	w := acquireAsync(ctx, e.m, "x", RequestOptions{})
	waitPending(e.t, e.m, "x", 1)
	v.Send("crash %s", point)
	v.Expect("armed")
	v.Send("release x")
	e.died(v)
	l := mustGrant(e.t, w, "P after V died releasing x")
	require.Greater(e.t, l.Token(), tv)
	check(e.t, e.m)
	require.NoError(e.t, l.Release())
}

func crashWhileFreeingEntry(e *crashEnv, point string) {
	// Four names in distinct buckets: the fourth finds no idle entry in its
	// bucket and no free entry, and reclaims another bucket's idle entry.
	var names []string
	buckets := map[uint32]bool{}
	for i := 0; len(names) < 4; i++ {
		n := fmt.Sprint("n", i)
		if b := e.m.Table().BucketOf(table.Hash(n)); !buckets[b] {
			buckets[b] = true
			names = append(names, n)
		}
	}
	v := e.victim(point)
	for _, n := range names[:3] {
		v.Send("acquire %s", n)
		v.Expect("acquired " + n)
		v.Send("release %s", n)
		v.Expect("released " + n)
	}
	v.Send("acquire %s", names[3]) // dies reclaiming an idle entry
	e.died(v)
	for _, n := range names {
		l := mustGrant(e.t, acquireAsync(ctxT(e.t, eventually), e.m, n, RequestOptions{}), "a name after V died freeing an entry")
		check(e.t, e.m)
		require.NoError(e.t, l.Release())
	}
}

func crashWhileAborting(e *crashEnv, point string) {
	ctx := ctxT(e.t, eventually)
	lp, err := e.m.Acquire(ctx, "x", RequestOptions{})
	require.NoError(e.t, err)
	h := spawn(e.t, e.path, nil)
	v := e.victim(point)
	v.Send("acquire x timeout=100ms")
	waitPending(e.t, e.m, "x", 1)
	h.Send("acquire x")
	e.died(v)
	h.Quiet("acquired", quietPeriod)
	require.NoError(e.t, lp.Release())
	h.Expect("acquired x")
	check(e.t, e.m)
	h.Send("release x")
	h.Expect("released x")
}

func crashWhileStealing(e *crashEnv, point string) {
	ctx := ctxT(e.t, eventually)
	lp, err := e.m.Acquire(ctx, "x", RequestOptions{})
	require.NoError(e.t, err)
	h := spawn(e.t, e.path, nil)
	h.Send("acquire x")
	waitPending(e.t, e.m, "x", 1)
	v := e.victim(point)
	v.Send("acquire x steal")
	e.died(v)
	// P's hold was marked stolen before V died: P learns of it (the repair rings it).
	select {
	case <-lp.Lost():
	case <-ctx.Done():
		e.t.Fatal("P's Lost did not close after a half-finished steal")
	}
	require.ErrorIs(e.t, lp.Release(), ErrStolen)
	h.Expect("acquired x")
	check(e.t, e.m)
	h.Send("release x")
	h.Expect("released x")
}

func crashWhileReaping(e *crashEnv, point string) {
	c := spawn(e.t, e.path, nil)
	c.Send("acquire x")
	c.Expect("acquired x")
	v := e.victim(point)
	v.Send("acquire x")
	waitPending(e.t, e.m, "x", 1)
	c.Kill()
	e.died(v)
	l := mustGrant(e.t, acquireAsync(ctxT(e.t, eventually), e.m, "x", RequestOptions{}), "x after its holder and its reaper died")
	check(e.t, e.m)
	require.NoError(e.t, l.Release())
}

func crashWhileRegistering(e *crashEnv, point string) {
	v := start(e.t, e.path, nil, point)
	e.died(v)
	_, err := e.m.Query(context.Background()) // reaps the half-registered record
	require.NoError(e.t, err)
	for _, ai := range e.m.Table().Agents() {
		require.NotEqual(e.t, v.Pid, ai.PID)
	}
}

func crashWhileClosing(e *crashEnv, point string) {
	v := spawn(e.t, e.path, nil)
	v.Send("acquire x")
	v.Expect("acquired x")
	w := acquireAsync(ctxT(e.t, eventually), e.m, "x", RequestOptions{})
	waitPending(e.t, e.m, "x", 1)
	v.Send("crash %s", point)
	v.Expect("armed")
	v.Send("close")
	e.died(v)
	l := mustGrant(e.t, w, "P after V died closing")
	check(e.t, e.m)
	require.NoError(e.t, l.Release())
}

func crashWhileRepairing(e *crashEnv, point string) {
	c := spawn(e.t, e.path, nil)
	c.Send("acquire x")
	c.Expect("acquired x")
	v := e.victim(point)
	v.Send("acquire x")
	waitPending(e.t, e.m, "x", 1)
	c.Send("crash release.unlinked") // C dies holding x's latch
	c.Expect("armed")
	c.Send("release x")
	e.died(c)
	e.died(v) // V reaps C, takes the latch over and dies rebuilding
	l := mustGrant(e.t, acquireAsync(ctxT(e.t, eventually), e.m, "x", RequestOptions{}), "x after two dead latch owners")
	check(e.t, e.m)
	require.NoError(e.t, l.Release())
}

// useOnce makes x's entry idle, so that the next exclusive request on it
// takes the fast path.
func (e *crashEnv) useOnce(name string) {
	l, err := e.m.Acquire(ctxT(e.t, eventually), name, RequestOptions{})
	require.NoError(e.t, err)
	require.NoError(e.t, l.Release())
}

func crashWhileFastAcquiring(e *crashEnv, point string) {
	e.useOnce("x")
	v := e.victim(point)
	v.Send("acquire x")
	e.died(v)
	l := mustGrant(e.t, acquireAsync(ctxT(e.t, eventually), e.m, "x", RequestOptions{}), "x after V died taking it")
	check(e.t, e.m)
	require.NoError(e.t, l.Release())
}

func crashWhileFastReleasing(e *crashEnv, point string) {
	e.useOnce("x")
	v := spawn(e.t, e.path, nil)
	v.Send("acquire x")
	tv := tokenOf(v.Expect("acquired x"))
	v.Send("crash %s", point)
	v.Expect("armed")
	v.Send("release x")
	e.died(v)
	l := mustGrant(e.t, acquireAsync(ctxT(e.t, eventually), e.m, "x", RequestOptions{}), "x after V died releasing it")
	require.Greater(e.t, l.Token(), tv)
	check(e.t, e.m)
	require.NoError(e.t, l.Release())
}

func crashWhileInflating(e *crashEnv, point string) {
	e.useOnce("x")
	h := spawn(e.t, e.path, nil)
	h.Send("acquire x")
	th := tokenOf(h.Expect("acquired x"))
	v := e.victim(point)
	v.Send("acquire x")
	e.died(v)
	w := acquireAsync(ctxT(e.t, eventually), e.m, "x", RequestOptions{})
	waitPending(e.t, e.m, "x", 1)
	h.Send("release x")
	h.Expect("released x")
	l := mustGrant(e.t, w, "P after V died moving H's hold")
	require.Greater(e.t, l.Token(), th)
	check(e.t, e.m)
	require.NoError(e.t, l.Release())
}

func crashWhileWatching(e *crashEnv, point string) {
	ctx := ctxT(e.t, eventually)
	lp, err := e.m.Acquire(ctx, "x", RequestOptions{})
	require.NoError(e.t, err)
	h := spawn(e.t, e.path, nil)
	h.Send("waitunlocked x")
	watchingCount(e.t, e.m, 1)
	v := e.victim(point)
	v.Send("waitunlocked x")
	e.died(v)
	h.Quiet("unlocked", quietPeriod)
	require.NoError(e.t, lp.Release()) // takes V's latch over (watch.linked) and rings H
	h.Expect("unlocked x")
	watchingCount(e.t, e.m, 0)
	check(e.t, e.m)
}

func crashWhileUnwatching(e *crashEnv, point string) {
	ctx := ctxT(e.t, eventually)
	lp, err := e.m.Acquire(ctx, "x", RequestOptions{})
	require.NoError(e.t, err)
	h := spawn(e.t, e.path, nil)
	h.Send("waitunlocked x")
	watchingCount(e.t, e.m, 1)
	v := e.victim(point)
	v.Send("waitunlocked x timeout=100ms")
	e.died(v)
	h.Quiet("unlocked", quietPeriod)
	require.NoError(e.t, lp.Release())
	h.Expect("unlocked x")
	watchingCount(e.t, e.m, 0)
	check(e.t, e.m)
}
