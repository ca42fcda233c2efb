package manager_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/shmlocks/shmlocks/manager"
)

// Several names at once: granted all together or not at all, in byte order
// whatever order they are listed in, each with its own fencing token.
func ExampleManager_RequestAll() {
	dir, _ := os.MkdirTemp("", "shmlocks-example")
	defer os.RemoveAll(dir)
	m, err := manager.Open(filepath.Join(dir, "locks"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	err = m.RequestAll(context.Background(), []string{"ledger", "accounts"}, manager.RequestOptions{},
		func(ctx context.Context, locks []*manager.Lock) error {
			for _, l := range locks {
				fmt.Println("holding", l.Name())
			}
			return nil
		})
	fmt.Println(err)
	// Output:
	// holding accounts
	// holding ledger
	// <nil>
}

// A request made with the ctx of Request's callback is made while holding
// the callback's lock: if it closes a wait-for cycle with other processes,
// one request of the cycle fails with ErrDeadlock instead of all of them
// waiting forever.
func ExampleErrDeadlock() {
	dir, _ := os.MkdirTemp("", "shmlocks-example")
	defer os.RemoveAll(dir)
	m, err := manager.Open(filepath.Join(dir, "locks"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	err = m.Request(context.Background(), "from", manager.RequestOptions{}, func(ctx context.Context, _ *manager.Lock) error {
		to, err := m.Acquire(ctx, "to", manager.RequestOptions{}) // ctx: made while holding "from"
		if errors.Is(err, manager.ErrDeadlock) {
			return err // gives "from" back, so that the other party proceeds; retry later
		}
		if err != nil {
			return err
		}
		defer to.Release()
		fmt.Println("moved")
		return nil
	})
	fmt.Println(err)
	// Output:
	// moved
	// <nil>
}
