package manager

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
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
	type result struct {
		l   *Lock
		err error
	}
	acquire := func(ctx context.Context) <-chan result {
		ch := make(chan result, 1)
		go func() {
			l, err := m.Acquire(ctx, "n", RequestOptions{})
			ch <- result{l, err}
		}()
		return ch
	}
	aborted := acquire(abortCtx)
	require.Eventually(t, func() bool { return m.view.spinners.Load() == 1 }, eventually, time.Millisecond)
	cancel()
	var r result
	select {
	case r = <-aborted:
	case <-ctx.Done():
		t.Fatal("the request aborted while spinning did not return")
	}
	require.ErrorIs(t, r.err, ErrAborted)
	require.Zero(t, m.view.spinners.Load())
	check(t, m)

	// Granted while spinning: the holder's release (this goroutine, a
	// goroutine of the spinner's own process) must get a P meanwhile.
	granted := acquire(ctx)
	require.Eventually(t, func() bool { return m.view.spinners.Load() == 1 }, eventually, time.Millisecond)
	require.NoError(t, held.Release())
	select {
	case r = <-granted:
	case <-ctx.Done():
		t.Fatal("the spinning request was not granted")
	}
	require.NoError(t, r.err)
	require.Zero(t, m.view.spinners.Load())
	require.NoError(t, r.l.Release())
	check(t, m)
}

// TestSpinWindowBoundsSpinners: with many goroutines of one Manager queued
// on one name, at most spinWindow of them spin at once, plus the requests
// woken one grant ahead of their turn (the head, and the previous head on
// its way out of spinHead); the others park. Without the
// window every queued goroutine spun (80% of the CPU in goschedImpl with
// 64). Grants still go to every goroutine.
func TestSpinWindowBoundsSpinners(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 || cpusAllowed() < 2 {
		t.Skip("needs two CPUs: a waiter confined to one parks at once")
	}
	opts := *smallTable
	opts.MaxRequests = 256
	opts.SpinLimit = time.Minute // nobody parks because its budget ran out
	m := openM(t, tablePath(t), &opts)
	ctx := ctxT(t, eventually)
	const n = 24
	var stop atomic.Bool
	grants := make([]atomic.Int64, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				l, err := m.Acquire(ctx, "n", RequestOptions{})
				if err != nil {
					errs <- err
					return
				}
				grants[g].Add(1)
				if err := l.Release(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	// Watch for at least 300 ms, and on until a spinner was seen (a loaded
	// machine may not run one while we look), within a bound.
	var most int32
	for start := time.Now(); (time.Since(start) < 300*time.Millisecond || most == 0) && time.Since(start) < 10*time.Second; {
		most = max(most, m.view.spinners.Load())
		runtime.Gosched()
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.LessOrEqual(t, most, int32(spinWindow+2), "spinning requests at once")
	require.Positive(t, most, "some request spun")
	for g := range n {
		require.Positive(t, grants[g].Load(), "goroutine %d was never granted", g)
	}
	require.Zero(t, m.view.spinners.Load())
	check(t, m)
}
