package etcd

import (
	"testing"

	"github.com/shmlocks/shmlocks/etcd/internal/embedcluster"
)

// proxy is a TCP proxy in front of one member (internal/embedcluster): a
// client whose endpoints are proxies can be cut off from the cluster and
// restored, while the members and other clients go on.
type proxy struct{ *embedcluster.Proxy }

// newProxy starts a proxy to target (a member's client URL), closed at
// cleanup.
func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	p, err := embedcluster.NewProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return &proxy{p}
}

func (p *proxy) addr() string { return p.Addr() }

// setCut cuts (every connection closed, new ones refused) or restores.
func (p *proxy) setCut(cut bool) { p.SetCut(cut) }
