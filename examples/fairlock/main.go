// Command fairlock shows a fair (FIFO) lock across processes, the "fair lock"
// and "waiting lock" (asyncWait) of seed 002: one caller runs at a time, the
// others wait and are served in the order they asked, whichever process
// asked, so "open the mask" is never overtaken by "close the mask" queued
// after it.
//
// It starts several worker processes one after another, each queueing for
// the lock "printer" while the parent holds it, and then releases: the
// workers print in the order they queued. It uses a table in a temporary
// directory; real programs use a path every cooperating process knows.
//
//	go run ./examples/fairlock
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

const (
	name    = "printer"
	workers = 4
	roleEnv = "FAIRLOCK_WORKER" // set in a worker process: its number
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fairlock:", err)
		os.Exit(1)
	}
}

func run() error {
	if id := os.Getenv(roleEnv); id != "" {
		return worker(id, os.Args[1])
	}
	dir, err := os.MkdirTemp("", "fairlock-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "app.locks")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := manager.Open(path, nil)
	if err != nil {
		return err
	}
	defer m.Close()

	// Hold the lock while the workers line up behind it.
	l, err := m.Acquire(ctx, name, manager.RequestOptions{})
	if err != nil {
		return err
	}
	fmt.Printf("parent holds %q (token %d)\n", name, l.Token())

	// Watch the queue (woken by each change, no polling) to start each
	// worker once the previous one has queued: that fixes their order.
	states, err := m.Watch(ctx, name)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var cmds []*exec.Cmd
	for i := 0; i < workers; i++ {
		cmd := exec.CommandContext(ctx, exe, path)
		cmd.Env = append(os.Environ(), roleEnv+"="+strconv.Itoa(i))
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		cmds = append(cmds, cmd)
		for st := range states {
			if len(st.Pending) == i+1 {
				break
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	fmt.Printf("%d workers queued; releasing\n", workers)
	if err := l.Release(); err != nil {
		return err
	}
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			return err
		}
	}
	return nil
}

// worker queues for the lock and prints when it gets it: in queue order.
func worker(id, path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := manager.Open(path, nil)
	if err != nil {
		return err
	}
	defer m.Close()
	return m.Request(ctx, name, manager.RequestOptions{}, func(ctx context.Context, l *manager.Lock) error {
		fmt.Printf("worker %s got %q (token %d)\n", id, name, l.Token())
		return nil
	})
}
