//go:build unix

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/manager"
)

// Two agents (in this process) in a cycle, with deadlock checks off so that
// it stays: each holds one name in Request's callback and asks for the
// other's with the callback's ctx. dump lists whom each waits for and the
// cycle; dump --check confirms it by reading twice and exits 1. A plain
// wait (no cycle) is listed and --check passes.
func TestDumpWaitsAndCycles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cycle.tbl")
	opts := &manager.OpenOptions{DeadlockDelay: -1}
	ms := make([]*manager.Manager, 2)
	for i := range ms {
		m, err := manager.Open(path, opts)
		require.NoError(t, err)
		t.Cleanup(func() { m.Close() })
		ms[i] = m
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := []string{"x", "y"}
	held := make(chan struct{}, 2)
	gate := make(chan struct{})
	done := make(chan error, 2)
	for i, m := range ms {
		go func() {
			done <- m.Request(ctx, names[i], manager.RequestOptions{}, func(fctx context.Context, l *manager.Lock) error {
				held <- struct{}{}
				<-gate
				l2, err := m.Acquire(fctx, names[1-i], manager.RequestOptions{})
				if err == nil {
					err = l2.Release()
				}
				return err
			})
		}()
	}
	for range ms {
		select {
		case <-held:
		case <-ctx.Done():
			t.Fatal("the first names were not granted")
		}
	}
	close(gate)
	waitFor(t, func() bool {
		s, err := ms[0].Query(ctx)
		return err == nil && len(s.Pending) == 2
	}, "both to wait")
	// The tags are written when a waiter parks, just after it queues.
	waitFor(t, func() bool {
		g, err := ms[0].WaitGraph(ctx)
		return err == nil && len(g.Cycles) == 1
	}, "the cycle to show")

	r := shm(t, nil, "dump", "--table", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "waits for:")
	require.Contains(t, r.stdout, fmt.Sprintf(`(client %s) on "x": pid`, ms[1].ClientID()))
	require.Contains(t, r.stdout, fmt.Sprintf(`(client %s) holds`, ms[0].ClientID()))
	require.Contains(t, r.stdout, "deadlock 1 (victim: the first request)")

	r = shm(t, nil, "dump", "--check", "--table", path)
	require.Equal(t, exitFailure, r.code, r.stdout)
	require.Contains(t, r.stdout, "consistent")
	require.Contains(t, r.stdout, "deadlock 1")
	require.Contains(t, r.stderr, "1 wait-for cycles")

	cancel() // both inner waits end: ErrAborted
	for range ms {
		select {
		case err := <-done:
			require.ErrorIs(t, err, manager.ErrAborted)
		case <-time.After(10 * time.Second):
			t.Fatal("the waits did not end after their ctx")
		}
	}

	// A plain wait: listed, and no cycle.
	path2, holder, _ := liveTable(t)
	r = shm(t, nil, "dump", "--check", "--table", path2)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `on "jobs": pid`)
	require.Contains(t, r.stdout, fmt.Sprintf(`(client %s) holds`, holder.ClientID()))
	require.NotContains(t, r.stdout, "deadlock")
}

// waitsFor is pg_blocking_pids: every request holding the name or queued
// ahead of it whose mode conflicts. A shared holder, then exclusive X1,
// shared S2, exclusive X3, shared S4 queued in that order: S2 waits for X1
// only (the shared holder does not conflict); X3 for the holder, X1 and S2;
// S4 for X1 and X3, both exclusive requests ahead (before, only X3 was
// named).
func TestDumpWaitsForIsBlockingPIDs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queue.tbl")
	open := func() *manager.Manager {
		m, err := manager.Open(path, nil)
		require.NoError(t, err)
		t.Cleanup(func() { m.Close() })
		return m
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := open()
	l, err := h.Acquire(ctx, "q", manager.RequestOptions{Mode: manager.Shared})
	require.NoError(t, err)
	defer l.Release()
	modes := []manager.Mode{manager.Exclusive, manager.Shared, manager.Exclusive, manager.Shared}
	ms := make([]*manager.Manager, len(modes))
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, len(modes))
	for i, mode := range modes {
		ms[i] = open()
		go func() {
			_, err := ms[i].Acquire(wctx, "q", manager.RequestOptions{Mode: mode})
			done <- err
		}()
		waitFor(t, func() bool {
			s, err := h.Query(ctx)
			return err == nil && len(s.Pending) == i+1
		}, "the request to queue")
	}
	r := shm(t, nil, "dump", "--json", "--table", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	var doc struct {
		WaitsFor []struct {
			ClientID string `json:"clientId"`
			WaitsFor []struct {
				ClientID string `json:"clientId"`
				Held     bool   `json:"held"`
			} `json:"waitsFor"`
		} `json:"waitsFor"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc))
	want := map[string][]string{
		ms[0].ClientID(): {h.ClientID()}, /* X1: nothing else ahead; the shared holder conflicts */
		ms[1].ClientID(): {ms[0].ClientID()},
		ms[2].ClientID(): {h.ClientID(), ms[0].ClientID(), ms[1].ClientID()},
		ms[3].ClientID(): {ms[0].ClientID(), ms[2].ClientID()},
	}
	require.Len(t, doc.WaitsFor, len(modes))
	for _, w := range doc.WaitsFor {
		var got []string
		for _, b := range w.WaitsFor {
			got = append(got, b.ClientID)
		}
		require.Equal(t, want[w.ClientID], got, "waitsFor of %s", w.ClientID)
	}
	r = shm(t, nil, "dump", "--table", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("(client %s) on \"q\": pid %d (client %s) queued ahead, pid %d (client %s) queued ahead\n",
		ms[3].ClientID(), os.Getpid(), ms[0].ClientID(), os.Getpid(), ms[2].ClientID()))
	stop()
	for range modes {
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatal("the waiters did not end")
		}
	}
}
