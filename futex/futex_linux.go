//go:build linux && !shmlocks_poll

package futex

import (
	"fmt"
	"math"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Polling reports whether this build uses the polling fallback instead of real
// futexes. It is false here: this build uses futex(2).
const Polling = false

// futex(2) operations. FUTEX_PRIVATE_FLAG (128) is intentionally not set: the
// words live in MAP_SHARED file mappings and must be shared across processes.
const (
	opWait = 0 // FUTEX_WAIT
	opWake = 1 // FUTEX_WAKE
)

// maxTimeoutSec bounds the relative timeout so it fits a 32-bit time_t (386,
// arm). A longer timeout becomes a (permitted) spurious return after ~68 years.
const maxTimeoutSec = math.MaxInt32

// Wait blocks while *addr == val, for at most timeout (timeout <= 0: no limit).
// It may return spuriously; callers re-check in a loop. EAGAIN (value
// differed), EINTR and ETIMEDOUT are not errors: Wait returns nil for them.
// Only a real failure (EFAULT, EINVAL, ENOSYS) is returned, wrapped.
func Wait(addr *uint32, val uint32, timeout time.Duration) error {
	if err := checkAddr(addr); err != nil {
		return err
	}
	var tsp *unix.Timespec
	if timeout > 0 {
		var ts unix.Timespec
		if timeout >= maxTimeoutSec*time.Second {
			ts = unix.NsecToTimespec(int64(maxTimeoutSec * time.Second))
		} else {
			ts = unix.NsecToTimespec(int64(timeout))
		}
		tsp = &ts
	}
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX,
		uintptr(unsafe.Pointer(addr)), opWait, uintptr(val),
		uintptr(unsafe.Pointer(tsp)), 0, 0)
	switch errno {
	case 0, unix.EAGAIN, unix.EINTR, unix.ETIMEDOUT:
		return nil
	}
	return fmt.Errorf("futex: wait: %w", errno)
}

// Wake wakes up to n waiters (n <= 0 or very large: all) sleeping on addr, in
// this or other processes, and returns how many were woken.
func Wake(addr *uint32, n int) (int, error) {
	if err := checkAddr(addr); err != nil {
		return 0, err
	}
	if n <= 0 || int64(n) > math.MaxInt32 {
		n = math.MaxInt32
	}
	r, _, errno := unix.Syscall6(unix.SYS_FUTEX,
		uintptr(unsafe.Pointer(addr)), opWake, uintptr(n), 0, 0, 0)
	if errno != 0 {
		return 0, fmt.Errorf("futex: wake: %w", errno)
	}
	return int(r), nil
}
