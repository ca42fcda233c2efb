package manager

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSpinLooksOnly: a spinning request skips its Gosched between looks
// only while the process's spinners leave a P free, none of its requests is
// parked and it may use several CPUs.
func TestSpinLooksOnly(t *testing.T) {
	for _, c := range []struct {
		oneCPU          bool
		spinners, procs int32
		parked          uint32
		want            bool
	}{
		{false, 1, 2, 0, true},   // one spinner, a P free for the holder
		{false, 3, 8, 0, true},   // several spinners, Ps still free
		{false, 2, 2, 0, false},  // every P spins: the others need ours
		{false, 1, 1, 0, false},  // GOMAXPROCS=1: the holder may need our P
		{false, 1, 2, 1, false},  // a parked sibling's grant lands on some P of ours
		{true, 1, 2, 0, false},   // one CPU: spinStep decides (yield once, park)
		{true, 1, 1, 0, false},   // pinned child
		{false, 5, 4, 0, false},  // more spinners than Ps
		{false, 1, 64, 7, false}, // many Ps, but parked requests
	} {
		require.Equal(t, c.want, spinLooksOnly(c.oneCPU, c.spinners, c.procs, c.parked), "%+v", c)
	}
}

// TestSpinnersCounted: the spinner count that spinLooksOnly reads goes up
// while a request spins and back to zero however the spin ends: aborted by
// its context, or granted.
func TestSpinnersCounted(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 || cpusAllowed() < 2 {
		t.Skip("needs two CPUs: a waiter confined to one parks at once")
	}
	path := tablePath(t)
	h := openM(t, path, nil)
	opts := *smallTable
	opts.SpinLimit = time.Minute // spin for the whole test
	m := openM(t, path, &opts)
	ctx := ctxT(t, eventually)

	held, err := h.Acquire(ctx, "n", RequestOptions{})
	require.NoError(t, err)

	// Aborted while spinning.
	abortCtx, cancel := context.WithCancel(ctx)
	aborted := acquireAsync(abortCtx, m, "n", RequestOptions{})
	require.Eventually(t, func() bool { return m.spinners.Load() == 1 }, eventually, time.Millisecond)
	cancel()
	var r result
	select {
	case r = <-aborted:
	case <-ctx.Done():
		t.Fatal("the request aborted while spinning did not return")
	}
	require.ErrorIs(t, r.err, ErrAborted)
	require.Zero(t, m.spinners.Load())
	check(t, m)

	// Granted while spinning: the holder's release (this goroutine, a
	// goroutine of the spinner's own process) must get a P meanwhile.
	granted := acquireAsync(ctx, m, "n", RequestOptions{})
	require.Eventually(t, func() bool { return m.spinners.Load() == 1 }, eventually, time.Millisecond)
	require.NoError(t, held.Release())
	select {
	case r = <-granted:
	case <-ctx.Done():
		t.Fatal("the spinning request was not granted")
	}
	require.NoError(t, r.err)
	require.Zero(t, m.spinners.Load())
	require.NoError(t, r.l.Release())
	check(t, m)
}
