package embedcluster

import (
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// Proxy is a TCP proxy in front of one member: a client whose endpoints are
// proxies can be cut off from the cluster (every connection closed, new
// ones refused) and restored, while the members and other clients go on.
type Proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
}

// NewProxy starts a proxy to target (host:port, or an http:// URL).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: strings.TrimPrefix(target, "http://"), conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

// Addr is the proxy's address as an endpoint (http://host:port).
func (p *Proxy) Addr() string { return "http://" + p.ln.Addr().String() }

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.pipe(c)
	}
}

func (p *Proxy) pipe(c net.Conn) {
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

// SetCut cuts (every connection closed, new ones refused) or restores.
func (p *Proxy) SetCut(cut bool) {
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

// Close cuts the proxy and stops listening.
func (p *Proxy) Close() { p.SetCut(true); p.ln.Close() }
