// Package futex provides a minimal wait/wake primitive on a 32-bit word that may
// live in memory shared between processes (a MAP_SHARED file mapping).
//
// The package has one contract and two implementations, in the spirit of the Go
// runtime's lock_futex.go / lock_sema.go split:
//
//   - futex_linux.go (linux, without the shmlocks_poll build tag) issues raw
//     futex(2) FUTEX_WAIT / FUTEX_WAKE system calls. FUTEX_PRIVATE_FLAG is
//     deliberately NOT used: the words live in a shared file mapping and waiters
//     in other processes must be found by Wake.
//   - futex_poll.go (every other OS, or any OS with -tags shmlocks_poll) polls
//     the word with exponential backoff, never waiting more than 1 ms between
//     two checks. Wake is a no-op there; a waiter notices a change within about
//     1 ms (plus scheduling delay).
//
// Contract:
//
//	// Wait blocks while *addr == val, for at most timeout (timeout <= 0: no
//	// limit). It may return spuriously; callers re-check in a loop. EAGAIN
//	// (value differed), EINTR and ETIMEDOUT are NOT errors: Wait returns nil
//	// for them. Only a real failure (EFAULT, EINVAL, ENOSYS) is an error.
//	func Wait(addr *uint32, val uint32, timeout time.Duration) error
//
//	// Wake wakes up to n waiters (n <= 0 or very large: all) sleeping on addr,
//	// in this or other processes. It returns the number of waiters woken
//	// (always 0 with the polling implementation).
//	func Wake(addr *uint32, n int) (int, error)
//
//	// Polling reports whether this build uses the polling fallback.
//	const Polling bool
//
// Because Wait may return spuriously and a timeout is not reported, the
// canonical use is a loop that re-reads the word:
//
//	for atomic.LoadUint32(addr) == busy {
//		if err := futex.Wait(addr, busy, 0); err != nil {
//			return err
//		}
//	}
//
// and the releasing side changes the word first, then calls Wake.
//
// addr must be non-nil and 4-byte aligned, and the memory it points to must not
// move (memory-mapped or heap memory, never a Go stack variable); otherwise
// Wait and Wake return ErrInvalidAddr. All loads of the word by this package
// use sync/atomic.
package futex
