package manager_test

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

// captureHandler is a slog.Handler that keeps every record.
type captureHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *captureHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *captureHandler) WithGroup(string) slog.Handler            { return h }
func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}

// find returns the attributes of every record with message msg.
func (h *captureHandler) find(msg string) []map[string]any {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]any
	for _, r := range h.recs {
		if r.Message != msg {
			continue
		}
		attrs := map[string]any{"level": r.Level}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.Any(); return true })
		out = append(out, attrs)
	}
	return out
}

// waitRecord waits (bounded) for a record with message msg and returns it.
func (h *captureHandler) waitRecord(t *testing.T, msg string) map[string]any {
	t.Helper()
	var got []map[string]any
	require.Eventually(t, func() bool { got = h.find(msg); return len(got) > 0 }, eventually, time.Millisecond,
		"no log record %q", msg)
	return got[0]
}

const (
	msgReap    = "shmlocks: reaped a dead agent"
	msgRepair  = "shmlocks: took over a bucket latch from a dead owner; bucket rebuilt"
	msgCorrupt = "shmlocks: corrupt lock table"
	msgSteal   = "shmlocks: lock stolen from its holders"
	msgLost    = "shmlocks: held lock taken away"
)

func loggedOpts(base *OpenOptions, h slog.Handler) *OpenOptions {
	o := *base
	o.Logger, o.Stats = slog.New(h), true
	return &o
}

// A child process dies holding the latch of x's bucket (SIGKILLed at the
// crash point latch.acquired); the survivor that takes x reaps it and takes
// the latch over: both are logged, with the dead process's pid, and counted.
//
//	V: acquire x, dies with the latch held
//	P: acquire x (takes the latch over, rebuilds the bucket; reaps V)
func TestLogReapAndRepair(t *testing.T) {
	h := &captureHandler{}
	path := tablePath(t)
	e := &crashEnv{t: t, path: path, m: openM(t, path, loggedOpts(crashGeometry, h))}
	v := e.victim("latch.acquired")
	v.Send("acquire x")
	e.died(v)
	l := mustGrant(t, acquireAsync(ctxT(t, eventually), e.m, "x", RequestOptions{}), "x after V died with its latch")
	check(t, e.m)
	require.NoError(t, l.Release())
	// Nothing of ours waits, so no pidfd watches V: Query reaps it.
	_, err := e.m.Query(ctxT(t, eventually))
	require.NoError(t, err)

	defer func() {
		if t.Failed() {
			for _, r := range h.recs {
				t.Logf("record: %v", r)
			}
		}
	}()
	reap := h.waitRecord(t, msgReap)
	require.Equal(t, int64(v.Pid), reap["pid"], "the reaped agent's pid")
	require.Equal(t, slog.LevelWarn, reap["level"])
	require.Equal(t, path, reap["table"])
	repair := h.waitRecord(t, msgRepair)
	require.Contains(t, repair, "bucket")

	st, err := e.m.Stats()
	require.NoError(t, err)
	require.True(t, st.Enabled)
	require.GreaterOrEqual(t, st.Reaps, uint64(1))
	require.GreaterOrEqual(t, st.Repairs, uint64(1))
	require.GreaterOrEqual(t, st.Usage.Reaps, st.Reaps, "table-wide reaps include ours")
	require.GreaterOrEqual(t, st.Usage.Repairs, st.Repairs)
}

// A steal is logged on both sides: the stealer's Manager logs the steal,
// the victim's logs the loss, whether the victim learns of it from the
// bell loop (it watched Lost) or from its own Release.
func TestLogSteal(t *testing.T) {
	for _, watched := range []bool{true, false} {
		name := map[bool]string{true: "watched", false: "released"}[watched]
		t.Run(name, func(t *testing.T) {
			hv, hs := &captureHandler{}, &captureHandler{}
			path := tablePath(t)
			victim := openM(t, path, loggedOpts(smallTable, hv))
			stealer := openM(t, path, loggedOpts(smallTable, hs))
			ctx := ctxT(t, eventually)
			lv, err := victim.Acquire(ctx, "x", RequestOptions{})
			require.NoError(t, err)
			var lost <-chan struct{}
			if watched {
				lost = lv.Lost()
			}
			ls, err := stealer.Acquire(ctx, "x", RequestOptions{Steal: true})
			require.NoError(t, err)
			if watched {
				select {
				case <-lost:
				case <-ctx.Done():
					t.Fatal("the victim never saw its lock stolen")
				}
			}
			require.ErrorIs(t, lv.Release(), ErrStolen)

			rs := hs.waitRecord(t, msgSteal)
			require.Equal(t, "x", rs["lock"])
			require.Equal(t, ls.Token(), rs["token"])
			rv := hv.waitRecord(t, msgLost)
			require.Equal(t, "x", rv["lock"])
			require.Equal(t, lv.Token(), rv["token"])
			require.Empty(t, hv.find(msgSteal), "the victim did not steal")
			require.Empty(t, hs.find(msgLost), "the stealer lost nothing")
			require.Len(t, hv.find(msgLost), 1, "one loss, logged once")

			sv, err := victim.Stats()
			require.NoError(t, err)
			ss, err := stealer.Stats()
			require.NoError(t, err)
			require.Equal(t, uint64(1), sv.LocksLost)
			require.Equal(t, uint64(1), ss.Steals)
			require.Equal(t, uint64(0), sv.Steals)
			require.NoError(t, ls.Release())
			check(t, stealer)
		})
	}
}

// A table truncated under a Manager is logged as corrupt (once per second
// at most, then with the count of records left out) and counted.
func TestLogCorrupt(t *testing.T) {
	skipFaultsUnderRace(t)
	h := &captureHandler{}
	path := tablePath(t)
	m := openM(t, path, loggedOpts(&OpenOptions{}, h))
	require.NoError(t, os.Truncate(path, 100))
	for range 3 {
		_, err := m.Query(context.Background())
		require.ErrorIs(t, err, ErrCorrupt)
	}
	r := h.waitRecord(t, msgCorrupt)
	require.Equal(t, slog.LevelError, r["level"])
	require.Contains(t, r["err"], "corrupt")
	require.Len(t, h.find(msgCorrupt), 1, "rate-limited to one record per second")
	st, _ := m.Stats()
	require.GreaterOrEqual(t, st.Corrupt, uint64(3))

	// Open of a corrupt file logs too (there is no Manager yet to count it).
	h2 := &captureHandler{}
	_, err := Open(path, &OpenOptions{Logger: slog.New(h2)})
	require.ErrorIs(t, err, ErrCorrupt)
	require.Equal(t, "open", h2.waitRecord(t, msgCorrupt)["op"])
}

// Without a Logger nothing is logged and nothing breaks (the default
// discards); without Stats the request counters stay zero.
func TestEventsDefaults(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	m2 := openM(t, path, nil)
	ctx := ctxT(t, eventually)
	l, err := m.Acquire(ctx, "x", RequestOptions{})
	require.NoError(t, err)
	ls, err := m2.Acquire(ctx, "x", RequestOptions{Steal: true})
	require.NoError(t, err)
	require.ErrorIs(t, l.Release(), ErrStolen)
	require.NoError(t, ls.Release())
	st, err := m.Stats()
	require.NoError(t, err)
	require.False(t, st.Enabled)
	require.Zero(t, st.LocksLost)
	require.Equal(t, Stats{Usage: st.Usage, Geometry: st.Geometry}, st)
	require.Equal(t, smallTable.MaxResources, st.Geometry.MaxResources)
	require.Equal(t, 2, st.Usage.Agents)
}
