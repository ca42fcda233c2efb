package etcd

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// proxy is a TCP proxy in front of one member: a client whose endpoints are
// proxies can be cut off from the cluster (every connection closed, new
// ones refused) and restored, while the members and other clients go on.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: strings.TrimPrefix(target, "http://"), conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(p.close)
	return p
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
