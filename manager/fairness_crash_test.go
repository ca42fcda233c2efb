//go:build unix

package manager_test

import (
	"testing"
	"time"

	. "github.com/shmlocks/shmlocks/manager"
)

// Crash points of bounded fairness (table/fairness.go), each with a
// multi-process scenario on a table created with Bounded (a bound no
// request reaches here: every release that could grant a head leaves it
// the name). TestCrashPoints runs them; e.verify checks the end state.
func init() {
	// V holds x, P waits asleep; V's release leaves x to P, clears P's park
	// mark and dies before ringing (latch held): P's reap of V takes the
	// latch over and its repair rings P, which takes its turn.
	crashScenarios["passon.leftfree"] = crashWhileLeavingFree
	// P holds x, V waits; P's release leaves x to V, which takes its turn and
	// dies holding the latch and x; P's next request takes the latch over and
	// gets x once V is reaped.
	crashScenarios["turn.taken"] = crashWhileTakingTurn
	// P holds x, H waits (stopped); P's release leaves x to H; V takes x ahead
	// of H (shared: under the latch) and dies holding the latch and x; H,
	// continued, gets x.
	crashScenarios["barge.granted"] = crashWhileBarging
	// V holds x and asks for it again (V2); P waits for x (P1, ahead of V2).
	// To V, whose clock is skewed 45 minutes ahead (the bound is an hour),
	// both have waited half the bound: V's release grants V2 ahead of P1
	// (its own batch) and dies there, latch held. P's reap of V takes the
	// latch over, V2 goes with V, and P1 gets x.
	crashScenarios["batch.granted"] = crashWhileBatching
}

func crashWhileBatching(e *crashEnv, point string) {
	crashGrantingOwnAhead(e, point, "skew 45m", "skewed")
}

// crashGrantingOwnAhead: V holds x and asks for it again (V2); P waits for
// x (P1, ahead of V2). V is sent cmd (answered with ok), which makes its
// release grant V2 ahead of P1, and dies at point in that release, latch
// held. P's reap of V takes the latch over, V2 goes with V, and P1 gets x.
func crashGrantingOwnAhead(e *crashEnv, point, cmd, ok string) {
	e.bounded(-1)
	v := spawn(e.t, e.path, nil)
	v.Send("acquire x")
	tv := tokenOf(v.Expect("acquired x"))
	w := acquireAsync(ctxT(e.t, eventually), e.m, "x", RequestOptions{})
	waitPending(e.t, e.m, "x", 1)
	v.Send("acquire x")
	waitPending(e.t, e.m, "x", 2)
	v.Send("ownwaiting") // V2 queued in the table is not enough: V's release needs it parked or spinning in V
	if got := v.Expect("ownwaiting"); got != "ownwaiting true" {
		e.t.Fatalf("V's second request never waited in V: %q", got)
	}
	v.Send("%s", cmd)
	v.Expect(ok)
	v.Send("crash %s", point)
	v.Expect("armed")
	v.Send("release x")
	e.died(v)
	l := mustGrant(e.t, w, "P after V died granting its own request ahead of P's")
	if l.Token() <= tv+1 {
		e.t.Fatalf("P's token %d: not above V's %d and V2's grant", l.Token(), tv)
	}
	check(e.t, e.m)
	if err := l.Release(); err != nil {
		e.t.Fatal(err)
	}
}

// TestCrashTurnGrant: batch.granted reached by a turn (ReleaseTurn) instead
// of the aging batch. V holds x and asks for it again (V2); P waits for x
// (P1, ahead of V2). V's release is a turn (the test hook: every grant):
// it grants V2 ahead of P1 and dies there, latch held. P's reap of V takes
// the latch over, V2 goes with V, and P1 gets x.
func TestCrashTurnGrant(t *testing.T) {
	path := tablePath(t)
	e := &crashEnv{t: t, path: path, m: openM(t, path, crashGeometry)}
	crashGrantingOwnAhead(e, "batch.granted", "turns 1", "turns 1")
	e.verify()
}

// TestCrashFastBargeWithQueue: the same with V's exclusive request, which
// takes x by the fast path ahead of H's queued request (the entry was handed
// to the fast path with its queue) and dies just after its CAS (fast.held):
// the reaper moves the dead fast hold into the held list and releases it to
// H, which (continued) gets x.
func TestCrashFastBargeWithQueue(t *testing.T) {
	path := tablePath(t)
	e := &crashEnv{t: t, path: path, m: openM(t, path, crashGeometry)}
	crashWhileBargingMode(e, "fast.held", "")
	e.verify()
}

// bounded makes e's table a fresh one of bounded fairness, with P's
// SpinLimit spin (negative: P's requests sleep at once).
func (e *crashEnv) bounded(spin time.Duration) {
	o := *crashGeometry
	o.Fairness = Bounded(time.Hour)
	o.SpinLimit = spin
	e.path = tablePath(e.t)
	e.m = openM(e.t, e.path, &o)
}

func crashWhileLeavingFree(e *crashEnv, point string) {
	e.bounded(-1)
	v := spawn(e.t, e.path, nil)
	v.Send("acquire x")
	tv := tokenOf(v.Expect("acquired x"))
	w := acquireAsync(ctxT(e.t, eventually), e.m, "x", RequestOptions{})
	waitPending(e.t, e.m, "x", 1)
	v.Send("crash %s", point)
	v.Expect("armed")
	v.Send("release x")
	e.died(v)
	l := mustGrant(e.t, w, "P after V died leaving x to it")
	if l.Token() <= tv {
		e.t.Fatalf("token %d after %d", l.Token(), tv)
	}
	check(e.t, e.m)
	if err := l.Release(); err != nil {
		e.t.Fatal(err)
	}
}

func crashWhileTakingTurn(e *crashEnv, point string) {
	e.bounded(0)
	ctx := ctxT(e.t, eventually)
	lp, err := e.m.Acquire(ctx, "x", RequestOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	v := e.victim(point)
	v.Send("acquire x")
	waitPending(e.t, e.m, "x", 1)
	if err := lp.Release(); err != nil {
		e.t.Fatal(err)
	}
	e.died(v)
	l := mustGrant(e.t, acquireAsync(ctx, e.m, "x", RequestOptions{}), "P after V died taking its turn")
	if l.Token() <= lp.Token() {
		e.t.Fatalf("token %d after %d", l.Token(), lp.Token())
	}
	check(e.t, e.m)
	if err := l.Release(); err != nil {
		e.t.Fatal(err)
	}
}

func crashWhileBarging(e *crashEnv, point string) { crashWhileBargingMode(e, point, " shared") }

// crashWhileBargingMode: V's request is made with mode (" shared" or "").
func crashWhileBargingMode(e *crashEnv, point, mode string) {
	e.bounded(0)
	ctx := ctxT(e.t, eventually)
	lp, err := e.m.Acquire(ctx, "x", RequestOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	h := spawn(e.t, e.path, nil)
	h.Send("acquire x")
	waitPending(e.t, e.m, "x", 1)
	stop(e.t, h)
	if err := lp.Release(); err != nil {
		e.t.Fatal(err)
	}
	v := e.victim(point)
	v.Send("acquire x%s", mode)
	e.died(v)
	cont(e.t, h)
	if tok := tokenOf(h.Expect("acquired x")); tok <= lp.Token()+1 {
		e.t.Fatalf("H's token %d: not above P's %d and V's grant", tok, lp.Token())
	}
	check(e.t, e.m)
	h.Send("release x")
	h.Expect("released x")
}
