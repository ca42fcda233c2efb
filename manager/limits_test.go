package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
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
		holder.send("acquire h%d", i)
		holder.expect(fmt.Sprintf("acquired h%d", i))
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
		holder.send("release h%d", i)
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

// The Request form makes no heap allocation on the uncontended path.
func TestRequestAllocatesNothing(t *testing.T) {
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
	require.Zero(t, allocs)
	allocs = testing.AllocsPerRun(1000, func() {
		l, err := m.Acquire(ctx, "alloc", RequestOptions{})
		if err != nil {
			panic(err)
		}
		l.Release()
	})
	require.LessOrEqual(t, allocs, 1.0)
}

func TestCloseReleasesAndAborts(t *testing.T) {
	path := tablePath(t)
	m1 := openM(t, path, nil)
	m2 := openM(t, path, nil)
	ctx := ctxT(t, eventually)
	l, err := m1.Acquire(ctx, "c", RequestOptions{})
	require.NoError(t, err)
	other, err := m2.Acquire(ctx, "d", RequestOptions{})
	require.NoError(t, err)
	w1 := acquireAsync(ctx, m1, "d", RequestOptions{})
	w2 := acquireAsync(ctx, m2, "c", RequestOptions{})
	waitPending(t, m2, "c", 1)
	waitPending(t, m2, "d", 1)
	require.NoError(t, m1.Close())
	r := <-w1
	require.ErrorIs(t, r.err, ErrClosed)
	select {
	case <-l.Lost():
	default:
		t.Fatal("Close did not close Lost")
	}
	require.Error(t, l.Release())
	mustGrant(t, w2, "waiter granted when the holder's Manager closed").Release()
	require.NoError(t, m1.Close(), "second Close")
	_, err = m1.Query(ctx)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, m1.Request(ctx, "x", RequestOptions{}, nil), ErrClosed)
	require.NoError(t, other.Release())
	snap, err := m2.Query(ctx)
	require.NoError(t, err)
	require.Empty(t, snap.Held)
	require.Empty(t, snap.Pending)
	check(t, m2)
}

// Close while goroutines of the same Manager take and give back idle names
// by the fast path, which claims no slot and is not counted in flight:
// whatever each acquire returns, when Close returns no hold of the closed
// agent is left in the table (every name is free for another Manager), and
// the table passes the checker, quiescent orphans included.
func TestCloseRacingFastAcquires(t *testing.T) {
	path := tablePath(t)
	other := openM(t, path, nil)
	ctx := ctxT(t, eventually)
	names := []string{"f0", "f1", "f2", "f3"}
	rounds := 40
	if testing.Short() || raceEnabled {
		rounds = 15
	}
	for round := 0; round < rounds; round++ {
		m, err := Open(path, smallTable)
		require.NoError(t, err)
		for _, n := range names { // make the names idle entries: the fast path applies
			l, err := m.Acquire(ctx, n, RequestOptions{})
			require.NoError(t, err)
			require.NoError(t, l.Release())
		}
		var wg sync.WaitGroup
		var granted atomic.Int64
		for g := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					l, err := m.Acquire(ctx, names[g], RequestOptions{})
					if err != nil {
						if !errors.Is(err, ErrClosed) {
							t.Errorf("Acquire: %v", err)
						}
						return
					}
					granted.Add(1)
					if err := l.Release(); err != nil && !errors.Is(err, ErrClosed) {
						t.Errorf("Release: %v", err)
						return
					}
				}
			}()
		}
		for granted.Load() < int64(10*(round%4+1)) {
			if ctx.Err() != nil {
				t.Fatalf("round %d: no progress before the deadline", round)
			}
			runtime.Gosched()
		}
		require.NoError(t, m.Close())
		wg.Wait()
		require.NoError(t, other.Table().Check(nil), "round %d", round)
		for _, n := range names {
			l, err := other.Acquire(ctx, n, RequestOptions{IfAvailable: true})
			require.NoError(t, err, "round %d: %s is left held after Close", round, n)
			require.NoError(t, l.Release())
		}
	}
}

// Hard case 11: a request cancelled at the moment it is granted is either
// granted (and released by the caller) or not, never both, never leaked.
func TestCancelRacingGrant(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	rounds := 300
	if testing.Short() {
		rounds = 100
	}
	granted, aborted := 0, 0
	for i := 0; i < rounds; i++ {
		h, err := m.Acquire(context.Background(), "race", RequestOptions{})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), eventually) // cancelled below; the deadline only bounds the test
		ch := acquireAsync(ctx, m, "race", RequestOptions{})
		waitQueued(t, m, 1)
		var r result
		switch i % 3 {
		case 0: // the grant is seen before the cancellation: granted
			require.NoError(t, h.Release())
			r = <-ch
			require.NoError(t, r.err)
			cancel()
		case 1: // the cancellation first, then the release: aborted (a racing grant is passed on)
			cancel()
			require.NoError(t, h.Release())
		default: // both at once
			start := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); <-start; h.Release() }()
			go func() { defer wg.Done(); <-start; cancel() }()
			close(start)
			wg.Wait()
		}
		if r.l == nil && r.err == nil {
			r = <-ch
		}
		if i%3 == 1 {
			require.ErrorIs(t, r.err, ErrAborted)
		}
		if r.err == nil {
			granted++
			require.NoError(t, r.l.Release())
		} else {
			aborted++
			require.ErrorIs(t, r.err, ErrAborted)
		}
		waitQueued(t, m, 0)
		for m.Table().Usage().Held != 0 {
			runtime.Gosched()
		}
		check(t, m)
	}
	t.Logf("%d granted, %d aborted", granted, aborted)
	require.NotZero(t, granted)
	require.NotZero(t, aborted)
	require.Equal(t, 0, m.Table().Usage().Slots)
}

func waitQueued(t testing.TB, m *Manager, n int) {
	deadline := time.Now().Add(eventually)
	for m.Table().Usage().Waiting != n {
		require.True(t, time.Now().Before(deadline))
		runtime.Gosched()
	}
}

func TestRequestStolenCancelsCallback(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	inside := make(chan struct{})
	done := make(chan error, 1)
	fnErr := errors.New("callback saw cancellation")
	go func() {
		done <- m.Request(ctx, "s", RequestOptions{}, func(ctx context.Context, l *Lock) error {
			close(inside)
			<-ctx.Done()
			return fnErr
		})
	}()
	select {
	case <-inside:
	case <-ctx.Done():
		t.Fatal("callback never ran")
	}
	st, err := m.Acquire(ctx, "s", RequestOptions{Steal: true})
	require.NoError(t, err)
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrStolen)
		require.ErrorIs(t, err, fnErr)
	case <-ctx.Done():
		t.Fatal("Request did not return after its lock was stolen")
	}
	snap, err := m.Query(ctx)
	require.NoError(t, err)
	require.Len(t, snap.Held, 1, "the stealer's grant is untouched")
	check(t, m)
	require.NoError(t, st.Release())
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

// scanWithoutPause runs the bell loop's full scan back to back on another
// goroutine until the returned function is called (it waits for the scan).
func scanWithoutPause(m *Manager) (stop func()) {
	done := make(chan struct{})
	var scans sync.WaitGroup
	scans.Add(1)
	go func() {
		defer scans.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			if m.enter() {
				m.scan(true)
				m.leave()
			}
		}
	}()
	return func() {
		close(done)
		scans.Wait()
	}
}

// The bell loop's scan runs concurrently with Request recycling its Lock
// objects; it must never mark a live grant lost (a regression: a stale Lock
// pointer once made an uncontended Release report ErrStolen).
func TestScanNeverLosesRecycledLocks(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	stopScans := scanWithoutPause(m)
	var wg sync.WaitGroup
	n := 20000
	if raceEnabled {
		n = 3000
	}
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			fn := func(context.Context, *Lock) error { return nil }
			for i := 0; i < n; i++ {
				if err := m.Request(ctx, fmt.Sprint("r", g), RequestOptions{}, fn); err != nil {
					t.Errorf("Request: %v", err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	stopScans()
	check(t, m)
}

// Request recycles its Lock objects and releases an unregistered one without
// a CAS on its state word; a pooled Lock may have been registered with the
// bell loop in an earlier incarnation (its callback asked for Lost or the
// context's Done), or released by its callback. Mixed, with the bell loop
// scanning concurrently, no Request may fail and the table stays consistent.
func TestRequestReusesLocksAcrossRegistration(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	stopScans := scanWithoutPause(m)
	n := 3000
	if raceEnabled {
		n = 600
	}
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < n; i++ {
				kind := (i + g) % 3
				err := m.Request(ctx, fmt.Sprint("reuse", g%2), RequestOptions{}, func(fctx context.Context, l *Lock) error {
					switch kind {
					case 1: // registers l with the bell loop
						select {
						case <-l.Lost():
							return errors.New("lost while held")
						case <-fctx.Done():
							return errors.New("callback context done while held")
						default:
						}
					case 2: // releases l itself
						if err := l.Release(); err != nil {
							return err
						}
						if err := l.Release(); !errors.Is(err, ErrReleased) {
							return fmt.Errorf("second Release: %v", err)
						}
					}
					return nil
				})
				if err != nil {
					t.Errorf("Request %d (kind %d): %v", i, kind, err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	stopScans()
	check(t, m)
	for _, name := range []string{"reuse0", "reuse1"} {
		l, err := m.Acquire(ctx, name, RequestOptions{IfAvailable: true})
		require.NoError(t, err, "%s is left free", name)
		require.NoError(t, l.Release())
	}
}

// Lost and the Request context's Done, first called after the lock was
// already stolen, return closed channels (and do not deadlock).
func TestLostAfterTheFact(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	done := make(chan error, 1)
	stolen := make(chan struct{})
	go func() {
		done <- m.Request(ctx, "late", RequestOptions{}, func(ctx context.Context, l *Lock) error {
			<-stolen
			<-ctx.Done() // first call after the steal
			<-l.Lost()
			return nil
		})
	}()
	waitHeld(t, m, "late")
	st, err := m.Acquire(ctx, "late", RequestOptions{Steal: true})
	require.NoError(t, err)
	close(stolen)
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrStolen)
	case <-ctx.Done():
		t.Fatal("callback never saw the steal")
	}
	require.NoError(t, st.Release())
	// Acquire form: Lost called late.
	l, err := m.Acquire(ctx, "late2", RequestOptions{})
	require.NoError(t, err)
	st, err = m.Acquire(ctx, "late2", RequestOptions{Steal: true})
	require.NoError(t, err)
	select {
	case <-l.Lost():
	case <-ctx.Done():
		t.Fatal("Lost called after the steal did not close")
	}
	require.ErrorIs(t, l.Release(), ErrStolen)
	require.NoError(t, st.Release())
	check(t, m)
}

func waitHeld(t testing.TB, m *Manager, name string) {
	deadline := time.Now().Add(eventually)
	for {
		s, err := m.Query(context.Background())
		require.NoError(t, err)
		for _, h := range s.Held {
			if h.Name == name {
				return
			}
		}
		require.True(t, time.Now().Before(deadline))
		time.Sleep(time.Millisecond)
	}
}

// Releases racing with Close: each returns nil or ErrClosed, none faults,
// and the table is consistent and empty afterwards (Close leaves the mapping
// in place until the Manager is garbage, so a racing Release reads valid
// memory and finds its slot already freed).
func TestReleaseRacingClose(t *testing.T) {
	path := tablePath(t)
	other := openM(t, path, nil)
	for round := 0; round < 20; round++ {
		m, err := Open(path, smallTable)
		require.NoError(t, err)
		var locks []*Lock
		for i := 0; i < 16; i++ {
			l, err := m.Acquire(context.Background(), fmt.Sprint("rc", i), RequestOptions{})
			require.NoError(t, err)
			locks = append(locks, l)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, l := range locks {
			wg.Add(1)
			go func(l *Lock) {
				defer wg.Done()
				<-start
				if err := l.Release(); err != nil {
					require.ErrorIs(t, err, ErrClosed)
				}
			}(l)
		}
		close(start)
		require.NoError(t, m.Close())
		wg.Wait()
		snap, err := other.Query(context.Background())
		require.NoError(t, err)
		require.Empty(t, snap.Held)
		check(t, other)
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
