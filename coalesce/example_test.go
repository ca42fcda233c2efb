package coalesce_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shmlocks/shmlocks/coalesce"
	"github.com/shmlocks/shmlocks/manager"
)

// Many callers ask for the same idempotent work at once ("fetch the user's
// profile"); one runs it, the others get its result (the seed's asyncOne,
// 002_d2b532589157d127.txt: 归一锁). Here every caller has a Manager of its
// own, as if each were another process on the table.
func ExampleGroup_Do() {
	dir, _ := os.MkdirTemp("", "shmlocks-example-")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "app.locks")
	groups := make([]*coalesce.Group, 5)
	var first *manager.Manager
	for i := range groups {
		m, err := manager.Open(path, nil)
		if err != nil {
			panic(err)
		}
		defer m.Close()
		if first == nil {
			first = m
		}
		groups[i] = coalesce.New(m)
	}
	ctx := context.Background()

	var fetches atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	fetchProfile := func(ctx context.Context) ([]byte, error) {
		if fetches.Add(1) == 1 {
			close(started)
		}
		<-release // a slow request to the profile service
		return []byte(`{"name":"Ada"}`), nil
	}
	results := make([]string, len(groups))
	var wg sync.WaitGroup
	call := func(i int) {
		defer wg.Done()
		res, shared, err := groups[i].Do(ctx, "profile:42", fetchProfile)
		results[i] = fmt.Sprintf("%d: %s shared=%v err=%v", i, res, shared, err)
	}
	wg.Add(len(groups))
	go call(0)
	<-started // caller 0 leads
	for i := 1; i < len(groups); i++ {
		go call(i)
	}
	// The flight's lock is "-c:" and the key: the followers queue on it.
	waitQueued(first, "-c:profile:42", len(groups)-1)
	close(release)
	wg.Wait()
	for _, r := range results {
		fmt.Println(r)
	}
	fmt.Println("fetches:", fetches.Load())

	// A recent result may be reused without a flight: DoWithin.
	res, shared, _ := groups[1].DoWithin(ctx, "profile:42", time.Minute, fetchProfile)
	fmt.Println(string(res), shared, "fetches:", fetches.Load())
	// Output:
	// 0: {"name":"Ada"} shared=false err=<nil>
	// 1: {"name":"Ada"} shared=true err=<nil>
	// 2: {"name":"Ada"} shared=true err=<nil>
	// 3: {"name":"Ada"} shared=true err=<nil>
	// 4: {"name":"Ada"} shared=true err=<nil>
	// fetches: 1
	// {"name":"Ada"} true fetches: 1
}

// waitQueued waits until n requests are queued on name.
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
