// Package embedcluster runs an embedded etcd cluster on loopback for the
// etcd module's tests and for shmlocks-etcd stress --embedded: members
// that can be stopped, killed and restarted on their data, and TCP proxies
// that can cut a client off from a member as a network partition would.
// It is not public API (internal/).
package embedcluster

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Options of Start. Zero fields take the defaults.
type Options struct {
	// Token is the initial cluster token (default "shmlocks").
	Token string
	// Proxies puts a Proxy in front of every member: Endpoints are then
	// the proxies' addresses, and Kill cuts the member's proxy too.
	Proxies bool
	// Tune, when not nil, may change each member's config before it starts.
	Tune func(*embed.Config)
}

// Cluster is an embedded cluster on loopback. Every member ticks every
// 10 ms and elects in 100 ms (so leases of 1 s are allowed) and does not
// fsync.
type Cluster struct {
	cfgs    []*embed.Config
	proxies []*Proxy // with Options.Proxies, one per member
	mu      sync.Mutex
	members []*embed.Etcd // nil: down (mu)
}

// FreePorts returns n loopback ports that were free a moment ago.
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	var ports []int
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Start starts n members, their data under dir, and waits for a leader.
// On error nothing is left running.
func Start(dir string, n int, o Options) (*Cluster, error) {
	if o.Token == "" {
		o.Token = "shmlocks"
	}
	ports, err := FreePorts(2 * n)
	if err != nil {
		return nil, err
	}
	c := &Cluster{members: make([]*embed.Etcd, n)}
	var initial []string
	for i := 0; i < n; i++ {
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, ports[2*i+1]))
	}
	for i := 0; i < n; i++ {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = filepath.Join(dir, cfg.Name)
		cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]))
		pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]))
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = o.Token
		cfg.TickMs, cfg.ElectionMs = 10, 100
		cfg.UnsafeNoFsync = true
		cfg.LogLevel = "error"
		cfg.LogOutputs = []string{"stderr"}
		if o.Tune != nil {
			o.Tune(cfg)
		}
		c.cfgs = append(c.cfgs, cfg)
		if o.Proxies {
			p, err := NewProxy(cu.Host)
			if err != nil {
				c.Close()
				return nil, err
			}
			c.proxies = append(c.proxies, p)
		}
	}
	errs := make(chan error, n)
	for i := range c.cfgs {
		go func() { errs <- c.Restart(i) }()
	}
	var first error
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first == nil && c.WaitLeader(30*time.Second) < 0 {
		first = errors.New("embedcluster: no leader in 30s")
	}
	if first != nil {
		c.Close()
		return nil, first
	}
	return c, nil
}

// Restart starts member i (again, on its data directory) and waits until
// it serves; its proxy, if any, lets clients through again.
func (c *Cluster) Restart(i int) error {
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
	if c.proxies != nil {
		c.proxies[i].SetCut(false)
	}
	return nil
}

// Member is member i (nil: down).
func (c *Cluster) Member(i int) *embed.Etcd {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i]
}

// Take marks member i down and returns it for the caller to stop (nil:
// down already).
func (c *Cluster) Take(i int) *embed.Etcd {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.members[i]
	c.members[i] = nil
	return e
}

// Stop stops member i gracefully (a leader hands over its leadership).
func (c *Cluster) Stop(i int) {
	if e := c.Take(i); e != nil {
		e.Close()
	}
}

// Kill stops member i as a killed process stops: raft at once (no
// leadership transfer), then its proxy, if any, is cut and its listeners
// and connections go.
func (c *Cluster) Kill(i int) {
	e := c.Take(i)
	if e == nil {
		return
	}
	e.Server.HardStop()
	if c.proxies != nil {
		c.proxies[i].SetCut(true)
	}
	e.Close()
}

// Close stops every member and proxy (not the data).
func (c *Cluster) Close() {
	for _, p := range c.proxies {
		p.Close()
	}
	for i := range c.members {
		c.Kill(i)
	}
}

// Endpoints are what clients are given: the proxies' addresses with
// Options.Proxies, else the members' client URLs.
func (c *Cluster) Endpoints() []string {
	if c.proxies != nil {
		var eps []string
		for _, p := range c.proxies {
			eps = append(eps, p.Addr())
		}
		return eps
	}
	return c.MemberEndpoints()
}

// MemberEndpoints are the members' own client URLs.
func (c *Cluster) MemberEndpoints() []string {
	var eps []string
	for _, cfg := range c.cfgs {
		eps = append(eps, cfg.AdvertiseClientUrls[0].String())
	}
	return eps
}

// Proxies are the proxies in front of the members (Options.Proxies).
func (c *Cluster) Proxies() []*Proxy { return c.proxies }

// Leader is the index of a running member that leads (-1: none seen).
func (c *Cluster) Leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.members {
		if e != nil && e.Server.Leader() != 0 && e.Server.Leader() == e.Server.MemberID() {
			return i
		}
	}
	return -1
}

// Follower is the index of a running member that does not lead (-1: none).
func (c *Cluster) Follower() int {
	l := c.Leader()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.members {
		if e != nil && i != l {
			return i
		}
	}
	return -1
}

// WaitLeader waits up to d for a running member to lead and returns its
// index (-1: none in time).
func (c *Cluster) WaitLeader(d time.Duration) int {
	deadline := time.Now().Add(d)
	for {
		if i := c.Leader(); i >= 0 {
			return i
		}
		if time.Now().After(deadline) {
			return -1
		}
		time.Sleep(5 * time.Millisecond)
	}
}
