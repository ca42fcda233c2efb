package waitgraph

import (
	"fmt"
	"slices"
	"strings"

	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/table"
)

// Reader reads the table's held and pending requests, as table.Snapshot
// with an agent does: each bucket under its latch, so that the view of each
// name is consistent but two names may be read at different instants.
type Reader func() (held, pending []table.LockInfo, err error)

// Confirmed is the one way to find real cycles: it reads the graph, lets
// find pick the cycles of interest in it (each a list of nodes, as
// CycleThrough returns), and, if find picked any, reads the table again and
// keeps only the cycles that the second read confirms: every node the same
// request (slot and serial) in the same state, and every edge still there.
// A request that waited, or was held, at both reads did so throughout, so a
// kept cycle is not a phantom of a snapshot that latched one bucket at a
// time. It returns the graph of the first read and the kept cycles, in
// find's order, with their node numbers in that graph.
func Confirmed(read Reader, find func(g *Graph) [][]int) (*Graph, [][]int, error) {
	held, pending, err := read()
	if err != nil {
		return nil, nil, err
	}
	g := New(held, pending)
	cycles := find(g)
	if len(cycles) == 0 {
		return g, nil, nil
	}
	if held, pending, err = read(); err != nil {
		return nil, nil, err
	}
	g2 := New(held, pending)
	var kept [][]int
	for _, c := range cycles {
		if sameRequests(g, g2, c) {
			kept = append(kept, c)
		}
	}
	return g, kept, nil
}

// sameRequests reports whether every node of cycle c in g is in g2 as the
// same request (slot and serial) in the same state, agent, name, mode and
// tag, and every edge of c is in g2 too. Read at t1 (g) and again at t2
// (g2): a waiting request with the same serial waited throughout, a held
// one was held throughout, so every edge of the cycle held throughout
// [t1, t2], and the cycle is not a phantom of a snapshot that latched one
// bucket at a time.
func sameRequests(g, g2 *Graph, c []int) bool {
	idx := make([]int, len(c))
	for k, i := range c {
		n := &g.Nodes[i]
		j := -1
		lo, hi := g2.NHeld, len(g2.Nodes)
		if g.Held(i) {
			lo, hi = 0, g2.NHeld
		}
		for x := lo; x < hi; x++ {
			if m := &g2.Nodes[x]; m.Slot == n.Slot && m.Serial == n.Serial {
				if m.Agent != n.Agent || m.Name != n.Name || m.Mode != n.Mode || m.Tag != n.Tag || m.Since != n.Since {
					return false
				}
				j = x
				break
			}
		}
		if j < 0 {
			return false
		}
		idx[k] = j
	}
	for k := range idx {
		if !slices.Contains(g2.Out[idx[k]], idx[(k+1)%len(idx)]) {
			return false
		}
	}
	return true
}

// Describe names cycle c of g for an error message or the dump: each
// request with its name, mode, state, PID and client id, in wait order.
func (g *Graph) Describe(c []int) string {
	var b strings.Builder
	for k, i := range c {
		n := &g.Nodes[i]
		if k > 0 {
			b.WriteString(" -> ")
		}
		state := "waiting for"
		if g.Held(i) {
			state = "holding"
		}
		mode := "exclusive"
		if n.Mode == table.ModeShared {
			mode = "shared"
		}
		fmt.Fprintf(&b, "pid %d (client %s) %s %q (%s)", n.PID, inspect.ClientID(n.Nonce), state, n.Name, mode)
	}
	b.WriteString(" -> back to the first")
	return b.String()
}
