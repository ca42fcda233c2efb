package manager_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

// TestLocalHandoffPokesWithoutBell: a release that grants the name to a
// parked request of its own Manager reaches that goroutine by a direct
// poke (table.DeliverLocal, Manager.pokeSlot): the agent's bell word, which
// other processes bump and which makes the Manager scan its waiters, does
// not move. A chain of such hand-offs through 8 parked goroutines, in queue
// order, leaves it unmoved too (requirement 1 of issue 18: a hand-off
// inside a process stays inside it).
func TestLocalHandoffPokesWithoutBell(t *testing.T) {
	m := openM(t, tablePath(t), &OpenOptions{SpinLimit: -1}) // never spin: every waiter parks
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 8
	l, err := m.Acquire(ctx, "n", RequestOptions{})
	require.NoError(t, err)
	order := make(chan int, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			l, err := m.Acquire(ctx, "n", RequestOptions{})
			if err == nil {
				order <- i
				err = l.Release()
			}
			errs <- err
		}()
		// Queue them one by one, so that queue order is i's order.
		for atomic.LoadUint32(m.Agent().Parked()) != uint32(i+1) {
			require.NoError(t, ctx.Err(), "waiter %d never parked", i)
			runtime.Gosched()
		}
	}
	bell := atomic.LoadUint32(m.Agent().Bell())
	require.NoError(t, l.Release())
	for i := range n {
		select {
		case err := <-errs:
			require.NoError(t, err)
		case <-ctx.Done():
			t.Fatalf("%d of %d hand-offs done: %v", i, n, ctx.Err())
		}
	}
	close(order)
	var got []int
	for i := range order {
		got = append(got, i)
	}
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, got, "granted in queue order")
	require.Equal(t, bell, atomic.LoadUint32(m.Agent().Bell()), "no bell bump for a hand-off within the Manager")
	require.NoError(t, m.Check())
}
