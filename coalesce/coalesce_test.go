package coalesce

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/seam"
	"github.com/shmlocks/shmlocks/manager"
)

type coResult struct {
	res    []byte
	shared bool
	err    error
}

func coalesceAsync(ctx context.Context, m *manager.Manager, name string, fn func(context.Context) ([]byte, error)) <-chan coResult {
	ch := make(chan coResult, 1)
	go func() {
		r, s, err := New(m).Do(ctx, name, fn)
		ch <- coResult{r, s, err}
	}()
	return ch
}

func recv(t *testing.T, ch <-chan coResult) coResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(eventually):
		t.Fatalf("Do did not return within %v", eventually)
	}
	return coResult{}
}

// 16 goroutines of one Manager: one run, one leader, 15 shared copies. Each
// calls through a Group of its own (coalesceAsync): the flight is the
// Manager's, so they share it in memory (waitMembers).
func TestCoalesceGoroutinesRunOnce(t *testing.T) {
	m := openM(t, tablePath(t))
	ctx := ctxT(t, eventually)
	var runs atomic.Int32
	gate := make(chan struct{})
	fn := func(context.Context) ([]byte, error) {
		runs.Add(1)
		<-gate
		return []byte("profile"), nil
	}
	var chs []<-chan coResult
	for i := 0; i < 16; i++ {
		chs = append(chs, coalesceAsync(ctx, m, "user", fn))
	}
	waitMembers(t, m, "user", 15) // the 16th runs fn
	close(gate)
	leaders := 0
	var first []byte
	for _, ch := range chs {
		r := recv(t, ch)
		require.NoError(t, r.err)
		require.Equal(t, "profile", string(r.res))
		if !r.shared {
			leaders++
		} else if first == nil {
			first = r.res
		} else {
			require.NotSame(t, &first[0], &r.res[0], "each follower gets its own copy")
		}
	}
	require.Equal(t, int32(1), runs.Load())
	require.Equal(t, 1, leaders)
	checkAll(t, m)

	// Over: the next caller runs fn again (nothing cached)...
	r, shared, err := New(m).Do(ctx, "user", func(context.Context) ([]byte, error) { return []byte("v2"), nil })
	require.NoError(t, err)
	require.False(t, shared)
	require.Equal(t, "v2", string(r))
	// ...unless it accepts a recent result.
	r, shared, err = New(m).DoWithin(ctx, "user", time.Hour, func(context.Context) ([]byte, error) {
		t.Fatal("ran")
		return nil, nil
	})
	require.NoError(t, err)
	require.True(t, shared)
	require.Equal(t, "v2", string(r))
	// A result older than maxAge is not accepted.
	r, shared, err = New(m).DoWithin(ctx, "user", time.Nanosecond, func(context.Context) ([]byte, error) { return []byte("v3"), nil })
	require.NoError(t, err)
	require.False(t, shared)
	require.Equal(t, "v3", string(r))
}

// A follower whose ctx ends returns ErrAborted at once and leaves the flight
// intact; the leader's ctx ending while its fn fails hands the lead to the
// next caller, who runs its own fn still under the flight lock.
func TestCoalesceCallerCtx(t *testing.T) {
	m := openM(t, tablePath(t))
	ctx := ctxT(t, eventually)
	leadCtx, cancelLead := context.WithCancel(ctx)
	started := make(chan struct{})
	lead := coalesceAsync(leadCtx, m, "x", func(ctx context.Context) ([]byte, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	<-started
	quitCtx, quit := context.WithCancel(ctx)
	quitter := coalesceAsync(quitCtx, m, "x", func(context.Context) ([]byte, error) { panic("the quitter never runs") })
	var runs atomic.Int32
	follower := coalesceAsync(ctx, m, "x", func(context.Context) ([]byte, error) {
		runs.Add(1)
		return []byte("second"), nil
	})
	waitMembers(t, m, "x", 2)
	quit()
	r := recv(t, quitter)
	require.ErrorIs(t, r.err, manager.ErrAborted)
	require.ErrorIs(t, r.err, context.Canceled)
	waitMembers(t, m, "x", 1)
	cancelLead()
	r = recv(t, lead)
	require.ErrorIs(t, r.err, manager.ErrAborted)
	r = recv(t, follower)
	require.NoError(t, r.err)
	require.False(t, r.shared, "the follower led")
	require.Equal(t, "second", string(r.res))
	require.Equal(t, int32(1), runs.Load())
	checkAll(t, m)
}

// A leader whose fn succeeds keeps its result even if its ctx ended meanwhile.
func TestCoalesceLeaderCtxEndsAfterSuccess(t *testing.T) {
	m := openM(t, tablePath(t))
	ctx := ctxT(t, eventually)
	leadCtx, cancelLead := context.WithCancel(ctx)
	gate, started := make(chan struct{}), make(chan struct{})
	lead := coalesceAsync(leadCtx, m, "x", func(ctx context.Context) ([]byte, error) {
		close(started)
		<-gate
		return []byte("done"), nil
	})
	<-started
	follower := coalesceAsync(ctx, m, "x", func(context.Context) ([]byte, error) { panic("must not run") })
	waitMembers(t, m, "x", 1)
	cancelLead()
	close(gate)
	r := recv(t, lead)
	require.NoError(t, r.err)
	require.Equal(t, "done", string(r.res))
	r = recv(t, follower)
	require.NoError(t, r.err)
	require.True(t, r.shared)
	require.Equal(t, "done", string(r.res))
}

// Errors: a local follower gets the leader's error value; a follower in
// another Manager (agent) of the table gets ErrLeaderFailed with its text; a
// result over MaxResultSize is ErrResultTooLarge for all of them.
func TestCoalesceErrors(t *testing.T) {
	path := tablePath(t)
	m, m2 := openM(t, path), openM(t, path)
	ctx := ctxT(t, eventually)
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		res  []byte
		err  error
		want error // in the other agent
	}{
		{"fails", nil, boom, ErrLeaderFailed},
		{"big", make([]byte, MaxResultSize+1), nil, ErrResultTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gate, started := make(chan struct{}), make(chan struct{})
			lead := coalesceAsync(ctx, m, tc.name, func(context.Context) ([]byte, error) {
				close(started)
				<-gate
				return tc.res, tc.err
			})
			<-started
			local := coalesceAsync(ctx, m, tc.name, func(context.Context) ([]byte, error) { panic("must not run") })
			other := coalesceAsync(ctx, m2, tc.name, func(context.Context) ([]byte, error) { panic("must not run") })
			waitMembers(t, m, tc.name, 1)
			waitPending(t, m, "-c:"+tc.name, 1)
			close(gate)
			rl, rf, ro := recv(t, lead), recv(t, local), recv(t, other)
			if tc.err != nil {
				require.Same(t, tc.err, rl.err)
				require.Same(t, tc.err, rf.err, "the original error value in the same process")
				require.ErrorIs(t, ro.err, ErrLeaderFailed)
				require.Contains(t, ro.err.Error(), "boom")
			} else {
				for _, r := range []coResult{rl, rf, ro} {
					require.ErrorIs(t, r.err, ErrResultTooLarge)
					require.Nil(t, r.res, "never a truncation")
				}
				require.Contains(t, rl.err.Error(), fmt.Sprint(MaxResultSize+1))
			}
			require.True(t, rf.shared)
			require.True(t, ro.shared)
			checkAll(t, m)
		})
	}
}

// A panic in fn is its caller's; the followers get an error.
func TestCoalescePanic(t *testing.T) {
	m := openM(t, tablePath(t))
	ctx := ctxT(t, eventually)
	gate, started := make(chan struct{}), make(chan struct{})
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		New(m).Do(ctx, "x", func(context.Context) ([]byte, error) {
			close(started)
			<-gate
			panic("fn bug")
		})
	}()
	<-started
	follower := coalesceAsync(ctx, m, "x", func(context.Context) ([]byte, error) { panic("must not run") })
	waitMembers(t, m, "x", 1)
	close(gate)
	select {
	case v := <-panicked:
		require.Equal(t, "fn bug", v)
	case <-time.After(eventually):
		t.Fatal("no panic")
	}
	r := recv(t, follower)
	require.ErrorContains(t, r.err, "fn panicked: fn bug")
}

// Validation: names as for Request; a name too long for "-c:" uses a hashed
// flight lock name; a closed Manager; a done ctx.
func TestCoalesceValidation(t *testing.T) {
	m := openM(t, tablePath(t))
	ctx := ctxT(t, eventually)
	ok := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	_, _, err := New(m).Do(ctx, "-x", ok)
	require.ErrorIs(t, err, manager.ErrNotSupported)
	_, _, err = New(m).Do(ctx, strings.Repeat("n", 65), ok)
	require.ErrorIs(t, err, manager.ErrNotSupported)
	_, _, err = New(m).Do(ctx, "x", nil)
	require.ErrorIs(t, err, manager.ErrNotSupported)
	_, _, err = New(m).DoWithin(ctx, "x", -1, ok)
	require.ErrorIs(t, err, manager.ErrNotSupported)
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, _, err = New(m).Do(done, "x", ok)
	require.ErrorIs(t, err, manager.ErrAborted)
	long := strings.Repeat("n", 64) // MaxNameLen: "-c:"+name does not fit
	r, _, err := New(m).Do(ctx, long, ok)
	require.NoError(t, err)
	require.Equal(t, "ok", string(r))
	ln, err := flightName(long, smallTable.MaxNameLen)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(ln, "-c#"))
	require.LessOrEqual(t, len(ln), 64)
	checkAll(t, m)
	m.Close()
	_, _, err = New(m).Do(ctx, "x", ok)
	require.ErrorIs(t, err, manager.ErrClosed)
	// The zero Group, and one of a nil Manager, have no Manager: ErrClosed.
	var zero Group
	_, _, err = zero.Do(ctx, "x", ok)
	require.ErrorIs(t, err, manager.ErrClosed)
	_, _, err = New(nil).Do(ctx, "x", ok)
	require.ErrorIs(t, err, manager.ErrClosed)
	require.ErrorIs(t, (*Group)(nil).Check(), manager.ErrClosed)
}

// The outcome file is untrusted: every damage is ErrCorrupt naming the field
// and its value, and Coalesce leads anew (replacing it) rather than fail.
func TestCoalesceCorruptOutcome(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path)
	ctx := ctxT(t, eventually)
	_, _, err := New(m).Do(ctx, "x", func(context.Context) ([]byte, error) { return []byte("good"), nil })
	require.NoError(t, err)
	rp := recordPath(path, "x")
	good, err := os.ReadFile(rp)
	require.NoError(t, err)
	b, err := seam.Open(m, feature)
	require.NoError(t, err)
	damage := []struct {
		field string
		edit  func(b []byte) []byte
	}{
		{"size", func(b []byte) []byte { return b[:10] }},
		{"magic", func(b []byte) []byte { b[0] = 'X'; return b }},
		{"version", func(b []byte) []byte { b[8] = 9; return b }},
		{"kind", func(b []byte) []byte { b[12] = 7; return b }},
		{"name length", func(b []byte) []byte { b[35] = 0xff; return b }},
		{"data length", func(b []byte) []byte { b[39] = 0xff; return b }},
		{"size", func(b []byte) []byte { return append(b, 0) }},
		{"checksum", func(b []byte) []byte { b[len(b)-1] ^= 1; return b }},
		{"reserved", func(b []byte) []byte { b[44] = 1; return b }},
		{"size", func(b []byte) []byte { return append(b, make([]byte, maxRecord(smallTable.MaxNameLen))...) }},
	}
	for _, d := range damage {
		require.NoError(t, os.WriteFile(rp, d.edit(bytes.Clone(good)), 0o600))
		_, err := load(b, "x")
		require.ErrorIs(t, err, manager.ErrCorrupt, d.field)
		require.Contains(t, err.Error(), "field "+d.field, d.field)
		require.ErrorIs(t, New(m).Check(), manager.ErrCorrupt, d.field)
		r, shared, err := New(m).DoWithin(ctx, "x", time.Hour, func(context.Context) ([]byte, error) { return []byte("fresh"), nil })
		require.NoError(t, err, d.field)
		require.False(t, shared, d.field)
		require.Equal(t, "fresh", string(r))
		checkAll(t, m)
	}
	// Another key's outcome under x's record key (a collision) is no result.
	o, err := load(b, "x")
	require.NoError(t, err)
	o.key = "y"
	require.NoError(t, os.WriteFile(rp, encodeRecord(o), 0o600))
	o2, err := load(b, "x")
	require.NoError(t, err)
	require.Nil(t, o2)
	require.ErrorIs(t, New(m).Check(), manager.ErrCorrupt)
	// A file that is no record's is reported too.
	require.NoError(t, os.WriteFile(rp, good, 0o600))
	require.NoError(t, New(m).Check())
	require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(rp), "stray"), nil, 0o600))
	require.ErrorContains(t, New(m).Check(), "unexpected file")
}

// Many goroutines of two Managers, repeatedly: every call returns, runs < calls.
func TestCoalesceTwoAgentsRepeated(t *testing.T) {
	path := tablePath(t)
	ms := []*manager.Manager{openM(t, path), openM(t, path)}
	ctx := ctxT(t, eventually)
	var runs, calls atomic.Int32
	var wg sync.WaitGroup
	for _, m := range ms {
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 20; i++ {
					_, _, err := New(m).Do(ctx, "x", func(context.Context) ([]byte, error) {
						runs.Add(1)
						time.Sleep(100 * time.Microsecond)
						return []byte("r"), nil
					})
					if err != nil {
						t.Error(err)
						return
					}
					calls.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	require.Equal(t, int32(2*8*20), calls.Load())
	require.Less(t, runs.Load(), calls.Load())
	checkAll(t, ms[0])
}

// fn calling Do on its own key would wait for itself: ErrWouldDeadlock
// at once. Another name is fine.
func TestCoalesceFromOwnFn(t *testing.T) {
	m := openM(t, tablePath(t))
	ctx := ctxT(t, eventually)
	res, _, err := New(m).Do(ctx, "x", func(ctx context.Context) ([]byte, error) {
		_, _, err := New(m).Do(ctx, "x", func(context.Context) ([]byte, error) { panic("must not run") })
		if !errors.Is(err, manager.ErrWouldDeadlock) {
			return nil, fmt.Errorf("nested on x: %v", err)
		}
		inner, _, err := New(m).Do(context.WithoutCancel(ctx), "y", func(context.Context) ([]byte, error) { return []byte("y"), nil })
		return append([]byte("x+"), inner...), err
	})
	require.NoError(t, err)
	require.Equal(t, "x+y", string(res))
}
