package futex

import (
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// deadline bounds every blocking step in these tests so that a broken
// implementation fails instead of hanging.
const deadline = 20 * time.Second

// within runs f in a goroutine and fails the test if it does not return within d.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}

func TestPollingMatchesBuild(t *testing.T) {
	t.Logf("GOOS=%s Polling=%v", runtime.GOOS, Polling)
	if runtime.GOOS != "linux" && !Polling {
		t.Fatal("non-linux build must use the polling implementation")
	}
}

func TestWaitReturnsImmediatelyWhenValueDiffers(t *testing.T) {
	word := new(uint32)
	atomic.StoreUint32(word, 7)
	within(t, deadline, "Wait with differing value", func() {
		// No timeout: if Wait did not notice the difference it would block.
		if err := Wait(word, 6, 0); err != nil {
			t.Errorf("Wait: %v", err)
		}
	})
}

func TestWaitTimeout(t *testing.T) {
	word := new(uint32)
	const timeout = 100 * time.Millisecond
	var elapsed time.Duration
	within(t, deadline, "Wait with timeout", func() {
		start := time.Now()
		if err := Wait(word, 0, timeout); err != nil {
			t.Errorf("Wait: %v", err)
		}
		elapsed = time.Since(start)
	})
	// Spurious returns are allowed by the contract but do not happen in
	// practice for an unshared word; assert a loose lower bound only.
	if elapsed < timeout/2 {
		t.Errorf("Wait returned after %v, want roughly %v", elapsed, timeout)
	}
	t.Logf("Wait(%v) returned after %v", timeout, elapsed)
}

func TestWaitLoopWithTimeoutsObservesChange(t *testing.T) {
	word := new(uint32)
	go func() {
		atomic.StoreUint32(word, 1)
		if _, err := Wake(word, 1); err != nil {
			t.Errorf("Wake: %v", err)
		}
	}()
	within(t, deadline, "wait loop", func() {
		for atomic.LoadUint32(word) == 0 {
			if err := Wait(word, 0, 10*time.Millisecond); err != nil {
				t.Errorf("Wait: %v", err)
				return
			}
		}
	})
}

func TestWakeReleasesWaiters(t *testing.T) {
	const waiters = 4
	word := new(uint32)
	var wg sync.WaitGroup
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for atomic.LoadUint32(word) == 0 {
				// No timeout: only a Wake (or the value check) can release us.
				if err := Wait(word, 0, 0); err != nil {
					t.Errorf("Wait: %v", err)
					return
				}
			}
		}()
	}

	if !Polling {
		// Prove that Wake really finds sleepers on this address: without changing
		// the word, wake one at a time until the kernel reports a woken waiter.
		// The woken goroutine sees 0 again and goes back to sleep.
		stop := time.Now().Add(deadline)
		for {
			n, err := Wake(word, 1)
			if err != nil {
				t.Fatalf("Wake: %v", err)
			}
			if n > 0 {
				break
			}
			if time.Now().After(stop) {
				t.Fatal("no waiter was ever found asleep on the word")
			}
			runtime.Gosched()
		}
	}

	atomic.StoreUint32(word, 1)
	n, err := Wake(word, 0) // n <= 0: wake all
	if err != nil {
		t.Fatalf("Wake: %v", err)
	}
	if Polling && n != 0 {
		t.Errorf("polling Wake returned %d, want 0", n)
	}
	if n > waiters {
		t.Errorf("Wake woke %d, more than the %d waiters", n, waiters)
	}
	within(t, deadline, "all waiters", wg.Wait)
}

func TestWakeWithoutWaiters(t *testing.T) {
	word := new(uint32)
	for _, n := range []int{-1, 0, 1, math.MaxInt} {
		got, err := Wake(word, n)
		if err != nil {
			t.Fatalf("Wake(n=%d): %v", n, err)
		}
		if got != 0 {
			t.Fatalf("Wake(n=%d) = %d with no waiters, want 0", n, got)
		}
	}
}

func TestNilAddr(t *testing.T) {
	if err := Wait(nil, 0, time.Millisecond); !errors.Is(err, ErrInvalidAddr) {
		t.Errorf("Wait(nil) = %v, want ErrInvalidAddr", err)
	}
	if _, err := Wake(nil, 1); !errors.Is(err, ErrInvalidAddr) {
		t.Errorf("Wake(nil) = %v, want ErrInvalidAddr", err)
	}
}
