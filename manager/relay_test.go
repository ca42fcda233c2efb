package manager

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRelayReadiesNextLocalRequest: when a request of a Manager is granted
// after it waited, the earliest of that Manager's requests still asleep on
// the name is readied to spin (relayNext: the two-level queue's "each grant
// readies the next local one", docs/design.md §4) while the granted one
// still holds, instead of sleeping until the doorbell: on a table with more
// agents than the process has CPUs, while more of the Manager's requests
// wait than it has Ps (relays). The grants still follow the queue order.
func TestRelayReadiesNextLocalRequest(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2)) // 2 Ps, whatever the machine
	path := tablePath(t)
	b := openM(t, path, nil) // another agent: the first holder
	openM(t, path, nil)      // and a third: more agents than 2 CPUs
	opts := *smallTable
	opts.SpinLimit = time.Minute // spinners spin until their grant; the rest sleep
	a := openM(t, path, &opts)
	if a.onOneCPU() {
		t.Skip("one CPU: nothing is readied to spin (spinStep parks)")
	}
	require.Greater(t, a.agents.Load(), a.usable.Load(), "the table is not crowded")
	require.Equal(t, int32(2), a.procs.Load())
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()

	first, err := b.Acquire(ctx, "n", RequestOptions{})
	require.NoError(t, err)
	const n = spinWindow + 2 // some spin on arrival, at least two sleep
	order := make(chan int, n)
	hold := make(chan struct{})
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			errs <- a.Request(ctx, "n", RequestOptions{}, func(context.Context, *Lock) error {
				order <- i
				if i == 0 {
					<-hold
				}
				return nil
			})
		}()
		require.Eventually(t, func() bool {
			s, err := a.Query(ctx)
			return err == nil && len(s.Pending) == i+1
		}, eventually, time.Millisecond, fmt.Sprintf("request %d queued", i))
	}
	// The earliest sleeper, as the Manager's wait list has it.
	a.mu.Lock()
	q := a.queues["n"]
	require.NotNil(t, q, "no request of a sleeps")
	sleeper := q.head
	require.False(t, sleeper.spun.Load())
	a.mu.Unlock()

	require.NoError(t, first.Release()) // grants a's request 0, which holds
	select {
	case i := <-order:
		require.Equal(t, 0, i)
	case <-ctx.Done():
		t.Fatal("request 0 not granted")
	}
	require.Eventually(t, sleeper.spun.Load, eventually, time.Millisecond,
		"the earliest sleeping request was not readied by the grant before it")
	close(hold)
	for i := 1; i < n; i++ {
		select {
		case got := <-order:
			require.Equal(t, i, got)
		case <-ctx.Done():
			t.Fatalf("request %d not granted", i)
		}
	}
	for i := 0; i < n; i++ {
		require.NoError(t, <-errs)
	}
	check(t, a)
}
