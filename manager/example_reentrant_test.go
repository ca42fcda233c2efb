package manager_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

// WithLock: code that holds a lock calls a helper that requests the same
// lock; through the ctx, the helper's request is granted at once instead of
// deadlocking (the reentrant lock 002_d2b532589157d127.txt wished for). The
// ctx of Request's fn carries its lock the same way.
func ExampleWithLock() {
	path, cleanup := tempTable()
	defer cleanup()
	m, err := manager.Open(path, nil)
	if err != nil {
		panic(err)
	}
	defer m.Close()

	saveSettings := func(ctx context.Context) error {
		// The helper takes the lock itself: callers need not know.
		return m.Request(ctx, "settings", manager.RequestOptions{}, func(ctx context.Context, l *manager.Lock) error {
			fmt.Println("helper holds settings, token", l.Token())
			return nil
		})
	}
	ctx := context.Background()
	l, _ := m.Acquire(ctx, "settings", manager.RequestOptions{})
	fmt.Println("caller holds settings, token", l.Token())
	fmt.Println("helper:", saveSettings(manager.WithLock(ctx, l)))
	l.Release()

	// Shared held, exclusive asked through the same ctx: an upgrade that
	// could never be granted. It fails at once.
	r, _ := m.Acquire(ctx, "settings", manager.RequestOptions{Mode: manager.Shared})
	err = saveSettings(manager.WithLock(ctx, r))
	fmt.Println("upgrade:", errors.Is(err, manager.ErrWouldDeadlock))
	r.Release()
	// Output:
	// caller holds settings, token 1
	// helper holds settings, token 1
	// helper: <nil>
	// upgrade: true
}

// The seed's fair lock (公平锁) and waiting lock (等侯锁,
// 002_d2b532589157d127.txt: "open the mask, then close the mask" must run in
// the order asked): Request grants in FIFO order per request, across
// goroutines and processes; a waiting request costs no CPU.
func Example_fairLock() {
	path, cleanup := tempTable()
	defer cleanup()
	m, err := manager.Open(path, nil)
	if err != nil {
		panic(err)
	}
	defer m.Close()
	ctx := context.Background()

	first, _ := m.Acquire(ctx, "mask", manager.RequestOptions{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var order []string
	for i, step := range []string{"open mask", "load data", "close mask"} {
		wg.Add(1)
		queued := make(chan struct{})
		go func() {
			defer wg.Done()
			close(queued)
			m.Request(ctx, "mask", manager.RequestOptions{}, func(ctx context.Context, l *manager.Lock) error {
				mu.Lock()
				order = append(order, step)
				mu.Unlock()
				return nil
			})
		}()
		<-queued
		waitQueued(m, "mask", i+1) // queue them in this order
	}
	first.Release()
	wg.Wait()
	fmt.Println(order)
	// Output:
	// [open mask load data close mask]
}

// waitQueued waits until n requests are queued on name (the example queues
// its steps one after the other).
func waitQueued(m *manager.Manager, name string, n int) {
	for {
		s, _ := m.Query(context.Background())
		c := 0
		for _, p := range s.Pending {
			if p.Name == name {
				c++
			}
		}
		if c >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}
