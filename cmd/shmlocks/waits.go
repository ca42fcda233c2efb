package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/shmlocks/shmlocks/table"
)

// renderWaits writes, for every waiting request, whom it waits for (like
// PostgreSQL's pg_blocking_pids): the holders of its name whose mode
// conflicts with its own, and the requests queued ahead of it whose mode
// conflicts with its own; then the wait-for cycles (deadlocks) of g.
func renderWaits(w io.Writer, g *table.WaitFor, cycles [][]int) {
	if len(g.Nodes) == g.NHeld {
		return
	}
	who := func(n *table.LockInfo) string {
		return fmt.Sprintf("pid %d (client %s)", n.PID, strconv.FormatUint(n.Nonce, 16))
	}
	fmt.Fprintf(w, "\nwaits for:\n")
	for i := g.NHeld; i < len(g.Nodes); i++ {
		n := &g.Nodes[i]
		var by []string
		for _, j := range g.Out[i] {
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

// confirmedCycles reads the table twice (each bucket under its latch) and
// returns the graph of the first read with its cycles that the second read
// confirms (table.SameRequests): no phantom of a table that changed while
// it was read.
func confirmedCycles(t *table.Table, a *table.Agent) (*table.WaitFor, [][]int, error) {
	held, pending, err := t.Snapshot(a)
	if err != nil {
		return nil, nil, err
	}
	g := table.NewWaitFor(held, pending)
	cycles := g.Cycles()
	if len(cycles) == 0 {
		return g, nil, nil
	}
	if held, pending, err = t.Snapshot(a); err != nil {
		return nil, nil, err
	}
	g2 := table.NewWaitFor(held, pending)
	var out [][]int
	for _, c := range cycles {
		if table.SameRequests(g, g2, c) {
			out = append(out, c)
		}
	}
	return g, out, nil
}
