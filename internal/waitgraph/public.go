package waitgraph

import "sync/atomic"

var waitGraphOf atomic.Pointer[func(g *Graph) any]

// RegisterPublic sets the function Public calls; package manager
// calls it once, in its init.
func RegisterPublic(f func(g *Graph) any) { waitGraphOf.Store(&f) }

// Public returns g as a manager.WaitGraph (as an any: this package
// cannot name manager's types), for a backend that builds the graph of its
// own locks (the etcd module's WaitGraph); nil if manager is not linked in.
func Public(g *Graph) any {
	f := waitGraphOf.Load()
	if f == nil {
		return nil
	}
	return (*f)(g)
}
