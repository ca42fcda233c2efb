package etcd

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// cluster is an embedded etcd cluster on loopback, its data in t.TempDir.
type cluster struct {
	t       testing.TB
	cfgs    []*embed.Config
	mu      sync.Mutex
	members []*embed.Etcd // nil: stopped (mu)
}

// freePorts returns n loopback ports that were free a moment ago.
func freePorts(t testing.TB, n int) []int {
	var ls []net.Listener
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// startCluster starts n members with short heartbeats (10 ms ticks, 100 ms
// elections: leases of 1 s are allowed) and waits for a leader; each of
// tune may change every member's config first.
func startCluster(t testing.TB, n int, tune ...func(*embed.Config)) *cluster {
	t.Helper()
	ports := freePorts(t, 2*n)
	c := &cluster{t: t}
	var initial []string
	for i := 0; i < n; i++ {
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, ports[2*i+1]))
	}
	dir := t.TempDir()
	for i := 0; i < n; i++ {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = fmt.Sprintf("%s/m%d", dir, i)
		cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]))
		pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]))
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = "shmlocks-test"
		cfg.TickMs, cfg.ElectionMs = 10, 100
		cfg.UnsafeNoFsync = true
		cfg.LogLevel = "error"
		cfg.LogOutputs = []string{"stderr"}
		for _, f := range tune {
			f(cfg)
		}
		c.cfgs = append(c.cfgs, cfg)
	}
	c.members = make([]*embed.Etcd, n)
	errs := make(chan error, n)
	for i := range c.cfgs {
		go func(i int) { errs <- c.start(i) }(i)
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(c.stopAll)
	c.waitLeader()
	return c
}

// start starts (or restarts) member i and waits until it serves.
func (c *cluster) start(i int) error {
	var e *embed.Etcd
	var err error
	for try := 0; try < 50; try++ { // a restart may find its port still in use for a moment
		if e, err = embed.StartEtcd(c.cfgs[i]); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("start member %d: %w", i, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return fmt.Errorf("member %d not ready in 30s", i)
	}
	c.mu.Lock()
	c.members[i] = e
	c.mu.Unlock()
	return nil
}

func (c *cluster) member(i int) *embed.Etcd {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i]
}

func (c *cluster) take(i int) *embed.Etcd {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.members[i]
	c.members[i] = nil
	return e
}

func (c *cluster) stop(i int) {
	if e := c.take(i); e != nil {
		e.Close()
	}
}

// hardStop kills member i: raft stops at once (no leadership transfer, as
// Close's graceful stop does), then its listeners and connections go.
func (c *cluster) hardStop(i int) {
	if e := c.take(i); e != nil {
		e.Server.HardStop()
		e.Close()
	}
}

func (c *cluster) stopAll() {
	for i := range c.members {
		c.stop(i)
	}
}

// endpoints returns the client URLs of every member.
func (c *cluster) endpoints() []string {
	var eps []string
	for _, cfg := range c.cfgs {
		eps = append(eps, cfg.AdvertiseClientUrls[0].String())
	}
	return eps
}

// leader returns the index of the current leader (-1: none seen).
func (c *cluster) leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.members {
		if e != nil && e.Server.Leader() != 0 && e.Server.Leader() == e.Server.MemberID() {
			return i
		}
	}
	return -1
}

// waitLeader waits (bounded) until a running member is the leader.
func (c *cluster) waitLeader() int {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if i := c.leader(); i >= 0 {
			return i
		}
		if time.Now().After(deadline) {
			c.t.Fatal("no leader within 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
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
