package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/etcd"
	"github.com/shmlocks/shmlocks/manager"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestDump: a blocking chain (a holds x, b waits for it, c waits behind b)
// and a cycle nobody breaks (checks off): dump shows who waits for whom and
// the cycle from its victim, as text and as JSON.
func TestDump(t *testing.T) {
	ep := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open := func() *manager.Manager {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		m, err := etcd.Open(ctx, cli, "/dump", &etcd.Options{DeadlockDelay: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	a, b, c := open(), open(), open()
	if _, err := a.Acquire(ctx, "x", manager.RequestOptions{}); err != nil {
		t.Fatal(err)
	}
	go b.Acquire(ctx, "x", manager.RequestOptions{})
	waitQueued(t, ctx, a, 1)
	go c.Acquire(ctx, "x", manager.RequestOptions{Mode: manager.Shared})
	waitQueued(t, ctx, a, 2)
	// The cycle: a holds p and waits for q, b holds q and waits for p.
	holding := make(chan struct{}, 2)
	proceed := make(chan struct{})
	for _, s := range []struct {
		m           *manager.Manager
		first, then string
	}{{a, "p", "q"}, {b, "q", "p"}} {
		go s.m.Request(ctx, s.first, manager.RequestOptions{}, func(ctx context.Context, _ *manager.Lock) error {
			holding <- struct{}{}
			select {
			case <-proceed:
			case <-ctx.Done():
				return ctx.Err()
			}
			_, err := s.m.Acquire(ctx, s.then, manager.RequestOptions{})
			return err
		})
	}
	for range 2 {
		select {
		case <-holding:
		case <-ctx.Done():
			t.Fatal("p and q not held")
		}
	}
	close(proceed)
	waitQueued(t, ctx, a, 4)

	var out, errb bytes.Buffer
	if code := dispatch([]string{"dump", "--endpoints", ep, "--prefix", "/dump"}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	text := out.String()
	t.Logf("\n%s", text)
	for _, want := range []string{
		"3 held, 4 pending",
		"on \"x\" (exclusive): pid",
		"(client " + a.ClientID() + ") holds",
		"on \"x\" (shared): pid",
		"(client " + b.ClientID() + ") queued ahead",
		"deadlock 1 (victim: the first request)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("dump lacks %q", want)
		}
	}
	out.Reset()
	if code := dispatch([]string{"dump", "--json", "--endpoints", ep, "--prefix", "/dump"}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rep dumpReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Held) != 3 || len(rep.Pending) != 4 || len(rep.WaitsFor) != 4 || len(rep.Cycles) != 1 || len(rep.Cycles[0]) != 4 {
		t.Fatalf("json: %+v", rep)
	}
	if code := dispatch([]string{"dump", "--endpoints", ep}, nil, &out, &errb); code != 2 {
		t.Fatalf("dump without --prefix: exit %d", code)
	}
}

func waitQueued(t *testing.T, ctx context.Context, m *manager.Manager, n int) {
	t.Helper()
	for {
		s, err := m.Query(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Pending) == n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d pending, want %d", len(s.Pending), n)
		case <-time.After(2 * time.Millisecond):
		}
	}
}
