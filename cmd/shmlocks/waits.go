package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/internal/waitgraph"
	"github.com/shmlocks/shmlocks/table"
)

// renderWaits writes, for every waiting request, whom it waits for (like
// PostgreSQL's pg_blocking_pids): the holders of its name whose mode
// conflicts with its own, and the requests queued ahead of it whose mode
// conflicts with its own; then the wait-for cycles (deadlocks) of g.
func renderWaits(w io.Writer, g *waitgraph.Graph, cycles [][]int) {
	if len(g.Nodes) == g.NHeld {
		return
	}
	who := func(n *table.LockInfo) string {
		return fmt.Sprintf("pid %d (client %s)", n.PID, inspect.ClientID(n.Nonce))
	}
	fmt.Fprintf(w, "\nwaits for:\n")
	blocking := blockers(g)
	for i := g.NHeld; i < len(g.Nodes); i++ {
		n := &g.Nodes[i]
		var by []string
		for _, j := range blocking[i-g.NHeld] {
			what := "holds"
			if !g.Held(j) {
				what = "queued ahead"
			}
			by = append(by, fmt.Sprintf("%s %s", who(&g.Nodes[j]), what))
		}
		if len(by) == 0 {
			by = []string{"nobody (about to be granted)"}
		}
		fmt.Fprintf(w, "  %s on %q: %s\n", who(n), n.Name, strings.Join(by, ", "))
	}
	for k, c := range cycles {
		fmt.Fprintf(w, "deadlock %d (victim: the first request): %s\n", k+1, g.Describe(c))
	}
}

// blockers returns, for each pending node of g (node g.NHeld+k at k),
// every request it waits for, as PostgreSQL's pg_blocking_pids: the
// holders of its name whose mode conflicts with its own, then the
// requests queued ahead of it on its name whose mode conflicts with its
// own, in queue order. (g's edges are fewer: a queued request reaches the
// ones ahead of it through each other, which is enough for cycles but
// not for saying whom a request waits for.)
func blockers(g *waitgraph.Graph) [][]int {
	conflict := func(a, b uint32) bool { return a != table.ModeShared || b != table.ModeShared }
	holders := map[string][]int{}
	for i := 0; i < g.NHeld; i++ {
		holders[g.Nodes[i].Name] = append(holders[g.Nodes[i].Name], i)
	}
	ahead := map[string][]int{} // per name, the pending nodes so far (queue order)
	out := make([][]int, len(g.Nodes)-g.NHeld)
	for i := g.NHeld; i < len(g.Nodes); i++ {
		n := &g.Nodes[i]
		var by []int
		for _, j := range holders[n.Name] {
			if conflict(n.Mode, g.Nodes[j].Mode) {
				by = append(by, j)
			}
		}
		for _, j := range ahead[n.Name] {
			if conflict(n.Mode, g.Nodes[j].Mode) {
				by = append(by, j)
			}
		}
		ahead[n.Name] = append(ahead[n.Name], i)
		out[i-g.NHeld] = by
	}
	return out
}

// confirmedCycles reads the graph of the table with its cycles, keeping
// only those that a second read confirms (waitgraph.Confirmed): no phantom
// of a table that changed while it was read.
func confirmedCycles(t *table.Table, a *table.Agent) (*waitgraph.Graph, [][]int, error) {
	return waitgraph.Confirmed(func() ([]table.LockInfo, []table.LockInfo, error) { return t.Snapshot(a) }, (*waitgraph.Graph).Cycles)
}
