// Command shmlocks-etcd runs the shmlocks stress workload, with its
// independent checkers, on the etcd backend: worker processes (this binary,
// re-executed) each open a Manager with etcd.Open on the given cluster and
// hammer a few lock names; the checkers verify mutual exclusion, FIFO,
// fencing tokens and liveness, as `shmlocks stress` does on the table.
//
//	shmlocks-etcd --endpoints localhost:2379 --procs 4 --duration 10s
//	shmlocks-etcd stress --endpoints localhost:2379 --procs 4 --duration 10s
//
// dump shows a prefix's held locks and waiting requests, who waits for whom
// (the blocking chains) and the wait-for cycles:
//
//	shmlocks-etcd dump --endpoints localhost:2379 --prefix /myapp/locks [--json]
//
// It lives in the nested module because the core module must not import
// etcd: the stress package takes the backend as a plug-in
// (stress.RegisterBackend), registered here in the supervisor and in every
// worker.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/shmlocks/shmlocks/etcd"
	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/stress"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// backendName is the stress backend name of etcd.
const backendName = "etcd"

// target is what the workers need to open their Manager (Config.Target, JSON).
type target struct {
	Endpoints []string      `json:"endpoints"`
	Prefix    string        `json:"prefix"`
	TTL       time.Duration `json:"ttl"`
}

func parseTarget(s string) (target, *clientv3.Client, error) {
	var t target
	if err := json.Unmarshal([]byte(s), &t); err != nil {
		return t, nil, fmt.Errorf("bad target %q: %w", s, err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: t.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	return t, cli, err
}

func register() {
	stress.RegisterBackend(backendName, stress.ManagerBackend{
		Open: func(s string) (*manager.Manager, error) {
			t, cli, err := parseTarget(s)
			if err != nil {
				return nil, err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// The client lives as long as the worker process.
			return etcd.Open(ctx, cli, t.Prefix, &etcd.Options{TTL: t.TTL})
		},
		Empty: func(s string) error {
			t, cli, err := parseTarget(s)
			if err != nil {
				return err
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			m, err := etcd.Open(ctx, cli, t.Prefix, &etcd.Options{TTL: t.TTL})
			if err != nil {
				return err
			}
			defer m.Close()
			// A killed worker's keys go with its lease: wait up to two TTLs.
			deadline := time.Now().Add(2*t.TTL + time.Second)
			for {
				snap, err := m.Query(ctx)
				if err != nil {
					return err
				}
				if len(snap.Held)+len(snap.Pending) == 0 {
					return nil
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("left in the bucket: held %+v, pending %+v", snap.Held, snap.Pending)
				}
				time.Sleep(50 * time.Millisecond)
			}
		},
	})
}

func main() {
	register()
	if stress.IsWorker() {
		os.Exit(stress.WorkerMain(os.Stdout, os.Stderr))
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "shmlocks-etcd:", err)
		os.Exit(1)
	}
	os.Exit(dispatch(os.Args[1:], []string{exe}, os.Stdout, os.Stderr))
}

// dispatch runs a subcommand: stress (the default: arguments that start
// with a flag are stress's) or dump.
func dispatch(args, worker []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "stress":
			return run(args[1:], worker, stdout, stderr)
		case "dump":
			return dump(args[1:], stdout, stderr)
		case "help", "-h", "--help":
			fmt.Fprintln(stdout, usage)
			return 0
		}
		if !strings.HasPrefix(args[0], "-") {
			fmt.Fprintf(stderr, "shmlocks-etcd: unknown command %q\n%s\n", args[0], usage)
			return 2
		}
	}
	return run(args, worker, stdout, stderr)
}

const usage = `usage:
  shmlocks-etcd [stress] --endpoints host:port[,...] [flags]   run the stress workload and its checkers
  shmlocks-etcd [stress] --embedded 3 --faults all --duration 20s [flags]
                                                              the same on an embedded cluster, with faults
  shmlocks-etcd dump --endpoints host:port[,...] --prefix P [--json]
                                                              held locks, waiting requests, who waits for whom, deadlocks`

// run is the supervisor: it parses args, runs the workload with worker
// (argv of this binary) and prints the report. It returns the exit status
// (0 ok, 1 violations or failure, 2 usage).
func run(args, worker []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("shmlocks-etcd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg stress.Config
	endpoints := fs.String("endpoints", "", "etcd client endpoints, comma-separated (or --embedded)")
	prefix := fs.String("prefix", "", "key prefix (default: a fresh /shmlocks-stress/<random>)")
	ttl := fs.Duration("ttl", 2*time.Second, "lease TTL of every worker's Manager (a killed worker's locks go within it; default 5s with --faults)")
	fs.IntVar(&cfg.Procs, "procs", 4, "worker processes")
	fs.IntVar(&cfg.Goroutines, "goroutines", 2, "requesting goroutines per process")
	fs.IntVar(&cfg.Names, "names", 4, "lock names (stress-0, stress-1, ...)")
	fs.DurationVar(&cfg.Duration, "duration", 0, "run length (default 5s unless --ops)")
	fs.IntVar(&cfg.Ops, "ops", 0, "requests per goroutine instead of a duration")
	fs.Float64Var(&cfg.Shared, "shared", 0.3, "fraction of requests in shared mode")
	fs.Float64Var(&cfg.IfAvailable, "if-available", 0.1, "fraction of requests made with IfAvailable")
	fs.Float64Var(&cfg.Steal, "steal", 0.01, "fraction of exclusive waiting requests made with Steal")
	fs.Float64Var(&cfg.Timeout, "timeout", 0.1, "fraction of waiting requests given a deadline")
	fs.DurationVar(&cfg.Deadline, "deadline", 50*time.Millisecond, "the deadline of those requests")
	hold := fs.String("hold", "exp:1ms", "hold time: fixed:DUR, exp:MEAN, uniform:MIN-MAX or none")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "random seed (0: pick one; the report prints it)")
	fs.Float64Var(&cfg.Chaos, "chaos", 0, "SIGKILL a random worker this many times per second (set --stuck above --ttl)")
	fs.DurationVar(&cfg.Stuck, "stuck", 0, "a waiter blocked this long on a free, quiet name is a violation (default 2s + ttl)")
	fs.DurationVar(&cfg.MaxGrantGap, "max-gap", 0, "no grant anywhere for this long is a violation (0: not checked)")
	features := fs.String("features", "", "what the workers do, one feature per process position in turn: plain (the default) or coalesce, comma-separated")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	embedded := fs.Int("embedded", 0, "run on an embedded cluster of this many members (instead of --endpoints), its clients behind TCP proxies")
	faultList := fs.String("faults", "", "with --embedded: faults injected in turn, comma-separated: leader, member, cut, compact, or all")
	faultEvery := fs.Duration("fault-every", time.Second, "pause between two faults")
	faultDown := fs.Duration("fault-down", 300*time.Millisecond, "how long a member stays down, or the clients cut off (keep it well within --ttl)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if (*endpoints == "") == (*embedded == 0) || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "shmlocks-etcd: one of --endpoints and --embedded is required, and no arguments are taken")
		return 2
	}
	if *features != "" {
		fl, err := stress.ParseFeatures(*features)
		if err != nil {
			fmt.Fprintln(stderr, "shmlocks-etcd:", err)
			return 2
		}
		cfg.Features = fl
	}
	ttlSet := false
	fs.Visit(func(f *flag.Flag) { ttlSet = ttlSet || f.Name == "ttl" })
	kinds, err := parseFaults(*faultList)
	if len(kinds) > 0 && !ttlSet {
		// A client cut off reconnects with gRPC's backoff (about a second
		// after a short cut, more after several): the lease must outlive a
		// fault and the reconnect, or the checkers see locks lost.
		*ttl = 5 * time.Second
	}
	if err != nil || len(kinds) > 0 && (*embedded == 0 || cfg.Duration == 0) {
		fmt.Fprintln(stderr, "shmlocks-etcd: --faults needs --embedded and --duration:", err)
		return 2
	}
	var faults *faultRunner
	if *embedded > 0 {
		c, err := startCluster(*embedded)
		if err != nil {
			fmt.Fprintln(stderr, "shmlocks-etcd: embedded cluster:", err)
			return 1
		}
		defer c.stop()
		*endpoints = strings.Join(c.Endpoints(), ",")
		if len(kinds) > 0 {
			faults = &faultRunner{c: c, kinds: kinds, every: *faultEvery, down: *faultDown, until: time.Now().Add(cfg.Duration)}
		}
	}
	if *prefix == "" {
		var b [6]byte
		rand.Read(b[:])
		*prefix = "/shmlocks-stress/" + hex.EncodeToString(b[:])
	}
	t, _ := json.Marshal(target{Endpoints: strings.Split(*endpoints, ","), Prefix: *prefix, TTL: *ttl})
	cfg.Backend, cfg.Target, cfg.Worker = backendName, string(t), worker
	if cfg.Stuck == 0 {
		cfg.Stuck = 2*time.Second + *ttl
	}
	if cfg.Hold, err = stress.ParseHold(*hold); err != nil {
		fmt.Fprintln(stderr, "shmlocks-etcd:", err)
		return 2
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(stderr, "shmlocks-etcd:", err)
		return 2
	}
	stopFaults, faultsDone := make(chan struct{}), make(chan struct{})
	if faults != nil {
		go func() { defer close(faultsDone); faults.run(stopFaults) }()
	} else {
		close(faultsDone)
	}
	rep, err := stress.Run(cfg, stderr)
	close(stopFaults)
	<-faultsDone
	if faults != nil {
		fmt.Fprintln(stdout, faults.summary())
	}
	if err != nil {
		fmt.Fprintln(stderr, "shmlocks-etcd:", err)
		if errors.Is(err, stress.ErrUsage) {
			return 2
		}
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = stress.WriteText(stdout, []*stress.Report{rep})
	}
	if err != nil {
		fmt.Fprintln(stderr, "shmlocks-etcd:", err)
		return 1
	}
	if !rep.OK() {
		fmt.Fprintf(stderr, "shmlocks-etcd: %d violations\n", rep.Violations)
		return 1
	}
	return 0
}
