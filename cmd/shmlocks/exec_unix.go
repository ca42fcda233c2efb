//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

// execSignals are caught while waiting (they withdraw the request) and
// forwarded to the command while it runs.
var execSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

func execLocked(o *execOptions, stdout, stderr io.Writer) int {
	fail := func(code int, format string, args ...any) int {
		fmt.Fprintf(stderr, "shmlocks exec: %s\n", fmt.Sprintf(format, args...))
		return code
	}
	// Catch the signals before anything can block.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, execSignals...)
	defer signal.Stop(sigs)

	m, err := manager.Open(o.path, nil)
	if err != nil {
		return fail(exitFailure, "%v", err)
	}
	defer m.Close()

	// Wait for the lock; a signal cancels the wait.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if o.timeout > 0 {
		var c2 context.CancelFunc
		ctx, c2 = context.WithTimeout(ctx, o.timeout)
		defer c2()
	}
	var interrupted os.Signal
	waiting, watcherDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watcherDone)
		select {
		case s := <-sigs:
			interrupted = s
			cancel()
		case <-waiting:
		}
	}()
	start := time.Now()
	l, err := m.Acquire(ctx, o.name, o.opts)
	took := time.Since(start)
	close(waiting)
	<-watcherDone
	if interrupted != nil {
		if l != nil { // granted as the signal arrived: give it back
			l.Release()
		}
		return fail(exitFailure, "%v while waiting for %q: request withdrawn", interrupted, o.name)
	}
	switch {
	case err == nil:
	case errors.Is(err, manager.ErrNotAvailable):
		return fail(o.conflictCode, "lock %q is not available", o.name)
	case errors.Is(err, manager.ErrAborted) && errors.Is(err, context.DeadlineExceeded):
		return fail(o.conflictCode, "timed out after %v waiting for lock %q", o.timeout, o.name)
	case errors.Is(err, manager.ErrNotSupported):
		return fail(exitUsage, "%v", err)
	default:
		return fail(exitFailure, "%v", err)
	}
	defer l.Release()
	if o.verbose {
		fmt.Fprintf(stderr, "shmlocks exec: getting lock %q took %.6f seconds\n", o.name, took.Seconds())
		fmt.Fprintf(stderr, "shmlocks exec: executing %s\n", o.argv[0])
	}

	cmd := exec.Command(o.argv[0], o.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	if err := cmd.Start(); err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return fail(127, "%v", err)
		}
		return fail(126, "%v", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	lost := l.Lost()
	for {
		select {
		case s := <-sigs:
			cmd.Process.Signal(s)
		case <-lost:
			lost = nil
			fmt.Fprintf(stderr, "shmlocks exec: lock %q was stolen; sending SIGTERM to the command\n", o.name)
			cmd.Process.Signal(syscall.SIGTERM)
		case err := <-waited:
			st := cmd.ProcessState
			if st == nil {
				return fail(exitFailure, "%v", err)
			}
			if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				return 128 + int(ws.Signal())
			}
			return st.ExitCode()
		}
	}
}
