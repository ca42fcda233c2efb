package manager_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

func TestSmallGeometryOpens(t *testing.T) {
	m := openM(t, tablePath(t), &OpenOptions{MaxResources: 16, MaxRequests: 64, MaxAgents: 16})
	l, err := m.Acquire(context.Background(), "x", RequestOptions{})
	require.NoError(t, err)
	require.NoError(t, l.Release())
	check(t, m)
}

// Hard case 13: a full table refuses with ErrTableFull naming the limit and
// disturbs nothing already held or queued.
func TestTableFull(t *testing.T) {
	ctx := ctxT(t, eventually)
	t.Run("resources", func(t *testing.T) {
		m := openM(t, tablePath(t), &OpenOptions{MaxResources: 4, MaxRequests: 64, MaxAgents: 4})
		var held []*Lock
		for i := 0; i < 4; i++ {
			l, err := m.Acquire(ctx, fmt.Sprint("n", i), RequestOptions{})
			require.NoError(t, err)
			held = append(held, l)
		}
		_, err := m.Acquire(ctx, "n4", RequestOptions{})
		require.ErrorIs(t, err, ErrTableFull)
		require.Contains(t, err.Error(), "MaxResources")
		// Existing names still take more requests.
		w := acquireAsync(ctx, m, "n0", RequestOptions{})
		waitPending(t, m, "n0", 1)
		check(t, m)
		for _, l := range held {
			require.NoError(t, l.Release())
		}
		mustGrant(t, w, "queued on an existing name").Release()
		check(t, m)
	})
	t.Run("requests", func(t *testing.T) {
		m := openM(t, tablePath(t), &OpenOptions{MaxResources: 16, MaxRequests: 3, MaxAgents: 4})
		a, err := m.Acquire(ctx, "a", RequestOptions{Mode: Shared})
		require.NoError(t, err)
		b, err := m.Acquire(ctx, "a", RequestOptions{Mode: Shared})
		require.NoError(t, err)
		w := acquireAsync(ctx, m, "a", RequestOptions{})
		waitPending(t, m, "a", 1)
		_, err = m.Acquire(ctx, "b", RequestOptions{})
		require.ErrorIs(t, err, ErrTableFull)
		require.Contains(t, err.Error(), "MaxRequests")
		snap, err := m.Query(ctx)
		require.NoError(t, err)
		require.Len(t, snap.Held, 2)
		require.Len(t, snap.Pending, 1)
		check(t, m)
		require.NoError(t, a.Release())
		require.NoError(t, b.Release())
		mustGrant(t, w, "queued request survives a full table").Release()
	})
	t.Run("agents", func(t *testing.T) {
		path := tablePath(t)
		opts := &OpenOptions{MaxResources: 16, MaxRequests: 64, MaxAgents: 2}
		m1 := openM(t, path, opts)
		l, err := m1.Acquire(ctx, "x", RequestOptions{})
		require.NoError(t, err)
		openM(t, path, opts)
		_, err = Open(path, opts)
		require.ErrorIs(t, err, ErrTableFull)
		require.Contains(t, err.Error(), "agents")
		check(t, m1)
		require.NoError(t, l.Release())
	})
}

// A name whose last holder and waiter left frees its entry: a million
// distinct names used one after another never fill a 16-name table.
func TestMillionNames(t *testing.T) {
	n := 1_000_000
	if testing.Short() || raceEnabled {
		n = 100_000
	}
	m := openM(t, tablePath(t), &OpenOptions{MaxResources: 16, MaxRequests: 64, MaxAgents: 4})
	ctx := context.Background()
	fn := func(ctx context.Context, l *Lock) error { return nil }
	buf := []byte("name-")
	for i := 0; i < n; i++ {
		name := string(strconv.AppendInt(buf[:5], int64(i), 10))
		require.NoError(t, m.Request(ctx, name, RequestOptions{}, fn))
	}
	require.Equal(t, 0, m.Table().Usage().Entries)
	check(t, m)
}

// Hard case 14: tokens keep increasing per name after its entry was freed and
// reused, also by another agent, and across steals.
func TestTokensAcrossEntryReuse(t *testing.T) {
	path := tablePath(t)
	m1 := openM(t, path, &OpenOptions{MaxResources: 2, MaxRequests: 16, MaxAgents: 4})
	m2 := openM(t, path, nil)
	ctx := context.Background()
	var last uint64
	for i := 0; i < 50; i++ {
		m := m1
		if i%2 == 1 {
			m = m2
		}
		l, err := m.Acquire(ctx, "t", RequestOptions{Steal: i%5 == 0})
		require.NoError(t, err)
		require.Greater(t, l.Token(), last)
		last = l.Token()
		require.NoError(t, l.Release())
		// Churn other names through the two entries so "t" lands on a different one.
		for j := 0; j < 3; j++ {
			o, err := m.Acquire(ctx, fmt.Sprint("o", i, j), RequestOptions{})
			require.NoError(t, err)
			require.NoError(t, o.Release())
		}
		require.Equal(t, 0, m.Table().Usage().Entries)
	}
}

// Hard case 12: 5,000 goroutines of one process waiting on locks stay under
// 100 OS threads (they park on channels behind one doorbell, not in futex calls).
func TestThreadsStayFewWith5000Waiters(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, &OpenOptions{MaxResources: 64, MaxRequests: 6000, MaxAgents: 8})
	holder := spawn(t, path, nil)
	for i := 0; i < 10; i++ {
		holder.Send("acquire h%d", i)
		holder.Expect(fmt.Sprintf("acquired h%d", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*eventually)
	defer cancel()
	const n = 5000
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs <- m.Request(ctx, fmt.Sprint("h", i%10), RequestOptions{Mode: Mode(i % 2)}, func(context.Context, *Lock) error { return nil })
		}(i)
	}
	deadline := time.Now().Add(2 * eventually)
	for m.Table().Usage().Waiting < n {
		require.True(t, time.Now().Before(deadline), "waiters did not queue")
		time.Sleep(5 * time.Millisecond)
	}
	threads := osThreads(t)
	t.Logf("%d goroutines waiting, %d OS threads", n, threads)
	require.Less(t, threads, 100)
	check(t, m)
	for i := 0; i < 10; i++ {
		holder.Send("release h%d", i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	check(t, m)
}

func osThreads(t testing.TB) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc")
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Skip("no thread count")
	return 0
}

// The Request form makes one heap allocation on the uncontended path: its
// grant (fn's Lock and ctx, fnctx.go), which fn may keep, so it is never
// pooled. Acquire makes at most the Lock.
func TestRequestAllocatesOneGrant(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	m := openM(t, tablePath(t), nil)
	ctx := context.Background()
	fn := func(ctx context.Context, l *Lock) error { return nil }
	require.NoError(t, m.Request(ctx, "alloc", RequestOptions{}, fn))
	allocs := testing.AllocsPerRun(1000, func() {
		if err := m.Request(ctx, "alloc", RequestOptions{}, fn); err != nil {
			panic(err)
		}
	})
	require.Equal(t, 1.0, allocs)
	allocs = testing.AllocsPerRun(1000, func() {
		l, err := m.Acquire(ctx, "alloc", RequestOptions{})
		if err != nil {
			panic(err)
		}
		l.Release()
	})
	require.LessOrEqual(t, allocs, 1.0)
}

func TestSnapshotJSON(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	snap, err := m.Query(context.Background())
	require.NoError(t, err)
	b, err := json.Marshal(snap)
	require.NoError(t, err)
	require.JSONEq(t, `{"held":[],"pending":[]}`, string(b))
	l, err := m.Acquire(context.Background(), "j", RequestOptions{Mode: Shared})
	require.NoError(t, err)
	snap, err = m.Query(context.Background())
	require.NoError(t, err)
	b, err = json.Marshal(snap)
	require.NoError(t, err)
	require.JSONEq(t, fmt.Sprintf(`{"held":[{"name":"j","mode":"shared","clientId":%q,"pid":%d}],"pending":[]}`, m.ClientID(), os.Getpid()), string(b))
	require.NoError(t, l.Release())
}

// Names are byte strings: NUL bytes, non-ASCII and invalid UTF-8 round-trip.
func TestNamesAreBytes(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := context.Background()
	for _, name := range []string{"", "a\x00b", "日本", "\xff\xfe", strings.Repeat("z", 64)} {
		l, err := m.Acquire(ctx, name, RequestOptions{})
		require.NoError(t, err, "%q", name)
		snap, err := m.Query(ctx)
		require.NoError(t, err)
		require.Len(t, snap.Held, 1)
		require.True(t, bytes.Equal([]byte(name), []byte(snap.Held[0].Name)), "%q round-trips", name)
		_, err = m.Acquire(ctx, name, RequestOptions{IfAvailable: true})
		require.ErrorIs(t, err, ErrNotAvailable)
		require.NoError(t, l.Release())
	}
	check(t, m)
}

func TestClientIDUnique(t *testing.T) {
	path := tablePath(t)
	seen := map[string]bool{}
	for i := 0; i < 10; i++ {
		m := openM(t, path, nil)
		require.False(t, seen[m.ClientID()])
		seen[m.ClientID()] = true
		require.Equal(t, m.ClientID(), m.ClientID())
	}
}

// A Lock that escapes its caller is one heap object per Acquire, so its size
// is a cost of every such Acquire: a Lock fills one 64-byte size class, with
// nothing wasted on 64-bit machines.
func TestLockSizes(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes are those of 64-bit machines")
	}
	require.Equal(t, uintptr(64), unsafe.Sizeof(Lock{}))
}

// allocKept makes the handles of the escaping case escape.
var allocKept *Lock

// inlineProbe is inlined, and its int kept on the caller's stack, unless
// the build turns inlining off (-gcflags=-l, as debuggers want).
func inlineProbe() *int { return new(int) }

var inlineSink int

// Acquire is inlined into its caller and neither it nor Release retains the
// Lock, so a handle that does not outlive its caller's frame is no heap
// allocation at all; one the caller keeps is exactly one. This fails if a
// change makes Acquire too big to inline or makes Acquire, Release or what
// they call retain the Lock (go build -gcflags=-m shows which).
func TestAcquireOnTheStack(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	if testing.AllocsPerRun(100, func() { p := inlineProbe(); *p = 1; inlineSink += *p }) != 0 {
		t.Skip("inlining is off in this build: every handle is a heap object")
	}
	m := openM(t, tablePath(t), nil)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		l, err := m.Acquire(ctx, "stack", RequestOptions{})
		if err != nil {
			panic(err)
		}
		if l.Name() != "stack" || l.Token() == 0 {
			panic("not the grant")
		}
		if err := l.Release(); err != nil {
			panic(err)
		}
	})
	if unsafe.Sizeof(uintptr(0)) == 8 {
		require.Zero(t, allocs, "a handle that stays in its caller's frame")
	} else {
		// On 386 the Lock's 64-bit atomics are calls the compiler cannot
		// see through, so every handle is on the heap.
		require.LessOrEqual(t, allocs, 1.0)
	}
	allocs = testing.AllocsPerRun(1000, func() {
		l, err := m.Acquire(ctx, "stack", RequestOptions{})
		if err != nil {
			panic(err)
		}
		allocKept = l
		if err := l.Release(); err != nil {
			panic(err)
		}
	})
	require.Equal(t, 1.0, allocs, "a handle the caller keeps")
	check(t, m)
}
