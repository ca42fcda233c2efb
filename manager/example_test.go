package manager_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/shmlocks/shmlocks/manager"
)

// tempTable returns a fresh table path (examples use a temporary directory;
// applications pick a path every cooperating process knows).
func tempTable() (string, func()) {
	dir, _ := os.MkdirTemp("", "shmlocks-example-")
	return filepath.Join(dir, "app.locks"), func() { os.RemoveAll(dir) }
}

func ExampleManager_Request() {
	path, cleanup := tempTable()
	defer cleanup()
	m, err := manager.Open(path, nil)
	if err != nil {
		panic(err)
	}
	defer m.Close()

	err = m.Request(context.Background(), "invoices", manager.RequestOptions{}, func(ctx context.Context, l *manager.Lock) error {
		// Exclusive across every process using the table. ctx is cancelled
		// if the lock is stolen; pass the token to the storage you guard.
		fmt.Println("holding", l.Name(), l.Mode(), "token", l.Token())
		return nil
	})
	fmt.Println("released, err =", err)

	// IfAvailable: fn runs with a nil Lock when the lock is taken.
	held, _ := m.Acquire(context.Background(), "invoices", manager.RequestOptions{})
	_ = m.Request(context.Background(), "invoices", manager.RequestOptions{IfAvailable: true}, func(ctx context.Context, l *manager.Lock) error {
		fmt.Println("available:", l != nil)
		return nil
	})
	held.Release()
	// Output:
	// holding invoices exclusive token 1
	// released, err = <nil>
	// available: false
}

func ExampleManager_Acquire() {
	path, cleanup := tempTable()
	defer cleanup()
	m, err := manager.Open(path, nil)
	if err != nil {
		panic(err)
	}
	defer m.Close()
	ctx := context.Background()

	r1, _ := m.Acquire(ctx, "config", manager.RequestOptions{Mode: manager.Shared})
	r2, _ := m.Acquire(ctx, "config", manager.RequestOptions{Mode: manager.Shared})
	fmt.Println("two readers:", r1.Mode(), r2.Mode())

	_, err = m.Acquire(ctx, "config", manager.RequestOptions{IfAvailable: true})
	fmt.Println("writer if available:", errors.Is(err, manager.ErrNotAvailable))

	// Steal takes the lock from its holders; they see Lost() close.
	w, _ := m.Acquire(ctx, "config", manager.RequestOptions{Steal: true})
	<-r1.Lost()
	fmt.Println("reader's release after the steal:", errors.Is(r1.Release(), manager.ErrStolen))
	fmt.Println("writer token > reader token:", w.Token() > r2.Token())
	w.Release()
	// Output:
	// two readers: shared shared
	// writer if available: true
	// reader's release after the steal: true
	// writer token > reader token: true
}

func ExampleManager_Query() {
	path, cleanup := tempTable()
	defer cleanup()
	m, err := manager.Open(path, nil)
	if err != nil {
		panic(err)
	}
	defer m.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	l, _ := m.Acquire(ctx, "db", manager.RequestOptions{})
	waiting := make(chan error, 1)
	go func() {
		_, err := m.Acquire(ctx, "db", manager.RequestOptions{Mode: manager.Shared})
		waiting <- err
	}()
	for {
		snap, _ := m.Query(ctx)
		if len(snap.Pending) == 1 {
			fmt.Printf("held: %s %s by pid==self %v\n", snap.Held[0].Name, snap.Held[0].Mode, snap.Held[0].PID == os.Getpid())
			fmt.Printf("pending: %s %s\n", snap.Pending[0].Name, snap.Pending[0].Mode)
			break
		}
	}
	cancel() // withdraw the pending request
	fmt.Println("aborted:", errors.Is(<-waiting, manager.ErrAborted))
	l.Release()
	// Output:
	// held: db exclusive by pid==self true
	// pending: db shared
	// aborted: true
}
