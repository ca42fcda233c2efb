package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

const envDemoWorker = "SHMLOCKS_DEMO_WORKER"

// runDemo starts several worker processes that contend for a few names on one
// table and print each grant (with its fencing token) as it happens.
func runDemo(args []string, stdout, stderr io.Writer) int {
	if id := os.Getenv(envDemoWorker); id != "" {
		return demoWorker(id, args, stdout, stderr)
	}
	fs := newFlags("demo", "shmlocks demo [--procs N] [--rounds N] [--table PATH]",
		`Start several worker processes that contend for the names a, b (exclusive)
and c (shared) on one table and print every grant with its fencing token.

The demo uses a fresh table in a temporary directory (removed afterwards)
unless --table is given; it does not use the default table location.`,
		`  shmlocks demo
  shmlocks demo --procs 8 --rounds 10
  shmlocks demo --table /tmp/demo.tbl`, stdout, stderr)
	procs := fs.Int("procs", 4, "worker processes")
	rounds := fs.Int("rounds", 5, "locks each worker takes")
	tbl := fs.String("table", "", "table file (default: a fresh file in a temporary directory)")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return fs.usageError("unexpected argument %q", fs.Arg(0))
	}
	if *procs < 1 || *rounds < 1 {
		return fs.usageError("--procs and --rounds must be at least 1")
	}
	path := *tbl
	if path == "" {
		dir, err := os.MkdirTemp("", "shmlocks-demo-")
		if err != nil {
			return failf(stderr, "demo", exitOSErr, "%v", err)
		}
		defer os.RemoveAll(dir)
		path = filepath.Join(dir, "demo.tbl")
	}
	// The table is opened here first, so that a table that cannot be
	// used gives its exit status (exitcode.go), not the workers' failure.
	m, err := manager.Open(path, nil)
	if err != nil {
		return tableFail(stderr, "demo", path, err, exitNoTable)
	}
	defer m.Close()
	exe, err := os.Executable()
	if err != nil {
		return failf(stderr, "demo", exitOSErr, "%v", err)
	}
	fmt.Fprintf(stdout, "table %s: %d processes x %d rounds on names a, b (exclusive) and c (shared)\n", path, *procs, *rounds)
	var cmds []*exec.Cmd
	for i := 0; i < *procs; i++ {
		cmd := exec.Command(exe, "demo", "--table", path, "--rounds", strconv.Itoa(*rounds))
		cmd.Env = append(os.Environ(), envDemoWorker+"="+strconv.Itoa(i))
		cmd.Stdout, cmd.Stderr = stdout, stderr
		if err := cmd.Start(); err != nil {
			return failf(stderr, "demo", exitOSErr, "%v", err)
		}
		cmds = append(cmds, cmd)
	}
	status := exitOK
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			status = exitOSErr // a worker failed (its error is on stderr)
		}
	}
	return status
}

func demoWorker(id string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	tbl := fs.String("table", "", "")
	rounds := fs.Int("rounds", 5, "")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	m, err := manager.Open(*tbl, nil)
	if err != nil {
		fmt.Fprintf(stderr, "worker %s: %v\n", id, err)
		return exitFailure
	}
	defer m.Close()
	names := []string{"a", "b", "c"}
	for i := 0; i < *rounds; i++ {
		name := names[i%len(names)]
		opts := manager.RequestOptions{}
		if name == "c" {
			opts.Mode = manager.Shared
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		err := m.Request(ctx, name, opts, func(ctx context.Context, l *manager.Lock) error {
			fmt.Fprintf(stdout, "pid %-7d got %s %-9s token %-3d after %v\n", os.Getpid(), l.Name(), l.Mode(), l.Token(), time.Since(start).Round(time.Microsecond))
			time.Sleep(20 * time.Millisecond) // the "work" done under the lock
			return nil
		})
		cancel()
		if err != nil {
			fmt.Fprintf(stderr, "worker %s: %v\n", id, err)
			return exitFailure
		}
	}
	return exitOK
}
