package etcd_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/shmlocks/shmlocks/etcd"
	"github.com/shmlocks/shmlocks/manager"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The same program as on the table file, with one line changed: how the
// Manager is opened. (Not run by go test: it needs an etcd at
// localhost:2379.)
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	m, err := etcd.Open(ctx, cli, "/myapp/locks", &etcd.Options{TTL: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	err = m.Request(ctx, "orders/42", manager.RequestOptions{}, func(ctx context.Context, l *manager.Lock) error {
		// ctx is cancelled if the lock is stolen or the lease is lost;
		// pass l.Token() to the resource so that it can refuse stale writers.
		fmt.Println("holding", l.Name(), "token", l.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
