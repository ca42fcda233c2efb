// Package waitgraph is the wait-for graph of a lock table
// (docs/multi-and-deadlock.md): who waits for whom, its cycles, and the one
// way to read them without phantoms (Confirmed). It knows nothing of the
// Manager: the manager's deadlock detector and shmlocks dump both use it.
package waitgraph

import (
	"slices"

	"github.com/shmlocks/shmlocks/table"
)

// Graph is the wait-for graph of one table snapshot (table.Snapshot). Its
// nodes are requests: Nodes[:len(held)] the held locks, then the pending
// requests, in the order Snapshot returned them. Edges go
//
//   - from a waiting request to every holder of its name whose mode conflicts
//     with its own (it waits for their release: pg_blocking_pids' hard edges);
//   - from a waiting request to the earlier waiters in its name's queue whose
//     mode conflicts with its own (FIFO: it is granted only after them, the
//     soft edges of PostgreSQL), or to a later one of them that waits for the
//     rest (see New);
//   - from a held lock to the waiting request of the same agent whose task
//     holds it, named by the hold's task tag (table.TaskTag): that hold is released
//     only after that request is granted. A hold without a tag has no edge
//     out: nothing says that the goroutine holding it waits for anything.
//
// A cycle in this graph is a deadlock if it stays the same while it is read
// (see Confirmed): every waiting request in it waits for the next node,
// which is released only after the node after it is granted, and so on round.
type Graph struct {
	Nodes []table.LockInfo
	NHeld int     // Nodes[i] is held for i < NHeld, pending otherwise
	Out   [][]int // Out[i]: the nodes node i waits for

	pendingAt map[uint32]int // pending node by slot
}

// conflicts reports whether requests in modes a and b cannot hold together.
func conflicts(a, b uint32) bool { return a != table.ModeShared || b != table.ModeShared }

// New builds the graph of a snapshot (held and pending as returned by
// table.Snapshot: pending in queue order per name).
func New(held, pending []table.LockInfo) *Graph {
	g := &Graph{NHeld: len(held), pendingAt: make(map[uint32]int, len(pending))}
	g.Nodes = make([]table.LockInfo, 0, len(held)+len(pending))
	g.Nodes = append(append(g.Nodes, held...), pending...)
	g.Out = make([][]int, len(g.Nodes))
	holders := map[string][]int{}
	for i := range held {
		holders[held[i].Name] = append(holders[held[i].Name], i)
	}
	// Per name, the queue so far: its last exclusive waiter and the run of
	// shared waiters after it. A waiter's soft edges go to the earlier
	// conflicting waiters it does not reach through another soft edge: an
	// exclusive one to that run and that exclusive waiter (which waits for
	// everything before it), a shared one to that exclusive waiter only.
	// The graph then has the transitive closure of the full edge set (so
	// the same cycles, through the same requests) with O(queue) edges, not
	// O(queue²): a name with thousands of waiters stays cheap.
	type queueTail struct {
		lastEx int // the last exclusive waiter, or -1
		run    []int
	}
	queue := map[string]*queueTail{}
	type waiterKey struct{ agent, slot uint32 }
	waiters := map[waiterKey]int{}
	for j := range pending {
		i := len(held) + j
		w := &g.Nodes[i]
		for _, h := range holders[w.Name] {
			if conflicts(w.Mode, g.Nodes[h].Mode) {
				g.Out[i] = append(g.Out[i], h)
			}
		}
		q := queue[w.Name]
		if q == nil {
			q = &queueTail{lastEx: -1}
			queue[w.Name] = q
		}
		if w.Mode != table.ModeShared {
			g.Out[i] = append(g.Out[i], q.run...)
		}
		if q.lastEx >= 0 {
			g.Out[i] = append(g.Out[i], q.lastEx)
		}
		if w.Mode == table.ModeShared {
			q.run = append(q.run, i)
		} else {
			q.lastEx, q.run = i, nil
		}
		waiters[waiterKey{w.Agent, w.Slot}] = i
		g.pendingAt[w.Slot] = i
	}
	for i := range held {
		h := &g.Nodes[i]
		slot, tagged := table.TagSlot(h.Tag)
		if !tagged {
			continue
		}
		if j, ok := waiters[waiterKey{h.Agent, slot}]; ok && table.TagNames(h.Tag, g.Nodes[j].Slot, g.Nodes[j].Serial) {
			g.Out[i] = append(g.Out[i], j)
		}
	}
	return g
}

// Held reports whether node i is a held lock (else a pending request).
func (g *Graph) Held(i int) bool { return i < g.NHeld }

// Find returns the node of the pending request at slot with serial, or -1.
func (g *Graph) Find(slot, serial uint32) int {
	if i, ok := g.pendingAt[slot]; ok && g.Nodes[i].Serial == serial {
		return i
	}
	return -1
}

// Later reports whether pending node i started waiting after pending node j
// (enqueue time, then slot): the order of the victim rule. Every process
// computes it from the same table words, so they all agree.
func (g *Graph) Later(i, j int) bool {
	a, b := &g.Nodes[i], &g.Nodes[j]
	if a.Since != b.Since {
		return a.Since > b.Since
	}
	return a.Slot > b.Slot
}

// InCycle reports, per node, whether it is on some cycle: in a strongly
// connected component of more than one node, or waiting for itself
// (Tarjan's algorithm, O(nodes + edges)). A check looks for its victims
// only among those.
func (g *Graph) InCycle() []bool {
	n := len(g.Nodes)
	in := make([]bool, n)
	index, low := make([]int, n), make([]int, n)
	for i := range index {
		index[i] = -1
	}
	onStack := make([]bool, n)
	var stack []int
	next := 0
	// Iterative: a queue of thousands of waiters makes a deep path.
	type frame struct{ v, e int }
	for root := 0; root < n; root++ {
		if index[root] >= 0 {
			continue
		}
		frames := []frame{{root, 0}}
		index[root], low[root] = next, next
		next++
		stack = append(stack, root)
		onStack[root] = true
		for len(frames) > 0 {
			f := &frames[len(frames)-1]
			v := f.v
			if f.e < len(g.Out[v]) {
				w := g.Out[v][f.e]
				f.e++
				switch {
				case w == v:
					in[v] = true
				case index[w] < 0:
					index[w], low[w] = next, next
					next++
					stack = append(stack, w)
					onStack[w] = true
					frames = append(frames, frame{w, 0})
				case onStack[w]:
					low[v] = min(low[v], index[w])
				}
				continue
			}
			frames = frames[:len(frames)-1]
			if len(frames) > 0 {
				p := frames[len(frames)-1].v
				low[p] = min(low[p], low[v])
			}
			if low[v] == index[v] {
				k := len(stack) - 1
				for stack[k] != v {
					k--
				}
				if len(stack)-k > 1 {
					for _, x := range stack[k:] {
						in[x] = true
					}
				}
				for _, x := range stack[k:] {
					onStack[x] = false
				}
				stack = stack[:k]
			}
		}
	}
	return in
}

// CycleThrough returns a cycle through pending node start (start first, then
// each node it waits for in turn), or nil. With victimOnly, the cycle's
// other pending requests must all have started waiting before start
// (Later): start is then its victim, and such a cycle is found if one
// exists.
func (g *Graph) CycleThrough(start int, victimOnly bool) []int {
	if start < g.NHeld || start >= len(g.Nodes) {
		return nil
	}
	seen := make([]bool, len(g.Nodes))
	path := []int{start}
	// Iterative DFS: next[k] is the index of the next edge to try from path[k].
	next := []int{0}
	seen[start] = true
	for len(path) > 0 {
		k := len(path) - 1
		u := path[k]
		if next[k] >= len(g.Out[u]) {
			path, next = path[:k], next[:k]
			continue
		}
		v := g.Out[u][next[k]]
		next[k]++
		if v == start {
			return slices.Clone(path)
		}
		if seen[v] || (victimOnly && !g.Held(v) && !g.Later(start, v)) {
			continue
		}
		seen[v] = true
		path = append(path, v)
		next = append(next, 0)
	}
	return nil
}

// Cycles returns one cycle per strongly connected group of requests that
// wait for each other (each as CycleThrough, from the group's latest
// waiter, which is the victim of that cycle), for inspection.
func (g *Graph) Cycles() [][]int {
	var out [][]int
	covered := make([]bool, len(g.Nodes))
	order := make([]int, 0, len(g.Nodes)-g.NHeld)
	for i := g.NHeld; i < len(g.Nodes); i++ {
		order = append(order, i)
	}
	// Latest waiter first: a cycle found from it has it as its victim.
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case g.Later(a, b):
			return -1
		case g.Later(b, a):
			return 1
		}
		return 0
	})
	inCycle := g.InCycle()
	for _, i := range order {
		if covered[i] || !inCycle[i] {
			continue
		}
		if c := g.CycleThrough(i, true); c != nil {
			out = append(out, c)
			for _, n := range c {
				covered[n] = true
			}
		}
	}
	return out
}
