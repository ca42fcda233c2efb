package manager_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

// recovered runs f and returns what it panicked with (nil: no panic).
func recovered(f func()) (v any) {
	defer func() { v = recover() }()
	f()
	return nil
}

// recoveredErr is recovered for a panic that must carry an error.
func recoveredErr(t *testing.T, f func()) error {
	t.Helper()
	v := recovered(f)
	err, ok := v.(error)
	require.True(t, ok, "panic value %v (%T) is not an error", v, v)
	return err
}

// A Locker excludes another process's request on its name, in FIFO order
// with it.
//
//	P: Lock x
//	C: acquire x            (blocks)
//	P: Unlock x             C: acquired x
//	P: Lock x (blocks)      C: release x  ->  P: locked
func TestLockerAcrossProcesses(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	var k sync.Locker = m.Locker("x")
	k.Lock()
	c := spawn(t, path, nil)
	c.Send("acquire x")
	c.Quiet("acquired", quietPeriod)
	k.Unlock()
	c.Expect("acquired x")
	locked := make(chan struct{})
	go func() { k.Lock(); close(locked) }()
	waitPending(t, m, "x", 1)
	select {
	case <-locked:
		t.Fatal("Lock returned while the child holds x")
	default:
	}
	c.Send("release x")
	c.Expect("released x")
	select {
	case <-locked:
	case <-ctxT(t, eventually).Done():
		t.Fatal("Lock not granted after the child released x")
	}
	check(t, m)
	k.Unlock()
}

// Goroutines sharing one Locker exclude each other and a second Locker of
// the same name shares the lock. (The race detector does not see the
// mapping's synchronisation, so the overlap check uses atomics.)
func TestLockerGoroutines(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	k1, k2 := m.Locker("n"), m.Locker("n")
	var wg sync.WaitGroup
	var inside, n, worst atomic.Int32
	for g := range 8 {
		k := k1
		if g%2 == 1 {
			k = k2
		}
		wg.Go(func() {
			for range 50 {
				k.Lock()
				if in := inside.Add(1); in > worst.Load() {
					worst.Store(in)
				}
				n.Add(1)
				inside.Add(-1)
				k.Unlock()
			}
		})
	}
	wg.Wait()
	require.Equal(t, int32(1), worst.Load(), "holders at once")
	require.Equal(t, int32(400), n.Load())
	check(t, m)
}

func TestLockerMisuse(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)

	// Unlock of an unlocked Locker panics like sync.Mutex, with a message.
	v := recovered(m.Locker("u").Unlock)
	require.Contains(t, fmt.Sprint(v), "Unlock of unlocked Locker")

	// A bad name: Lock panics with ErrNotSupported, nothing held.
	require.ErrorIs(t, recoveredErr(t, m.Locker("-bad").Lock), ErrNotSupported)

	// Stolen while locked: Unlock panics with ErrStolen, and the Locker is
	// unlocked afterwards (it can be locked again).
	k := m.Locker("s")
	k.Lock()
	thief := openM(t, path, nil)
	ls, err := thief.Acquire(ctxT(t, eventually), "s", RequestOptions{Steal: true})
	require.NoError(t, err)
	require.ErrorIs(t, recoveredErr(t, k.Unlock), ErrStolen)
	require.Contains(t, fmt.Sprint(recovered(k.Unlock)), "Unlock of unlocked Locker")
	require.NoError(t, ls.Release())
	k.Lock()
	k.Unlock()
	check(t, m)

	// After Close: Lock panics with ErrClosed; a Locker locked before Close
	// panics with ErrClosed on Unlock.
	m2 := openM(t, path, nil)
	held := m2.Locker("c")
	held.Lock()
	require.NoError(t, m2.Close())
	err = recoveredErr(t, held.Unlock)
	require.ErrorIs(t, err, ErrClosed)
	require.True(t, errors.Is(recoveredErr(t, m2.Locker("c").Lock), ErrClosed))
}
