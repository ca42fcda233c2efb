package etcd

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/coalesce"
	"github.com/shmlocks/shmlocks/coalesce/coalescetest"
	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/manager/managertest"
	"go.etcd.io/etcd/server/v3/embed"
)

// TestCoalesce runs coalesce's backend-agnostic tests on a single-member
// embedded etcd: every Manager with a client of its own (a machine); Cut
// revokes a Manager's lease, as etcd does when the client is cut off for
// its TTL.
func TestCoalesce(t *testing.T) {
	c := startCluster(t, 1)
	var mu sync.Mutex
	backends := map[*manager.Manager]*backend{}
	coalescetest.Run(t, coalescetest.Bucket{
		Open: func(t *testing.T) *manager.Manager {
			m, b := openOn(t, c.client(t), "/coalesce", &Options{TTL: 2 * time.Second})
			mu.Lock()
			backends[m] = b
			mu.Unlock()
			return m
		},
		Cut: func(t *testing.T, m *manager.Manager) {
			mu.Lock()
			b := backends[m]
			mu.Unlock()
			revokeLease(t, ctxT(t, 10*time.Second), c, b)
		},
	})
}

// TestCoalesceRoundTrips counts what a flight asks of etcd. The leader of
// a flight nobody joins: 2 round trips, as concurrency.Mutex's
// Lock+Unlock (the flight lock taken with IfAvailable, reading the outcome
// in place in the same transaction; the outcome published and the lock
// released in one transaction). A follower on another client makes no
// call while it waits (no polling), and learns the outcome from the watch
// event of its publication.
func TestCoalesceRoundTrips(t *testing.T) {
	c := startCluster(t, 1)
	ctx := ctxT(t, 30*time.Second)
	cliA, cliB := c.client(t), c.client(t)
	ca, cb := newCountKV(cliA), newCountKV(cliB)
	// No deadlock rounds: their reads are calls of a waiting request.
	ma, _ := openOn(t, cliA, "/trips", &Options{DeadlockDelay: -1})
	mb, _ := openOn(t, cliB, "/trips", &Options{DeadlockDelay: -1})

	ca.reset()
	r, shared, err := coalesce.New(ma).Do(ctx, "k", func(context.Context) ([]byte, error) { return []byte("v1"), nil })
	if err != nil || shared || string(r) != "v1" {
		t.Fatalf("Do: %q shared=%v err=%v", r, shared, err)
	}
	if n := ca.trips(""); n != 2 {
		t.Fatalf("the leader made %d round trips, want 2: %q", n, ca.calls)
	}

	started, gate := make(chan struct{}), make(chan struct{})
	lead := coalescetest.DoAsync(ctx, ma, "k", func(context.Context) ([]byte, error) {
		close(started)
		<-gate
		return []byte("v2"), nil
	})
	<-started
	cb.reset()
	follow := coalescetest.DoAsync(ctx, mb, "k", func(context.Context) ([]byte, error) { return nil, errors.New("ran") })
	coalescetest.WaitPilots(t, ma, "k", 1)
	// While it waits it makes no call, but for at most one read of the
	// record when its watch starts (Follow's gap read), which may fall
	// in this period.
	before, beforeRec := cb.trips(""), cb.trips(storeDir)
	time.Sleep(managertest.QuietPeriod)
	if n, nr := cb.trips("")-before, cb.trips(storeDir)-beforeRec; n-nr != 0 || nr > 1 {
		t.Fatalf("the waiting follower made %d calls (%d reads of the record): %q", n, nr, cb.calls)
	}
	close(gate)
	if r := coalescetest.Recv(t, lead, "leader"); r.Err != nil || string(r.Res) != "v2" {
		t.Fatalf("leader: %q %v", r.Res, r.Err)
	}
	if r := coalescetest.Recv(t, follow, "follower"); r.Err != nil || !r.Shared || string(r.Res) != "v2" {
		t.Fatalf("follower: %q shared=%v err=%v", r.Res, r.Shared, r.Err)
	}
	if n := cb.eventsOn(storeDir); n < 1 {
		t.Fatalf("the follower's client saw %d events of the record", n)
	}
}

// TestCoalesceRequestTooLarge: a result within MaxResultSize that the
// cluster refuses for its size (a --max-request-bytes below the default
// 1.5 MiB) is ErrResultTooLarge for the leader and for a follower on
// another client, as one over MaxResultSize is; nothing is cut.
func TestCoalesceRequestTooLarge(t *testing.T) {
	c := startCluster(t, 1, func(cfg *embed.Config) { cfg.MaxRequestBytes = 64 << 10 })
	ctx := ctxT(t, 30*time.Second)
	ma, _ := openOn(t, c.client(t), "/big", nil)
	mb, _ := openOn(t, c.client(t), "/big", nil)
	started, gate := make(chan struct{}), make(chan struct{})
	lead := coalescetest.DoAsync(ctx, ma, "k", func(context.Context) ([]byte, error) {
		close(started)
		<-gate
		return make([]byte, 100<<10), nil
	})
	<-started
	follow := coalescetest.DoAsync(ctx, mb, "k", func(context.Context) ([]byte, error) { return nil, errors.New("ran") })
	coalescetest.WaitPilots(t, ma, "k", 1)
	close(gate)
	for _, ch := range []<-chan coalescetest.Result{lead, follow} {
		r := coalescetest.Recv(t, ch, "caller")
		if !errors.Is(r.Err, coalesce.ErrResultTooLarge) || r.Res != nil {
			t.Fatalf("%d bytes, err=%v, want ErrResultTooLarge", len(r.Res), r.Err)
		}
		if !strings.Contains(r.Err.Error(), "102400 bytes") {
			t.Fatalf("the error does not say the size: %v", r.Err)
		}
	}
	// The bucket works on: a small result is shared.
	r, _, err := coalesce.New(mb).Do(ctx, "k", func(context.Context) ([]byte, error) { return []byte("small"), nil })
	if err != nil || string(r) != "small" {
		t.Fatalf("after: %q %v", r, err)
	}
}

// TestCoalesceLeaderCutOff: the leader's client is cut off by a proxy while
// its fn runs, until its lease (1 s) expires on the cluster: the waiting
// caller of the next Manager leads and the third Manager's callers get its
// whole result. When the leader's client is back and its fn returns, its
// late outcome is refused (DoWithin still finds the new leader's).
func TestCoalesceLeaderCutOff(t *testing.T) {
	c := startCluster(t, 1)
	ctx := ctxT(t, 30*time.Second)
	p := newProxy(t, c.endpoints()[0])
	ma, _ := openOn(t, clientOf(t, p.addr()), "/cutoff", &Options{TTL: time.Second, CallTimeout: time.Second})
	mb, _ := openOn(t, c.client(t), "/cutoff", nil)
	md, _ := openOn(t, c.client(t), "/cutoff", nil)
	started, gate := make(chan struct{}), make(chan struct{})
	lead := coalescetest.DoAsync(ctx, ma, "k", func(context.Context) ([]byte, error) {
		close(started)
		<-gate
		return []byte("stale"), nil
	})
	<-started
	next := coalescetest.DoAsync(ctx, mb, "k", func(context.Context) ([]byte, error) { return []byte("second"), nil })
	coalescetest.WaitPilots(t, mb, "k", 1)
	var others []<-chan coalescetest.Result
	for i := 0; i < 3; i++ {
		others = append(others, coalescetest.DoAsync(ctx, md, "k", func(context.Context) ([]byte, error) { return nil, errors.New("ran") }))
	}
	coalescetest.WaitMembers(t, md, "k", 3)
	coalescetest.WaitPilots(t, mb, "k", 2)
	p.setCut(true)
	if r := coalescetest.Recv(t, next, "next"); r.Err != nil || r.Shared || string(r.Res) != "second" {
		t.Fatalf("the next Manager's caller: %q shared=%v err=%v, want to lead", r.Res, r.Shared, r.Err)
	}
	for _, ch := range others {
		if r := coalescetest.Recv(t, ch, "other"); r.Err != nil || !r.Shared || string(r.Res) != "second" {
			t.Fatalf("a third Manager's caller: %q shared=%v err=%v, want the new leader's whole result", r.Res, r.Shared, r.Err)
		}
	}
	p.setCut(false)
	close(gate)
	coalescetest.Recv(t, lead, "the cut-off leader")
	r, shared, err := coalesce.New(md).DoWithin(ctx, "k", time.Hour, func(context.Context) ([]byte, error) { return nil, errors.New("ran") })
	if err != nil || !shared || string(r) != "second" {
		t.Fatalf("DoWithin after the cut-off leader returned: %q shared=%v err=%v", r, shared, err)
	}
}
