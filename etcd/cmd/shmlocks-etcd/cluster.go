package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// cluster is an embedded etcd cluster on loopback (stress --embedded): its
// members can be killed and restarted, and every client reaches a member
// through a TCP proxy that can be cut, as a network partition (or the death
// of the member's process) cuts its connections.
type cluster struct {
	dir     string
	cfgs    []*embed.Config
	proxies []*proxy
	mu      sync.Mutex
	members []*embed.Etcd // nil: down
}

func freePorts(n int) ([]int, error) {
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

// startCluster starts n members (10 ms ticks, 100 ms elections, no fsync)
// in a temporary directory, and a proxy in front of each.
func startCluster(n int) (*cluster, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "shmlocks-etcd-")
	if err != nil {
		return nil, err
	}
	c := &cluster{dir: dir, members: make([]*embed.Etcd, n)}
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
		cfg.InitialClusterToken = "shmlocks-etcd-stress"
		cfg.TickMs, cfg.ElectionMs = 10, 100
		cfg.UnsafeNoFsync = true
		cfg.LogLevel = "error"
		cfg.LogOutputs = []string{"stderr"}
		c.cfgs = append(c.cfgs, cfg)
		p, err := newProxy(cu.Host)
		if err != nil {
			c.stop()
			return nil, err
		}
		c.proxies = append(c.proxies, p)
	}
	errs := make(chan error, n)
	for i := range c.cfgs {
		go func() { errs <- c.start(i) }()
	}
	var first error
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first == nil && c.waitLeader(30*time.Second) < 0 {
		first = errors.New("no leader in 30s")
	}
	if first != nil {
		c.stop()
		return nil, first
	}
	return c, nil
}

// endpoints are the proxies' addresses: what clients are given.
func (c *cluster) endpoints() []string {
	var eps []string
	for _, p := range c.proxies {
		eps = append(eps, p.addr())
	}
	return eps
}

// start starts (or restarts, on its data directory) member i.
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
	c.proxies[i].setCut(false)
	return nil
}

// kill stops member i as a killed process stops: raft at once (no
// leadership transfer), its client connections dropped.
func (c *cluster) kill(i int) {
	c.mu.Lock()
	e := c.members[i]
	c.members[i] = nil
	c.mu.Unlock()
	if e == nil {
		return
	}
	e.Server.HardStop()
	c.proxies[i].setCut(true)
	e.Close()
}

// leader is the index of a running member that leads (-1: none).
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

// follower is the index of a running member that does not lead (-1: none).
func (c *cluster) follower() int {
	l := c.leader()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.members {
		if e != nil && i != l {
			return i
		}
	}
	return -1
}

func (c *cluster) waitLeader(d time.Duration) int {
	deadline := time.Now().Add(d)
	for {
		if i := c.leader(); i >= 0 {
			return i
		}
		if time.Now().After(deadline) {
			return -1
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stop stops every member and proxy and removes the data.
func (c *cluster) stop() {
	for _, p := range c.proxies {
		p.close()
	}
	for i := range c.members {
		c.kill(i)
	}
	os.RemoveAll(c.dir)
}

// proxy is a TCP proxy in front of one member.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
}

func newProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

func (p *proxy) addr() string { return "http://" + p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.pipe(c)
	}
}

func (p *proxy) pipe(c net.Conn) {
	p.mu.Lock()
	cut := p.cut
	p.mu.Unlock()
	if cut {
		c.Close()
		return
	}
	u, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		c.Close()
		u.Close()
		return
	}
	p.conns[c], p.conns[u] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := func() {
		c.Close()
		u.Close()
		p.mu.Lock()
		delete(p.conns, c)
		delete(p.conns, u)
		p.mu.Unlock()
	}
	go func() { io.Copy(u, c); done() }()
	go func() { io.Copy(c, u); done() }()
}

// setCut cuts (every connection closed, new ones refused) or restores.
func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	p.cut = cut
	var cs []net.Conn
	if cut {
		for c := range p.conns {
			cs = append(cs, c)
		}
	}
	p.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

func (p *proxy) close() { p.setCut(true); p.ln.Close() }
