package etcd

import (
	"context"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/etcd/internal/embedcluster"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// cluster is an embedded etcd cluster on loopback, its data in t.TempDir
// (internal/embedcluster, shared with shmlocks-etcd stress --embedded).
type cluster struct {
	*embedcluster.Cluster
	t testing.TB
}

// startCluster starts n members with short heartbeats (10 ms ticks, 100 ms
// elections: leases of 1 s are allowed) and waits for a leader; each of
// tune may change every member's config first.
func startCluster(t testing.TB, n int, tune ...func(*embed.Config)) *cluster {
	t.Helper()
	o := embedcluster.Options{Token: "shmlocks-test"}
	if len(tune) > 0 {
		o.Tune = func(cfg *embed.Config) {
			for _, f := range tune {
				f(cfg)
			}
		}
	}
	ec, err := embedcluster.Start(t.TempDir(), n, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ec.Close)
	return &cluster{Cluster: ec, t: t}
}

// start restarts member i and waits until it serves.
func (c *cluster) start(i int) error { return c.Restart(i) }

// take marks member i down and returns it (the caller stops it).
func (c *cluster) take(i int) *embed.Etcd { return c.Take(i) }

// stop stops member i gracefully.
func (c *cluster) stop(i int) { c.Stop(i) }

// endpoints returns the client URLs of every member.
func (c *cluster) endpoints() []string { return c.MemberEndpoints() }

// waitLeader waits (bounded) until a running member is the leader.
func (c *cluster) waitLeader() int {
	c.t.Helper()
	i := c.WaitLeader(30 * time.Second)
	if i < 0 {
		c.t.Fatal("no leader within 30s")
	}
	return i
}

// client returns a client of every member, closed at cleanup.
func (c *cluster) client(t testing.TB) *clientv3.Client {
	t.Helper()
	return clientOf(t, c.endpoints()...)
}

// clientOf returns a client of the given endpoints, closed at cleanup.
func clientOf(t testing.TB, eps ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
