package manager

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// Locker returns a sync.Locker for the exclusive lock name on m's table:
// Lock is Acquire(context.Background(), name, RequestOptions{}) and Unlock
// is Release of that grant. It is for the common in-code case (a
// sync.Cond, or code written against sync.Locker); use Acquire or Request to
// see errors, cancel a wait or learn of a steal (Lost).
//
// sync.Locker has no error results, so a Locker panics where Acquire or
// Release would return an error, as sync.Mutex panics on misuse:
//
//   - Lock panics with the error (errors.Is works on the recovered value)
//     when the request fails: ErrClosed, ErrCorrupt, ErrTableFull, or
//     ErrNotSupported for a bad name. Nothing is held then.
//   - Unlock of a Locker that is not locked panics, like sync.Mutex's
//     "unlock of unlocked mutex".
//   - Unlock panics with the error when the lock was taken away while held
//     (ErrStolen: another request stole it, or this agent was reaped;
//     ErrClosed: m was closed): the critical section did not run under
//     exclusion, which a Locker's caller cannot be told any other way. The
//     Locker is unlocked afterwards.
//   - Unlock panics with the error when the table could not be updated (a
//     latch held too long by a stopped process, or corruption); the lock
//     is then still held and the Locker still locked, so a recovered caller
//     may Unlock again.
//
// Like a sync.Mutex, a Locker may be unlocked by a goroutine other than
// the one that locked it, and is not reentrant: a second Lock from the
// holder waits for itself forever. Lockers of one name share its lock,
// with each other and with every other process of the table, in FIFO
// order per request.
func (m *Manager) Locker(name string) sync.Locker {
	return &locker{m: m, name: name}
}

// locker is Locker's sync.Locker. held is the grant of the current
// holder: exclusive, so one at a time.
type locker struct {
	m    *Manager
	name string
	held atomic.Pointer[Lock]
}

func (k *locker) Lock() {
	l, err := k.m.Acquire(context.Background(), k.name, RequestOptions{})
	if err != nil {
		panic(fmt.Errorf("shmlocks: Locker(%q).Lock: %w", k.name, err))
	}
	if !k.held.CompareAndSwap(nil, l) {
		// An exclusive grant while the Locker records another: the table
		// broke exclusion, or the previous holder's Unlock has not finished.
		prev := k.held.Load()
		l.Release()
		panic(fmt.Errorf("shmlocks: Locker(%q).Lock: granted while the Locker still holds token %d: %w",
			k.name, prev.Token(), ErrCorrupt))
	}
}

func (k *locker) Unlock() {
	l := k.held.Load()
	if l == nil {
		panic(fmt.Sprintf("shmlocks: Locker(%q).Unlock of unlocked Locker", k.name))
	}
	// Clear before releasing: the next holder's grant may come at once.
	if !k.held.CompareAndSwap(l, nil) {
		panic(fmt.Sprintf("shmlocks: Locker(%q).Unlock of unlocked Locker", k.name))
	}
	if err := l.Release(); err != nil {
		if !isLost(err) {
			k.held.Store(l) // still ours: a recovered caller may Unlock again
		}
		panic(fmt.Errorf("shmlocks: Locker(%q).Unlock: %w", k.name, err))
	}
}

// isLost reports whether a Release error says the grant is gone (stolen,
// reaped, released by Close, or released before).
func isLost(err error) bool {
	return errorsIsAny(err, ErrStolen, ErrClosed, ErrReleased)
}
