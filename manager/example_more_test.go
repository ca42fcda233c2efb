package manager_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

// Open creates the table on first use with the geometry in the options; a
// process that opens an existing table gets the table's own geometry. Every
// process that cooperates opens the same path.
func ExampleOpen() {
	path, cleanup := tempTable()
	defer cleanup()
	m, err := manager.Open(path, &manager.OpenOptions{
		MaxResources:  64,   // names held or queued at once
		MaxRequests:   256,  // held + pending requests, all processes together
		MaxAgents:     16,   // open Managers, all processes together
		MaxNameLen:    64,   // bytes
		FileMode:      0660, // share the table with the file's group
		Stats:         true, // count requests, waits, steals, reaps
		DeadlockDelay: 200 * time.Millisecond,
		// Let a running request take a free name ahead of the queue while
		// the oldest waiter has waited less than 1ms (throughput), FIFO
		// after that (bounded waiting). Fixed when the file is created.
		Fairness: manager.Bounded(time.Millisecond),
	})
	if err != nil {
		panic(err)
	}
	defer m.Close()

	// A second Manager (in real use: another process) finds the geometry
	// and the fairness in the file and ignores the options' ones.
	other, err := manager.Open(path, &manager.OpenOptions{MaxResources: 4096, Fairness: manager.FIFO})
	if err != nil {
		panic(err)
	}
	defer other.Close()
	fmt.Println("fairness:", other.Fairness())

	_, err = m.Acquire(context.Background(), string(make([]byte, 65)), manager.RequestOptions{})
	fmt.Println("a name over MaxNameLen:", errors.Is(err, manager.ErrNotSupported))
	// Output:
	// fairness: bounded:1ms
	// a name over MaxNameLen: true
}

// State shows who holds a name and who waits for it, without taking it.
func ExampleManager_State() {
	path, cleanup := tempTable()
	defer cleanup()
	m, err := manager.Open(path, nil)
	if err != nil {
		panic(err)
	}
	defer m.Close()
	ctx := context.Background()

	st, _ := m.State(ctx, "report")
	fmt.Println("before:", len(st.Held), "held,", len(st.Pending), "pending")

	l, _ := m.Acquire(ctx, "report", manager.RequestOptions{Mode: manager.Shared})
	st, _ = m.State(ctx, "report")
	fmt.Println("held by us:", st.Held[0].ClientID == m.ClientID(), st.Held[0].Mode, "token", st.Held[0].Token == l.Token())
	l.Release()
	// Output:
	// before: 0 held, 0 pending
	// held by us: true shared token true
}

// AcquireAll takes several names, all or none, in a global order, so two
// callers asking for the same names in different orders never deadlock.
func ExampleManager_AcquireAll() {
	path, cleanup := tempTable()
	defer cleanup()
	m, err := manager.Open(path, nil)
	if err != nil {
		panic(err)
	}
	defer m.Close()
	ctx := context.Background()

	locks, err := m.AcquireAll(ctx, []string{"account:42", "account:7"}, manager.RequestOptions{})
	if err != nil {
		panic(err)
	}
	for _, l := range locks {
		fmt.Println("holding", l.Name())
	}
	// While they are held, neither name is available.
	_, err = m.Acquire(ctx, "account:7", manager.RequestOptions{IfAvailable: true})
	fmt.Println("account:7 available:", err == nil)
	for _, l := range locks {
		l.Release()
	}
	// Unordered output:
	// holding account:42
	// holding account:7
	// account:7 available: false
}

// A holder whose lock is stolen sees Lost close and its fn's ctx end;
// Request then returns ErrStolen. The stealer goes first, ahead of any
// queue, with a larger fencing token: storage that checks tokens rejects
// the late writes of the holder it replaced.
func ExampleLock_Lost() {
	path, cleanup := tempTable()
	defer cleanup()
	holder, err := manager.Open(path, nil)
	if err != nil {
		panic(err)
	}
	defer holder.Close()
	admin, err := manager.Open(path, nil) // in real use, another process
	if err != nil {
		panic(err)
	}
	defer admin.Close()
	ctx := context.Background()

	inside := make(chan uint64)
	done := make(chan error)
	go func() {
		done <- holder.Request(ctx, "migration", manager.RequestOptions{}, func(ctx context.Context, l *manager.Lock) error {
			inside <- l.Token()
			select {
			case <-l.Lost(): // or <-ctx.Done(): both end on a steal
				return errors.New("stopped: lock lost")
			case <-time.After(time.Minute):
				return nil
			}
		})
	}()
	oldToken := <-inside

	l, err := admin.Acquire(ctx, "migration", manager.RequestOptions{Steal: true})
	if err != nil {
		panic(err)
	}
	err = <-done
	fmt.Println("holder's Request: stolen:", errors.Is(err, manager.ErrStolen))
	fmt.Println("stealer's token is larger:", l.Token() > oldToken)
	l.Release()
	// Output:
	// holder's Request: stolen: true
	// stealer's token is larger: true
}
