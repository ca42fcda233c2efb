package table

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// WaitFor is the wait-for graph of one snapshot (docs/multi-and-deadlock.md).
// Its nodes are requests: Nodes[:len(held)] the held locks, then the pending
// requests, in the order Snapshot returned them. Edges go
//
//   - from a waiting request to every holder of its name whose mode conflicts
//     with its own (it waits for their release: pg_blocking_pids' hard edges);
//   - from a waiting request to the earlier waiters in its name's queue whose
//     mode conflicts with its own (FIFO: it is granted only after them, the
//     soft edges of PostgreSQL), or to a later one of them that waits for the
//     rest (see NewWaitFor);
//   - from a held lock to the waiting request of the same agent whose task
//     holds it, named by the hold's task tag (TaskTag): that hold is released
//     only after that request is granted. A hold without a tag has no edge
//     out: nothing says that the goroutine holding it waits for anything.
//
// A cycle in this graph is a deadlock if it stays the same while it is read
// (see SameRequests): every waiting request in it waits for the next node,
// which is released only after the node after it is granted, and so on round.
type WaitFor struct {
	Nodes []LockInfo
	NHeld int     // Nodes[i] is held for i < NHeld, pending otherwise
	Out   [][]int // Out[i]: the nodes node i waits for

	pendingAt map[uint32]int // pending node by slot
}

// conflicts reports whether requests in modes a and b cannot hold together.
func conflicts(a, b uint32) bool { return a != ModeShared || b != ModeShared }

// NewWaitFor builds the graph of a snapshot (held and pending as returned by
// Snapshot: pending in queue order per name).
func NewWaitFor(held, pending []LockInfo) *WaitFor {
	g := &WaitFor{NHeld: len(held), pendingAt: make(map[uint32]int, len(pending))}
	g.Nodes = make([]LockInfo, 0, len(held)+len(pending))
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
		if w.Mode != ModeShared {
			g.Out[i] = append(g.Out[i], q.run...)
		}
		if q.lastEx >= 0 {
			g.Out[i] = append(g.Out[i], q.lastEx)
		}
		if w.Mode == ModeShared {
			q.run = append(q.run, i)
		} else {
			q.lastEx, q.run = i, nil
		}
		waiters[waiterKey{w.Agent, w.Slot}] = i
		g.pendingAt[w.Slot] = i
	}
	for i := range held {
		h := &g.Nodes[i]
		if h.Tag == 0 {
			continue
		}
		if j, ok := waiters[waiterKey{h.Agent, h.Tag>>tagShift - 1}]; ok && TagNames(h.Tag, g.Nodes[j].Slot, g.Nodes[j].Serial) {
			g.Out[i] = append(g.Out[i], j)
		}
	}
	return g
}

// Held reports whether node i is a held lock (else a pending request).
func (g *WaitFor) Held(i int) bool { return i < g.NHeld }

// Find returns the node of the pending request at slot with serial, or -1.
func (g *WaitFor) Find(slot, serial uint32) int {
	if i, ok := g.pendingAt[slot]; ok && g.Nodes[i].Serial == serial {
		return i
	}
	return -1
}

// Later reports whether pending node i started waiting after pending node j
// (enqueue time, then slot): the order of the victim rule. Every process
// computes it from the same table words, so they all agree.
func (g *WaitFor) Later(i, j int) bool {
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
func (g *WaitFor) InCycle() []bool {
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
func (g *WaitFor) CycleThrough(start int, victimOnly bool) []int {
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
func (g *WaitFor) Cycles() [][]int {
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

// SameRequests reports whether every node of cycle c in g is in g2 as the
// same request (slot and serial) in the same state, agent, name, mode and
// tag, and every edge of c is in g2 too. Read at t1 (g) and again at t2
// (g2): a waiting request with the same serial waited throughout, a held
// one was held throughout, so every edge of the cycle held throughout
// [t1, t2], and the cycle is not a phantom of a snapshot that latched one
// bucket at a time.
func SameRequests(g, g2 *WaitFor, c []int) bool {
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
func (g *WaitFor) Describe(c []int) string {
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
		if n.Mode == ModeShared {
			mode = "shared"
		}
		fmt.Fprintf(&b, "pid %d (client %s) %s %q (%s)", n.PID, clientIDOf(n.Nonce), state, n.Name, mode)
	}
	b.WriteString(" -> back to the first")
	return b.String()
}

// clientIDOf formats an agent nonce the way manager.ClientIDOf does (the
// table cannot import the manager).
func clientIDOf(nonce uint64) string { return strconv.FormatUint(nonce, 16) }
