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
// readies the next local one", docs/waiting.md) while the granted one
// still holds, instead of sleeping until the doorbell: on a table with more
// agents than the process has CPUs, while more of the Manager's requests
// wait than it has Ps (relays). A readied request, granted after it spun,
// readies the next in turn. The grants still follow the queue order.
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
	require.Greater(t, a.view.agents.Load(), a.view.usable.Load(), "the table is not crowded")
	require.Equal(t, int32(2), a.view.procs.Load())
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()

	first, err := b.Acquire(ctx, "n", RequestOptions{})
	require.NoError(t, err)
	// The queue: a's requests, with b's between its sleepers, so that each
	// sleeper's turn comes after a grant from another agent (no local poke
	// at its grant, no wake-ahead while a request of a holds).
	owners := []*Manager{a, a, a, b, a, b, a, a, a}
	n := len(owners)
	order := make(chan int, n)
	holds := make([]chan struct{}, n) // request i returns when holds[i] closes
	for i := range holds {
		holds[i] = make(chan struct{})
	}
	errs := make(chan error, n)
	for i, m := range owners {
		go func() {
			errs <- m.Request(ctx, "n", RequestOptions{}, func(context.Context, *Lock) error {
				order <- i
				select {
				case <-holds[i]:
				case <-ctx.Done(): // the test failed before it let i go
				}
				return nil
			})
		}()
		require.Eventually(t, func() bool {
			s, err := a.Query(ctx)
			return err == nil && len(s.Pending) == i+1
		}, eventually, time.Millisecond, fmt.Sprintf("request %d queued", i))
	}
	// a's sleepers, as its wait list has them (queue order), and their
	// requests: a's requests behind the two that spin on arrival.
	a.waits.mu.Lock()
	q := a.waits.queues["n"]
	require.NotNil(t, q, "no request of a sleeps")
	var sleepers []*waiter
	for w := q.head; w != nil; w = w.next {
		require.False(t, w.spun.Load())
		sleepers = append(sleepers, w)
	}
	a.waits.mu.Unlock()
	require.Len(t, sleepers, 5, "a's requests 2, 4, 6, 7 and 8 sleep")
	// The grant of request i readies sleeper next[i]: at each, at least 2
	// (GOMAXPROCS) of a's requests still wait (relays). Not at 7's: only 8
	// waits then, and 8 x 2 showed that readying a lone sibling costs.
	next := map[int]int{2: 1, 4: 2, 6: 3}

	granted := func(want int) {
		t.Helper()
		select {
		case got := <-order:
			require.Equal(t, want, got, "grant order")
		case <-ctx.Done():
			t.Fatalf("request %d not granted", want)
		}
	}
	require.NoError(t, first.Release()) // grants a's request 0, which holds
	granted(0)
	require.Eventually(t, sleepers[0].spun.Load, eventually, time.Millisecond,
		"the earliest sleeping request was not readied by the grant of request 0")
	for i := 1; i < n; i++ {
		close(holds[i-1])
		granted(i)
		// A readied request, once granted, readies the next sleeper in turn.
		if j, ok := next[i]; ok {
			require.Eventually(t, sleepers[j].spun.Load, eventually, time.Millisecond,
				"sleeper %d was not readied by the grant of request %d", j, i)
		}
	}
	close(holds[n-1])
	for i := 0; i < n; i++ {
		require.NoError(t, <-errs)
	}
	check(t, a)
}
