package manager_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/shmlocks/shmlocks/manager"
)

func ExampleManager_Locker() {
	path, cleanup := tempTable()
	defer cleanup()
	m, err := manager.Open(path, nil)
	if err != nil {
		panic(err)
	}
	defer m.Close()

	// A sync.Locker for the exclusive lock "counter", shared by every
	// process of the table: here it guards a sync.Cond's state too.
	var mu sync.Locker = m.Locker("counter")
	cond := sync.NewCond(mu)
	ready := false
	go func() {
		mu.Lock()
		ready = true
		mu.Unlock()
		cond.Broadcast()
	}()
	mu.Lock()
	for !ready {
		cond.Wait()
	}
	mu.Unlock()
	fmt.Println("ready:", ready)
	// Output: ready: true
}

func ExampleManager_Stats() {
	path, cleanup := tempTable()
	defer cleanup()
	// Stats: count requests; Logger: reaps, latch takeovers, corrupt
	// tables and steals (here on stderr, as text).
	m, err := manager.Open(path, &manager.OpenOptions{
		Stats:  true,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		panic(err)
	}
	defer m.Close()
	ctx := context.Background()
	l, _ := m.Acquire(ctx, "jobs", manager.RequestOptions{})
	_, err = m.Acquire(ctx, "jobs", manager.RequestOptions{IfAvailable: true})
	fmt.Println(err)
	l.Release()

	st, _ := m.Stats()
	for _, o := range []manager.Outcome{manager.OutcomeGranted, manager.OutcomeNotAvailable} {
		fmt.Println(o, st.Requests[manager.Exclusive][o])
	}
	fmt.Printf("agents %d of %d\n", st.Usage.Agents, st.Geometry.MaxAgents)
	// Output:
	// lock "jobs": shmlocks: lock not available
	// granted 1
	// not_available 1
	// agents 1 of 256
}
