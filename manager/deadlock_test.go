package manager_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

// The deadlock tests use a short delay to stay fast.
const testDeadlockDelay = 50 * time.Millisecond

func dlOpts(delay time.Duration) *OpenOptions {
	o := *smallTable
	o.DeadlockDelay = delay
	return &o
}

// P observes; A and B each hold one name and then, in the same task (the
// callback ctx of Request), ask for the other's:
//
//	A: Request x (holds)     B: Request y (holds)
//	A: Acquire y (waits)     B: Acquire x (waits)   -> a cycle
//	after DeadlockDelay: exactly one of them (the one that started waiting
//	last) fails with ErrDeadlock naming the cycle, returns from its callback
//	(releasing its name), and the other is granted.
//
// Both check at about the same moment (same delay, waits started together):
// repeated, so that a double victim would show.
func TestDeadlockTwoProcesses(t *testing.T) {
	for _, form := range []string{"", " handle"} {
		t.Run("form="+strings.TrimSpace(form), func(t *testing.T) { deadlockTwoProcesses(t, form) })
	}
}

// deadlockTwoProcesses is TestDeadlockTwoProcesses with the nest command's
// form: "" (Request's callback ctx carries the first hold) or " handle"
// (Acquire handles, the second request made through WithLock).
func deadlockTwoProcesses(t *testing.T, form string) {
	path := tablePath(t)
	m := openM(t, path, dlOpts(testDeadlockDelay))
	for round := 0; round < 4; round++ {
		a, b := spawn(t, path, dlOpts(testDeadlockDelay)), spawn(t, path, dlOpts(testDeadlockDelay))
		a.Send("nest x y%s", form)
		a.Expect("acquired x")
		b.Send("nest y x%s", form)
		b.Expect("acquired y")
		start := time.Now()
		a.Send("gonest x")
		b.Send("gonest y")
		a.Expect("done x")
		b.Expect("done y")
		elapsed := time.Since(start)
		dead := append(a.Lines("deadlock"), b.Lines("deadlock")...)
		got := append(a.Lines("acquired y"), b.Lines("acquired x")...)
		require.Len(t, dead, 1, "round %d: exactly one victim: %q", round, dead)
		require.Len(t, got, 1, "round %d: the other proceeds", round)
		msg := dead[0]
		for _, want := range []string{`"x"`, `"y"`, fmt.Sprint("pid ", a.Pid), fmt.Sprint("pid ", b.Pid), a.client, b.client} {
			require.Contains(t, msg, want, "the error names the cycle")
		}
		t.Logf("round %d: victim found and the other granted %v after the cycle closed (delay %v)", round, elapsed, testDeadlockDelay)
		a.Kill()
		b.Kill()
		check(t, m)
	}
}

// Two members of a cycle that check at the same moment: with a delay of a
// few milliseconds both check again and again while the cycle stands, and a
// victim that has confirmed the cycle pauses 30 ms before it withdraws, so
// the other member's checks see the same confirmed cycle meanwhile; the
// victim rule must still pick exactly one (without it, both give up).
func TestDeadlockSimultaneousChecks(t *testing.T) {
	path := tablePath(t)
	const delay = 2 * time.Millisecond
	m := openM(t, path, dlOpts(delay))
	a, b := spawn(t, path, dlOpts(delay)), spawn(t, path, dlOpts(delay))
	for _, c := range []*child{a, b} {
		c.Send("victimpause 30ms")
		c.Expect("victimpause")
	}
	for round := 0; round < 10; round++ {
		a.Drop()
		b.Drop()
		a.Send("nest x y")
		a.Expect("acquired x")
		b.Send("nest y x")
		b.Expect("acquired y")
		a.Send("gonest x")
		b.Send("gonest y")
		a.Expect("done x")
		b.Expect("done y")
		dead := append(a.Lines("deadlock"), b.Lines("deadlock")...)
		require.Len(t, dead, 1, "round %d: exactly one victim: %q", round, dead)
	}
	check(t, m)
}

// A three-process cycle: exactly one victim, the other two proceed.
func TestDeadlockThreeProcesses(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, dlOpts(testDeadlockDelay))
	names := []string{"a", "b", "c"}
	var cs []*child
	for i, n := range names {
		c := spawn(t, path, dlOpts(testDeadlockDelay))
		c.Send("nest %s %s", n, names[(i+1)%3])
		c.Expect("acquired " + n)
		cs = append(cs, c)
	}
	for i, c := range cs {
		c.Send("gonest %s", names[i])
	}
	var dead, got []string
	for i, c := range cs {
		c.Expect("done " + names[i])
		dead = append(dead, c.Lines("deadlock")...)
		got = append(got, c.Lines("acquired "+names[(i+1)%3])...)
	}
	require.Len(t, dead, 1, "exactly one victim: %q", dead)
	require.Len(t, got, 2)
	for _, c := range cs {
		require.Contains(t, dead[0], fmt.Sprint("pid ", c.Pid))
	}
	check(t, m)
}

// AcquireAll against a nested request in another process: the AcquireAll
// holds x and waits for y; B holds y and then waits for x. B started
// waiting last, so B is the victim; the AcquireAll then gets y.
func TestDeadlockAcquireAllAgainstNested(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, dlOpts(testDeadlockDelay))
	a, b := spawn(t, path, dlOpts(testDeadlockDelay)), spawn(t, path, dlOpts(testDeadlockDelay))
	b.Send("nest y x")
	b.Expect("acquired y")
	a.Send("all y,x")
	waitPending(t, m, "y", 1)
	b.Send("gonest y")
	b.Expect("deadlock x")
	b.Expect("done y")
	a.Expect("acquiredall y,x")
	require.Empty(t, a.Lines("deadlock"))
	check(t, m)
}

// No false positive: a chain of waits longer than the delay, ending at a
// holder that is merely slow (P, plain Acquire), resolves when P releases.
//
//	A: holds x, waits y    B: holds y, waits z    P: holds z (slow)
//	quiet for 3 delays: nobody fails; P releases: B, then A, are granted.
func TestDeadlockNoFalsePositiveChain(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, dlOpts(testDeadlockDelay))
	ctx := ctxT(t, eventually)
	lz, err := m.Acquire(ctx, "z", RequestOptions{})
	require.NoError(t, err)
	a, b := spawn(t, path, dlOpts(testDeadlockDelay)), spawn(t, path, dlOpts(testDeadlockDelay))
	a.Send("nest x y")
	a.Expect("acquired x")
	b.Send("nest y z")
	b.Expect("acquired y")
	a.Send("gonest x")
	b.Send("gonest y")
	waitPending(t, m, "y", 1)
	waitPending(t, m, "z", 1)
	a.Quiet("deadlock", quietPeriod)
	b.Quiet("deadlock", quietPeriod)
	wg, err := m.WaitGraph(ctx)
	require.NoError(t, err)
	require.Empty(t, wg.Cycles)
	require.Len(t, wg.Waits, 2)
	check(t, m)
	require.NoError(t, lz.Release())
	b.Expect("acquired z")
	b.Expect("done y")
	a.Expect("acquired y")
	a.Expect("done x")
	require.Empty(t, append(a.Lines("deadlock"), b.Lines("deadlock")...))
	check(t, m)
}

// No false positive within one process: goroutines that hold and wait
// independently are not linked (a waiting goroutine does not keep its
// sibling from releasing), even when a waiter's task holds something.
func TestDeadlockNoFalsePositiveGoroutines(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, dlOpts(testDeadlockDelay))
	ctx := ctxT(t, eventually)
	ly, err := m.Acquire(ctx, "y", RequestOptions{}) // a sibling holds y
	require.NoError(t, err)
	inner := make(chan error, 1)
	outer := make(chan error, 1)
	go func() {
		outer <- m.Request(ctx, "x", RequestOptions{}, func(fctx context.Context, l *Lock) error {
			l2, err := m.Acquire(fctx, "y", RequestOptions{}) // holds x, waits for y
			if err == nil {
				err = l2.Release()
			}
			inner <- err
			return err
		})
	}()
	waitPending(t, m, "y", 1)
	// And a sibling waits for x, held by the task waiting for y.
	wx := acquireAsync(ctx, m, "x", RequestOptions{})
	waitPending(t, m, "x", 1)
	mustBlock(t, wx, "x is held")
	require.Empty(t, inner, "no ErrDeadlock after 3 delays")
	require.NoError(t, ly.Release())
	require.NoError(t, recvErr(t, ctx, inner))
	require.NoError(t, recvErr(t, ctx, outer))
	require.NoError(t, mustGrant(t, wx, "x after the task").Release())
	check(t, m)
}

// A member of a cycle dies: it is reaped, the cycle is gone, and the other
// member is granted without ErrDeadlock, although it is the one that closed
// the cycle (the victim had the cycle been real). B never checks (negative
// delay); A's first check is due a second after it parks, long after B's
// death (the check reaps the dead before it reads the graph; the survivors'
// reapers (pidfds) usually reap it first).
func TestDeadlockDeadMemberIsNoCycle(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, dlOpts(-1))
	a, b := spawn(t, path, dlOpts(time.Second)), spawn(t, path, dlOpts(-1))
	a.Send("nest x y")
	a.Expect("acquired x")
	b.Send("nest y x")
	b.Expect("acquired y")
	b.Send("gonest y")
	waitPending(t, m, "x", 1)
	a.Send("gonest x") // A waits last: A closes the cycle
	waitPending(t, m, "y", 1)
	b.Kill()
	a.Expect("acquired y")
	a.Expect("done x")
	require.Empty(t, a.Lines("deadlock"))
	check(t, m)
}

// With DeadlockDelay negative nobody checks: the cycle stays until a ctx ends.
func TestDeadlockDetectionOff(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, dlOpts(-1))
	a, b := spawn(t, path, dlOpts(-1)), spawn(t, path, dlOpts(-1))
	a.Send("nest x y timeout=2s")
	a.Expect("acquired x")
	b.Send("nest y x")
	b.Expect("acquired y")
	a.Send("gonest x")
	b.Send("gonest y")
	waitPending(t, m, "x", 1)
	waitPending(t, m, "y", 1)
	a.Quiet("deadlock", quietPeriod)
	b.Quiet("deadlock", quietPeriod)
	// The cycle is there for anyone who looks.
	wg, err := m.WaitGraph(ctxT(t, eventually))
	require.NoError(t, err)
	require.Len(t, wg.Cycles, 1, "the tags are written by Managers that do not check too")
	require.Len(t, wg.Cycles[0], 4)
	require.Len(t, wg.Waits, 2)
	a.Expect("aborted y")
	a.Expect("done x")
	b.Expect("acquired x")
	check(t, m)
}

func init() { crashScenarios["tag.partial"] = crashWhileTagging }

// P holds z; V's AcquireAll of x, y, z holds x and y and waits for z; after
// its deadlock delay V tags x with its task and dies before it tags y. The
// survivors reap V: x and y are free again, P's z is untouched, the checker
// passes (a tag left on a dead agent's hold goes with the hold).
func crashWhileTagging(e *crashEnv, point string) {
	ctx := ctxT(e.t, eventually)
	lz, err := e.m.Acquire(ctx, "z", RequestOptions{})
	require.NoError(e.t, err)
	v := spawn(e.t, e.path, dlOpts(testDeadlockDelay))
	v.Send("crash %s", point)
	v.Expect("armed")
	v.Send("all x,y,z")
	e.died(v)
	snap, err := e.m.Query(ctx)
	require.NoError(e.t, err)
	require.Equal(e.t, []LockInfo{{Name: "z", Mode: Exclusive, ClientID: e.m.ClientID(), PID: snap.Held[0].PID}}, snap.Held)
	check(e.t, e.m)
	require.NoError(e.t, lz.Release())
}

// recvErr receives from ch within ctx's deadline.
func recvErr(t testing.TB, ctx context.Context, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		t.Fatal("no result before the test's deadline")
	}
	return nil
}
