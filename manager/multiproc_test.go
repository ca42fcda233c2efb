package manager

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// P (parent) and children Q, R interleave on one name:
//
//	Q: acquire x            -> granted
//	R: acquire x            -> blocks (queued)
//	P: acquire x            -> blocks (queued behind R)
//	Q: release x            -> R granted, P still blocked
//	R: release x            -> P granted; tokens Q < R < P
func TestProcessesFIFOExclusive(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	q, r := spawn(t, path, nil), spawn(t, path, nil)
	q.send("acquire x")
	tq := tokenOf(q.expect("acquired x"))
	r.send("acquire x")
	waitPending(t, m, "x", 1)
	ctx := ctxT(t, eventually)
	p := acquireAsync(ctx, m, "x", RequestOptions{})
	waitPending(t, m, "x", 2)
	r.quiet("acquired")
	mustBlock(t, p, "P behind R")
	check(t, m)
	q.send("release x")
	q.expect("released x")
	tr := tokenOf(r.expect("acquired x"))
	mustBlock(t, p, "P behind R's hold")
	r.send("release x")
	r.expect("released x")
	l := mustGrant(t, p, "P after R")
	require.Less(t, tq, tr)
	require.Less(t, tr, l.Token())
	require.NoError(t, l.Release())
	check(t, m)
}

// Shared holders in two processes; an exclusive request in a third waits for
// both; a shared request queued after it waits for it (hard case 1, across processes).
func TestProcessesSharedAndExclusive(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	q, r, s := spawn(t, path, nil), spawn(t, path, nil), spawn(t, path, nil)
	q.send("acquire db shared")
	q.expect("acquired db")
	r.send("acquire db shared")
	r.expect("acquired db")
	s.send("acquire db")
	waitPending(t, m, "db", 1)
	ctx := ctxT(t, eventually)
	p := acquireAsync(ctx, m, "db", RequestOptions{Mode: Shared})
	waitPending(t, m, "db", 2)
	mustBlock(t, p, "shared behind queued exclusive")
	q.send("release db")
	q.expect("released db")
	s.quiet("acquired")
	r.send("release db")
	r.expect("released db")
	s.expect("acquired db")
	mustBlock(t, p, "shared while exclusive held")
	check(t, m)
	s.send("release db")
	s.expect("released db")
	mustGrant(t, p, "shared after exclusive").Release()
	check(t, m)
}

// Query sees every process's held and pending requests, pending in queue order.
func TestProcessesQuery(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	q, r, s := spawn(t, path, nil), spawn(t, path, nil), spawn(t, path, nil)
	q.send("acquire a")
	q.expect("acquired a")
	r.send("acquire a shared")
	waitPending(t, m, "a", 1)
	s.send("acquire a")
	waitPending(t, m, "a", 2)
	snap, err := m.Query(context.Background())
	require.NoError(t, err)
	require.Equal(t, []LockInfo{{Name: "a", Mode: Exclusive, ClientID: q.client, PID: q.pid}}, snap.Held)
	require.Equal(t, []LockInfo{
		{Name: "a", Mode: Shared, ClientID: r.client, PID: r.pid},
		{Name: "a", Mode: Exclusive, ClientID: s.client, PID: s.pid},
	}, snap.Pending)
	// The same view from another process.
	require.Equal(t, snap, q.query())
	q.send("release a")
	r.expect("acquired a")
	r.send("release a")
	s.expect("acquired a")
	s.send("release a")
	s.expect("released a")
	snap, err = m.Query(context.Background())
	require.NoError(t, err)
	require.Empty(t, snap.Held)
	require.Empty(t, snap.Pending)
	check(t, m)
}

// Steal across processes: the victim learns promptly (Lost closes), its
// later Release reports ErrStolen and does not touch the stealer's grant.
func TestProcessesSteal(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	q, r := spawn(t, path, nil), spawn(t, path, nil)
	q.send("acquire k")
	tq := tokenOf(q.expect("acquired k"))
	q.send("watch k")
	r.send("acquire k")
	waitPending(t, m, "k", 1)
	ctx := ctxT(t, eventually)
	t0 := time.Now()
	st, err := m.Acquire(ctx, "k", RequestOptions{Steal: true})
	require.NoError(t, err)
	require.Greater(t, st.Token(), tq)
	q.expect("lost k")
	// Reported, not asserted: steal to the victim's Lost closing, as seen
	// here (includes the child's stdout pipe).
	t.Logf("victim learnt of the steal %v after it", time.Since(t0))
	q.send("release k")
	q.expect("stolen k")
	check(t, m)
	snap, err := m.Query(ctx)
	require.NoError(t, err)
	require.Equal(t, []LockInfo{{Name: "k", Mode: Exclusive, ClientID: m.ClientID(), PID: os.Getpid()}}, snap.Held)
	r.quiet("acquired")
	require.NoError(t, st.Release())
	r.expect("acquired k")
	check(t, m)
}

// IfAvailable across processes, and a dead holder does not make it fail forever.
func TestProcessesIfAvailable(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	q := spawn(t, path, nil)
	q.send("acquire i")
	q.expect("acquired i")
	_, err := m.Acquire(context.Background(), "i", RequestOptions{IfAvailable: true})
	require.ErrorIs(t, err, ErrNotAvailable)
	r := spawn(t, path, nil)
	r.send("acquire i ifavailable")
	r.expect("notavailable i")
	q.send("release i")
	q.expect("released i")
	r.send("acquire i ifavailable")
	r.expect("acquired i")
	check(t, m)
}

// Many processes open the same fresh path at once: one table, all agents see each other.
func TestProcessesCreateRace(t *testing.T) {
	path := tablePath(t)
	const n = 6
	children := make([]*child, n)
	var wg sync.WaitGroup
	for i := range children {
		children[i] = start(t, path, nil)
	}
	for _, c := range children {
		wg.Add(1)
		go func(c *child) {
			defer wg.Done()
			c.expect("ready")
		}(c)
	}
	wg.Wait()
	for i, c := range children {
		c.send("acquire n%d", i)
		c.expect(fmt.Sprintf("acquired n%d", i))
	}
	m := openM(t, path, nil)
	snap, err := m.Query(context.Background())
	require.NoError(t, err)
	require.Len(t, snap.Held, n)
	check(t, m)
	_ = strings.TrimSpace
}
