package manager

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/table"
)

// listOrder returns the sequence numbers of name's wait list, head first,
// checking the back links on the way.
func listOrder(t *testing.T, m *Manager, name string) []uint32 {
	t.Helper()
	q := m.waits.queues[name]
	if q == nil {
		return nil
	}
	var out []uint32
	var prev *waiter
	for w := q.head; w != nil; w = w.next {
		require.Same(t, prev, w.prev)
		out = append(out, w.seq)
		prev = w
	}
	require.Same(t, prev, q.tail)
	return out
}

// TestWaitListOrder: the per-name lists the bell loop scans stay in queue
// order whatever the order of registration, across the 32-bit wrap of the
// sequence numbers, and disappear when empty.
func TestWaitListOrder(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	mk := func(slot, seq uint32) *waiter {
		return &waiter{ref: table.Ref{Slot: slot}, name: "n", seq: seq}
	}
	ws := []*waiter{mk(1, 5), mk(2, 3), mk(3, 4), mk(4, 0xffffffff), mk(5, 6), mk(6, 0)}
	m.waits.mu.Lock()
	defer m.waits.mu.Unlock()
	for _, w := range ws {
		m.addWaiter(w)
	}
	require.Equal(t, []uint32{0xffffffff, 0, 3, 4, 5, 6}, listOrder(t, m, "n"))
	m.removeWaiter(ws[2]) // seq 4, middle
	m.removeWaiter(ws[3]) // seq 0xffffffff, head
	m.removeWaiter(ws[4]) // seq 6, tail
	require.Equal(t, []uint32{0, 3, 5}, listOrder(t, m, "n"))
	require.Equal(t, 3, m.waits.nwait)
	for _, w := range []*waiter{ws[0], ws[1], ws[5]} {
		m.removeWaiter(w)
	}
	require.Empty(t, m.waits.queues)
	require.Zero(t, m.waits.nwait)
}

// TestParkedWaitersDrainInOrder: 40 parked goroutines of one Manager queued
// on one name are granted one after another, in queue order, when another
// agent releases it (the bell loop looks only at the front of each list).
// A second name's waiter, queued behind a holder that stays, is not woken.
func TestParkedWaitersDrainInOrder(t *testing.T) {
	path := tablePath(t)
	a := openM(t, path, nil)
	opts := *smallTable
	opts.SpinLimit = -1 // park at once
	b := openM(t, path, &opts)
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()

	first, err := a.Acquire(ctx, "n", RequestOptions{})
	require.NoError(t, err)
	other, err := a.Acquire(ctx, "other", RequestOptions{})
	require.NoError(t, err)
	otherCtx, otherCancel := context.WithCancel(ctx)
	otherDone := make(chan error, 1)
	go func() {
		_, err := b.Acquire(otherCtx, "other", RequestOptions{})
		otherDone <- err
	}()

	const n = 40
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := b.Acquire(ctx, "n", RequestOptions{})
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			check(t, b)
			if err := l.Release(); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		}()
		// Enqueue one at a time, so that queue order is i's order.
		require.Eventually(t, func() bool {
			s, err := b.Query(ctx)                     // an error shows as the wait failing
			return err == nil && len(s.Pending) == i+2 // + the waiter on "other"
		}, eventually, time.Millisecond, fmt.Sprintf("waiter %d queued", i))
	}
	require.NoError(t, first.Release())
	wg.Wait()
	want := make([]int, n)
	for i := range want {
		want[i] = i
	}
	require.Equal(t, want, order)
	select {
	case err := <-otherDone:
		t.Fatalf("waiter on a held name returned: %v", err)
	case <-time.After(quietPeriod):
	}
	require.NoError(t, other.Release())
	select {
	case err := <-otherDone:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("waiter on other not granted")
	}
	otherCancel()
	check(t, a)
}

// TestRecycledWaiter: a waiter whose request is over serves a later park,
// with no poke of its previous request left in its channel, and a deadlock
// round that looked at it for the previous request hands that request's
// verdict to nobody (the round's verdict reaches only a waiter still
// registered for the request it checked).
func TestRecycledWaiter(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	refA := table.Ref{Slot: 3, Serial: 7}
	refB := table.Ref{Slot: 5, Serial: 9}

	m.waits.mu.Lock()
	w := m.newWaiter(refA, "a", 1)
	m.addWaiter(w)
	w.relay.Store(true)
	m.waits.mu.Unlock()
	stale := roundWaiter{w, refA} // what a round collected while A was parked

	m.waits.mu.Lock()
	m.removeWaiter(w)
	m.recycleWaiter(w)
	m.waits.mu.Unlock()
	w.poke() // a late poke of A (pokeSlot read w from the slot index before it left)
	m.giveVerdict(stale, "A's cycle")
	require.Nil(t, w.dl.verdict.Load(), "a removed waiter gets no verdict (its slot index cell is left)")
	require.Same(t, w, m.waits.bySlot.load(refA.Slot), "the cell is left for the next waiter at the slot")

	m.waits.mu.Lock()
	w2 := m.newWaiter(refB, "b", 2)
	m.addWaiter(w2)
	m.waits.mu.Unlock()
	require.Same(t, w, w2, "the removed waiter is reused")
	require.Equal(t, refB, w2.ref)
	require.Equal(t, "b", w2.name)
	require.False(t, w2.relay.Load(), "A's relay mark is not B's")
	require.Empty(t, w2.ch, "A's late poke was drained")

	m.giveVerdict(stale, "A's cycle")
	require.Nil(t, w2.dl.verdict.Load(), "A's verdict must not reach B")
	require.Empty(t, w2.ch, "nor wake it")

	m.giveVerdict(roundWaiter{w2, refB}, "B's cycle")
	v := w2.dl.verdict.Load()
	require.NotNil(t, v)
	require.Equal(t, "B's cycle", *v)
	require.Len(t, w2.ch, 1, "the victim is woken")

	m.waits.mu.Lock()
	m.removeWaiter(w2)
	m.recycleWaiter(w2)
	require.Nil(t, w2.dl.verdict.Load(), "a recycled waiter carries no verdict")
	require.Equal(t, 1, m.waits.nfree)
	m.waits.mu.Unlock()
}

// TestDroppedWaiterClearsItsCell: a removed waiter leaves its slot index
// cell (the next waiter at the slot overwrites it), but one that the full
// free list drops clears it, so that a burst of parked requests leaves no
// more waiters reachable than the free list keeps; a cell another waiter
// took meanwhile is left alone.
func TestDroppedWaiterClearsItsCell(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	n := maxFreeWaiters + 3 // kept, dropped, dropped with its cell taken, registered
	ws := make([]*waiter, n)
	m.waits.mu.Lock()
	for i := range ws {
		ws[i] = m.newWaiter(table.Ref{Slot: uint32(i), Serial: 1}, "n", uint32(i))
		m.addWaiter(ws[i])
	}
	for _, w := range ws[:n-1] {
		m.removeWaiter(w)
	}
	// The cell of the last removed one is taken by another waiter before
	// it is dropped.
	other := &waiter{ref: table.Ref{Slot: uint32(n - 2), Serial: 2}, ch: make(chan struct{}, 1)}
	for _, w := range ws[:n-1] {
		if w.ref.Slot == uint32(n-2) {
			m.waits.bySlot.store(w.ref.Slot, other)
		}
		m.recycleWaiter(w)
	}
	m.waits.mu.Unlock()
	for i, w := range ws[:maxFreeWaiters] {
		require.Same(t, w, m.waits.bySlot.load(uint32(i)), "kept on the free list: the cell is left")
	}
	require.Nil(t, m.waits.bySlot.load(uint32(maxFreeWaiters)), "dropped: the cell is cleared")
	require.Same(t, other, m.waits.bySlot.load(uint32(n-2)), "a cell another waiter took is left alone")
	require.Same(t, ws[n-1], m.waits.bySlot.load(uint32(n-1)), "still registered")
	m.waits.mu.Lock()
	m.removeWaiter(ws[n-1])
	m.waits.mu.Unlock()
}
