package manager_test

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/table"

	. "github.com/shmlocks/shmlocks/manager"
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

// crashCases are the crash points whose scenarios repeat, one row each:
// who holds and who waits for x around the victim V's command, which dies
// at the point; crashCase.run plays the row. The other points have a
// scenario of their own (crashScenarios).
var crashCases = map[string]crashCase{
	// V dies while requesting a free name; P then gets it.
	"slot.claimed":    {v: "acquire x"},
	"latch.acquired":  {v: "acquire x"},
	"entry.allocated": {v: "acquire x"},
	"entry.linked":    {v: "acquire x"},
	// x is idle (used before); V dies just after taking it by the fast path.
	"fast.held": {idle: true, v: "acquire x"},
	// V holds x, P waits; V dies while releasing and granting to P.
	"grant.marked":     {vHolds: true, pWaits: true, v: "release x"},
	"grant.linked":     {vHolds: true, pWaits: true, v: "release x"},
	"release.unlinked": {vHolds: true, pWaits: true, v: "release x"},
	"release.freed":    {vHolds: true, pWaits: true, v: "release x"},
	// V holds idle x by the fast path and dies while giving it back.
	"fast.released": {idle: true, vHolds: true, v: "release x"},
	// V holds x, P waits; V dies inside Close.
	"deregister.released": {vHolds: true, pWaits: true, v: "close"},
	// P holds x; V dies while queueing on x; H, queued after V died, gets x
	// when P releases.
	"enqueue.marked": {pHolds: true, v: "acquire x", h: "acquire x"},
	"enqueue.linked": {pHolds: true, v: "acquire x", h: "acquire x"},
	// P holds x; V's queued request times out and V dies while withdrawing
	// it; H, queued behind V, gets x when P releases.
	"abort.unlinked": {pHolds: true, v: "acquire x timeout=100ms", h: "acquire x", hBehindV: true},
	// P holds x, H waits for it to be unlocked; V dies while linking its own
	// watch of x; H's WaitUnlocked returns when P releases (which takes V's
	// latch over for watch.linked, and rings H).
	"watch.marked": {pHolds: true, h: "waitunlocked x", hFirst: true, v: "waitunlocked x"},
	"watch.linked": {pHolds: true, h: "waitunlocked x", hFirst: true, v: "waitunlocked x"},
	// P holds x, H waits for it to be unlocked; V's WaitUnlocked times out
	// and V dies while unlinking its watch; H returns when P releases.
	"unwatch.unlinked": {pHolds: true, h: "waitunlocked x", hFirst: true, v: "waitunlocked x timeout=100ms"},
}

// crashScenarios are the scenarios by crash point: the rows of crashCases
// and the scenarios of their own (TestCrashPoints fails if a point has
// none; other test files add theirs in init).
var crashScenarios = map[string]func(e *crashEnv, point string){
	// V uses four names in distinct buckets one after another and dies while
	// freeing an idle entry to reclaim it.
	"entry.unlinked": crashWhileFreeingEntry,
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
	// C dies holding x's latch; V takes it over and dies while rebuilding.
	"repair.rebuilt": crashWhileRepairing,
	// H holds x by the fast path; V requests x and dies (latch held) while
	// moving H's hold to the held list; P waits, H releases, P gets x.
	"fast.inflating": crashWhileInflating,
}

func init() {
	for point, c := range crashCases {
		crashScenarios[point] = c.run
	}
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

// crashCase is a row of crashCases. The script it plays, P being this
// process, V the victim, H another live child:
//
//	if idle: P takes and releases x (V's exclusive request takes the fast path)
//	if pHolds: P takes x
//	if hFirst: H sends h (and is seen waiting)
//	if vHolds: V takes x (token TV); if pWaits: P requests x (seen pending)
//	V is armed with the point and sends v; if hBehindV: once V is seen
//	pending, H sends h
//	V dies by SIGKILL at the point
//	if h and not hFirst and not hBehindV: H sends h
//	if h: H stays blocked for the quiet period
//	if pHolds: P releases x
//	if h: H gets its answer (and releases x)
//	else: P gets x (its waiting request, or a new one), with a token above TV
//	every step checks the table; verify checks the end state
type crashCase struct {
	idle     bool   // x was used once before: V's request takes the fast path
	pHolds   bool   // P holds x while V acts, and releases it after V died
	vHolds   bool   // V takes x before it is armed
	pWaits   bool   // P requests x while V holds it, before V acts
	v        string // V's command, the one that dies at the point
	h        string // H's command: "acquire x" or "waitunlocked x" ("": no H)
	hFirst   bool   // H sends h before V acts
	hBehindV bool   // H sends h once V's request is seen pending
}

func (c crashCase) run(e *crashEnv, point string) {
	t := e.t
	ctx := ctxT(t, eventually)
	if c.idle {
		e.useOnce("x")
	}
	var lp *Lock
	if c.pHolds {
		var err error
		lp, err = e.m.Acquire(ctx, "x", RequestOptions{})
		require.NoError(t, err)
	}
	var h *child
	hSend := func() {
		h.Send("%s", c.h)
		if c.hFirst {
			if strings.HasPrefix(c.h, "waitunlocked") {
				watchingCount(t, e.m, 1)
			} else {
				waitPending(t, e.m, "x", 1)
			}
		}
	}
	if c.h != "" && (c.hFirst || c.hBehindV) {
		h = spawn(t, e.path, nil)
		if c.hFirst {
			hSend()
		}
	}
	var v *child
	var tv uint64
	var w <-chan result
	if c.vHolds {
		v = spawn(t, e.path, nil)
		v.Send("acquire x")
		tv = tokenOf(v.Expect("acquired x"))
		if c.pWaits {
			w = acquireAsync(ctx, e.m, "x", RequestOptions{})
			waitPending(t, e.m, "x", 1)
		}
		v.Send("crash %s", point)
		v.Expect("armed")
	} else {
		v = e.victim(point)
	}
	v.Send("%s", c.v)
	if c.hBehindV {
		waitPending(t, e.m, "x", 1)
		hSend()
	}
	e.died(v)
	if c.h == "" {
		if w == nil {
			w = acquireAsync(ctx, e.m, "x", RequestOptions{})
		}
		l := mustGrant(t, w, fmt.Sprintf("P gets x after V died at %s", point))
		if c.vHolds {
			require.Greater(t, l.Token(), tv, "a grant after V's")
		}
		check(t, e.m)
		require.NoError(t, l.Release())
		return
	}
	if h == nil {
		h = spawn(t, e.path, nil)
		hSend()
	}
	answer := "acquired"
	if strings.HasPrefix(c.h, "waitunlocked") {
		answer = "unlocked"
	}
	h.Quiet(answer, quietPeriod)
	require.NoError(t, lp.Release())
	h.Expect(answer + " x")
	if answer == "unlocked" {
		watchingCount(t, e.m, 0)
		check(t, e.m)
		return
	}
	check(t, e.m)
	h.Send("release x")
	h.Expect("released x")
}
