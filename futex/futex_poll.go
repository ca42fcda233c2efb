//go:build !linux || shmlocks_poll

package futex

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Polling reports whether this build uses the polling fallback instead of real
// futexes. It is true here: Wait polls and Wake does nothing.
const Polling = true

const (
	// spinYields is the number of runtime.Gosched rounds before sleeping.
	spinYields = 4
	// minPollInterval is the first sleep between checks; it doubles each round.
	minPollInterval = time.Microsecond
	// maxPollInterval (1 ms) bounds the time between two checks of the word: a waiter
	// notices a change at most about 1 ms (plus scheduling delay) after it
	// happens, since Wake cannot notify it.
	maxPollInterval = time.Millisecond
)

// Wait blocks while *addr == val, for at most timeout (timeout <= 0: no limit).
// This polling implementation re-reads the word atomically with exponential
// backoff (a few runtime.Gosched rounds, then sleeps from 1 µs doubling up to
// maxPollInterval = 1 ms) and returns nil as soon as the word differs from val or the
// timeout has elapsed. Like the futex version it may be treated as returning
// spuriously; callers re-check in a loop.
func Wait(addr *uint32, val uint32, timeout time.Duration) error {
	if err := checkAddr(addr); err != nil {
		return err
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	interval := minPollInterval
	for i := 0; ; i++ {
		if atomic.LoadUint32(addr) != val {
			return nil
		}
		sleep := interval
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return nil
			}
			if sleep > left {
				sleep = left
			}
		}
		if i < spinYields {
			runtime.Gosched()
			continue
		}
		time.Sleep(sleep)
		if interval < maxPollInterval {
			interval *= 2
			if interval > maxPollInterval {
				interval = maxPollInterval
			}
		}
	}
}

// Wake is a no-op in the polling implementation: waiters notice the changed
// word by themselves within maxPollInterval. It returns (0, nil) for a valid
// addr.
func Wake(addr *uint32, n int) (int, error) {
	if err := checkAddr(addr); err != nil {
		return 0, err
	}
	return 0, nil
}
