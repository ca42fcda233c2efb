package manager_test

import (
	"context"
	"fmt"

	"github.com/shmlocks/shmlocks/manager"
)

// State replaces an isLocked built on IfAvailable (which takes the lock it
// only wants to look at); WaitUnlocked is waitForUnlock: requests that must
// not start while a token refresh holds "token" wait for it without taking
// it, and Watch follows the name.
func ExampleManager_WaitUnlocked() {
	path, cleanup := tempTable()
	defer cleanup()
	m, err := manager.Open(path, nil)
	if err != nil {
		panic(err)
	}
	defer m.Close()
	ctx := context.Background()

	feed, _ := m.Watch(ctx, "token")
	fmt.Println("watch: locked", (<-feed).Locked())

	refresh, _ := m.Acquire(ctx, "token", manager.RequestOptions{}) // the refresh runs
	st, _ := m.State(ctx, "token")
	fmt.Println("state: locked", st.Locked(), "token", st.Held[0].Token, "shared grantable", st.Grantable(manager.Shared))
	fmt.Println("watch: locked", (<-feed).Locked())

	done := make(chan error)
	go func() { done <- m.WaitUnlocked(ctx, "token", manager.Shared) }()
	refresh.Release() // the refresh is over: the waiting request may start
	fmt.Println("unlocked:", <-done)
	fmt.Println("watch: locked", (<-feed).Locked())
	// Output:
	// watch: locked false
	// state: locked true token 1 shared grantable false
	// watch: locked true
	// unlocked: <nil>
	// watch: locked false
}
