package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/shmlocks/shmlocks/etcd"
	"github.com/shmlocks/shmlocks/manager"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// dumpReport is dump's JSON: the Web Locks query fields, then who waits
// for whom and the cycles (manager.WaitGraph).
type dumpReport struct {
	Prefix   string               `json:"prefix"`
	Held     []manager.LockInfo   `json:"held"`
	Pending  []manager.LockInfo   `json:"pending"`
	WaitsFor []manager.WaitInfo   `json:"waitsFor"`
	Cycles   [][]manager.WaitNode `json:"cycles"`
}

// dump prints the held locks, the waiting requests and, for each of them,
// whom it waits for (the holders and the requests queued ahead whose mode
// conflicts), then the wait-for cycles, each from its victim. It opens a
// Manager of its own for the reads (a lease, no lock).
func dump(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("shmlocks-etcd dump", flag.ContinueOnError)
	fs.SetOutput(stderr)
	endpoints := fs.String("endpoints", "", "etcd client endpoints, comma-separated (required)")
	prefix := fs.String("prefix", "", "key prefix of the bucket (required)")
	asJSON := fs.Bool("json", false, "print JSON")
	timeout := fs.Duration("timeout", 10*time.Second, "bound of the whole dump")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *endpoints == "" || *prefix == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "shmlocks-etcd dump: --endpoints and --prefix are required and no arguments are taken")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	rep, err := readDump(ctx, strings.Split(*endpoints, ","), *prefix)
	if err != nil {
		fmt.Fprintln(stderr, "shmlocks-etcd dump:", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = writeDump(stdout, rep)
	}
	if err != nil {
		fmt.Fprintln(stderr, "shmlocks-etcd dump:", err)
		return 1
	}
	return 0
}

func readDump(ctx context.Context, endpoints []string, prefix string) (*dumpReport, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	m, err := etcd.Open(ctx, cli, prefix, &etcd.Options{DeadlockDelay: -1})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	snap, err := m.Query(ctx)
	if err != nil {
		return nil, err
	}
	g, err := m.WaitGraph(ctx)
	if err != nil {
		return nil, err
	}
	return &dumpReport{Prefix: prefix, Held: snap.Held, Pending: snap.Pending, WaitsFor: g.Waits, Cycles: g.Cycles}, nil
}

func writeDump(w io.Writer, r *dumpReport) error {
	who := func(li manager.LockInfo) string {
		return fmt.Sprintf("pid %d (client %s)", li.PID, li.ClientID)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "prefix %s: %d held, %d pending\n", r.Prefix, len(r.Held), len(r.Pending))
	if len(r.Held) > 0 {
		b.WriteString("held:\n")
		for _, h := range r.Held {
			fmt.Fprintf(&b, "  %q %s by %s\n", h.Name, h.Mode, who(h))
		}
	}
	if len(r.Pending) > 0 {
		b.WriteString("pending:\n")
		for _, p := range r.Pending {
			fmt.Fprintf(&b, "  %q %s by %s\n", p.Name, p.Mode, who(p))
		}
	}
	if len(r.WaitsFor) > 0 {
		b.WriteString("waits for:\n")
		for _, wi := range r.WaitsFor {
			var by []string
			for _, n := range wi.WaitsFor {
				what := "holds"
				if !n.Held {
					what = "queued ahead"
				}
				by = append(by, fmt.Sprintf("%s %s", who(n.LockInfo), what))
			}
			if len(by) == 0 {
				by = []string{"nobody (about to be granted)"}
			}
			fmt.Fprintf(&b, "  %s on %q (%s): %s\n", who(wi.Request), wi.Request.Name, wi.Request.Mode, strings.Join(by, ", "))
		}
	}
	for k, c := range r.Cycles {
		var parts []string
		for _, n := range c {
			state := "waiting for"
			if n.Held {
				state = "holding"
			}
			parts = append(parts, fmt.Sprintf("%s %s %q (%s)", who(n.LockInfo), state, n.Name, n.Mode))
		}
		fmt.Fprintf(&b, "deadlock %d (victim: the first request): %s -> back to the first\n", k+1, strings.Join(parts, " -> "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
