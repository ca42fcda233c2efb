package manager_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

func lockNames(locks []*Lock) []string {
	out := make([]string, len(locks))
	for i, l := range locks {
		out[i] = l.Name()
	}
	return out
}

// AcquireAll sorts and dedupes, grants every name with its own token, and
// validates in the contract's order.
func TestAcquireAllBasics(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	ctx := ctxT(t, eventually)
	locks, err := m.AcquireAll(ctx, []string{"c", "a", "b", "a"}, RequestOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c"}, lockNames(locks))
	for _, l := range locks {
		require.NotZero(t, l.Token())
		require.Equal(t, Exclusive, l.Mode())
	}
	snap, err := m.Query(ctx)
	require.NoError(t, err)
	require.Len(t, snap.Held, 3)
	check(t, m)
	require.NoError(t, ReleaseAll(locks))
	require.ErrorIs(t, ReleaseAll(locks), ErrReleased)

	_, err = m.AcquireAll(ctx, nil, RequestOptions{})
	require.ErrorIs(t, err, ErrNotSupported)
	_, err = m.AcquireAll(ctx, []string{"a", "-b"}, RequestOptions{})
	require.ErrorIs(t, err, ErrNotSupported)
	_, err = m.AcquireAll(ctx, []string{"a"}, RequestOptions{Steal: true, IfAvailable: true})
	require.ErrorIs(t, err, ErrNotSupported)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = m.AcquireAll(done, []string{"a", "b"}, RequestOptions{})
	require.ErrorIs(t, err, ErrAborted)
	require.ErrorIs(t, err, context.Canceled)
	// A bad name is reported before a done ctx.
	_, err = m.AcquireAll(done, []string{"a", "-b"}, RequestOptions{})
	require.ErrorIs(t, err, ErrNotSupported)

	m2, err := Open(path, nil)
	require.NoError(t, err)
	require.NoError(t, m2.Close())
	_, err = m2.AcquireAll(done, []string{"-a"}, RequestOptions{})
	require.ErrorIs(t, err, ErrClosed)

	snap, err = m.Query(ctx)
	require.NoError(t, err)
	require.Empty(t, snap.Held)
	require.Empty(t, snap.Pending)
	check(t, m)
}

// A ctx that ends while AcquireAll holds some names releases them and
// withdraws the waiting one: a request queued behind a granted name gets it,
// and the table is as if the AcquireAll never came.
func TestAcquireAllAbortReleasesGranted(t *testing.T) {
	path := tablePath(t)
	m, m2, m3 := openM(t, path, nil), openM(t, path, nil), openM(t, path, nil)
	ctx := ctxT(t, eventually)
	lb, err := m2.Acquire(ctx, "b", RequestOptions{})
	require.NoError(t, err)

	actx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() {
		_, err := m.AcquireAll(actx, []string{"b", "a"}, RequestOptions{})
		res <- err
	}()
	waitPending(t, m, "b", 1) // holds a, waits for b
	behind := acquireAsync(ctx, m3, "a", RequestOptions{})
	waitPending(t, m, "a", 1)
	mustBlock(t, behind, "a is held by the AcquireAll")
	check(t, m)
	cancel()
	select {
	case err := <-res:
		require.ErrorIs(t, err, ErrAborted)
	case <-ctx.Done():
		t.Fatal("AcquireAll did not return after its ctx ended")
	}
	la := mustGrant(t, behind, "the request behind the aborted AcquireAll")
	snap, err := m.Query(ctx)
	require.NoError(t, err)
	require.Empty(t, snap.Pending)
	require.ElementsMatch(t, []LockInfo{
		{Name: "a", Mode: Exclusive, ClientID: m3.ClientID(), PID: snap.Held[0].PID},
		{Name: "b", Mode: Exclusive, ClientID: m2.ClientID(), PID: snap.Held[0].PID},
	}, snap.Held)
	check(t, m)
	require.NoError(t, la.Release())
	require.NoError(t, lb.Release())
	check(t, m)
}

// IfAvailable: all or nothing, without waiting; RequestAll runs fn with nil.
func TestAcquireAllIfAvailable(t *testing.T) {
	path := tablePath(t)
	m, m2 := openM(t, path, nil), openM(t, path, nil)
	ctx := ctxT(t, eventually)
	lb, err := m2.Acquire(ctx, "b", RequestOptions{})
	require.NoError(t, err)
	_, err = m.AcquireAll(ctx, []string{"a", "b", "c"}, RequestOptions{IfAvailable: true})
	require.ErrorIs(t, err, ErrNotAvailable)
	require.Contains(t, err.Error(), `"b"`)
	ran := false
	require.NoError(t, m.RequestAll(ctx, []string{"c", "b"}, RequestOptions{IfAvailable: true},
		func(ctx context.Context, locks []*Lock) error {
			ran = true
			require.Nil(t, locks)
			return nil
		}))
	require.True(t, ran)
	snap, err := m.Query(ctx)
	require.NoError(t, err)
	require.Len(t, snap.Held, 1, "only m2's b")
	require.Empty(t, snap.Pending)
	require.NoError(t, lb.Release())
	locks, err := m.AcquireAll(ctx, []string{"a", "b", "c"}, RequestOptions{IfAvailable: true})
	require.NoError(t, err)
	require.NoError(t, ReleaseAll(locks))
	check(t, m)
}

// Shared AcquireAlls on overlapping sets hold together; an exclusive one waits.
func TestAcquireAllShared(t *testing.T) {
	path := tablePath(t)
	m, m2 := openM(t, path, nil), openM(t, path, nil)
	ctx := ctxT(t, eventually)
	s1, err := m.AcquireAll(ctx, []string{"a", "b"}, RequestOptions{Mode: Shared})
	require.NoError(t, err)
	s2, err := m2.AcquireAll(ctx, []string{"b", "c"}, RequestOptions{Mode: Shared})
	require.NoError(t, err)
	ex := make(chan error, 1)
	go func() {
		locks, err := m2.AcquireAll(ctx, []string{"c", "a"}, RequestOptions{})
		if err == nil {
			err = ReleaseAll(locks)
		}
		ex <- err
	}()
	waitPending(t, m, "a", 1)
	check(t, m)
	require.NoError(t, ReleaseAll(s1))
	waitPending(t, m, "c", 1) // has a now, waits for c (held shared by s2)
	require.NoError(t, ReleaseAll(s2))
	select {
	case err := <-ex:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("exclusive AcquireAll not granted")
	}
	check(t, m)
}

// RequestAll's ctx ends when one of its locks is stolen; RequestAll then
// reports ErrStolen with fn's error, and releases the rest.
func TestRequestAllStolen(t *testing.T) {
	path := tablePath(t)
	m, m2 := openM(t, path, nil), openM(t, path, nil)
	ctx := ctxT(t, eventually)
	fnErr := errors.New("fn saw its ctx end")
	inFn := make(chan struct{})
	res := make(chan error, 1)
	go func() {
		res <- m.RequestAll(ctx, []string{"y", "x"}, RequestOptions{}, func(fctx context.Context, locks []*Lock) error {
			require.Equal(t, []string{"x", "y"}, lockNames(locks))
			close(inFn)
			<-fctx.Done()
			return fnErr
		})
	}()
	select {
	case <-inFn:
	case <-ctx.Done():
		t.Fatal("RequestAll did not run fn")
	}
	ls, err := m2.Acquire(ctx, "y", RequestOptions{Steal: true})
	require.NoError(t, err)
	select {
	case err := <-res:
		require.ErrorIs(t, err, ErrStolen)
		require.ErrorIs(t, err, fnErr)
	case <-ctx.Done():
		t.Fatal("RequestAll's ctx not cancelled by the steal")
	}
	require.NoError(t, ls.Release())
	snap, err := m.Query(ctx)
	require.NoError(t, err)
	require.Empty(t, snap.Held, "x released by RequestAll")
	check(t, m)
}

// Three processes take overlapping sets of names listed in different orders,
// 5,000 times each, at the same time: none ever waits for another in a cycle
// (a wait-for cycle would be reported as ErrDeadlock, or hang until the bound).
func TestAcquireAllDifferentOrdersProcesses(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	sets := []string{"x,y,z", "z,y,x", "y,x"}
	var cs []*child
	for range sets {
		cs = append(cs, spawn(t, path, nil))
	}
	for i, c := range cs { // all started, then all go: their loops overlap
		c.Send("loopall %s 5000", sets[i])
	}
	for i, c := range cs {
		// Progress, not speed: generous on a loaded machine (2.9 s for
		// 20,000 rounds under -race on a quiet one).
		c.ExpectWithin("loopdone "+sets[i], time.Minute)
	}
	snap, err := m.Query(context.Background())
	require.NoError(t, err)
	require.Empty(t, snap.Held)
	require.Empty(t, snap.Pending)
	check(t, m)
}

// A multi-name request is not starved by streams of single-name requests on
// its names from other processes: on each name it waits only for those
// queued before it.
func TestAcquireAllNotStarvedProcesses(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	names := []string{"a", "b"}
	var cs []*child
	for _, n := range names {
		for k := 0; k < 2; k++ {
			c := spawn(t, path, nil)
			c.Send("churn %s", n)
			c.Expect("churning " + n)
			cs = append(cs, c)
		}
	}
	for round := 0; round < 5; round++ {
		ctx := ctxT(t, eventually)
		locks, err := m.AcquireAll(ctx, names, RequestOptions{})
		require.NoError(t, err, "round %d: starved", round)
		require.NoError(t, ReleaseAll(locks))
	}
	for i, c := range cs {
		n := names[i/2]
		c.Send("stopchurn %s", n)
		f := strings.Fields(c.Expect("churned " + n))
		require.NotEqual(t, "0", f[2], "the stream on %q ran", n)
	}
	check(t, m)
}
