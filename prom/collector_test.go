package prom

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/manager"
)

var small = manager.OpenOptions{MaxResources: 64, MaxRequests: 256, MaxAgents: 16, MaxNameLen: 64}

func open(t *testing.T, path string, stats bool) *manager.Manager {
	t.Helper()
	o := small
	o.Stats = stats
	m, err := manager.Open(path, &o)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// gather registers c on a fresh registry and returns the families by name.
func gather(t *testing.T, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// value returns the value of the sample of family name whose labels
// include want (name=value pairs), failing if there is not exactly one.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	t.Helper()
	mf := fams[name]
	require.NotNil(t, mf, "family %s", name)
	var found []*dto.Metric
	for _, m := range mf.Metric {
		labels := map[string]string{}
		for _, lp := range m.Label {
			labels[lp.GetName()] = lp.GetValue()
		}
		ok := true
		for i := 0; i+1 < len(want); i += 2 {
			ok = ok && labels[want[i]] == want[i+1]
		}
		if ok {
			found = append(found, m)
		}
	}
	require.Len(t, found, 1, "%s%v", name, want)
	m := found[0]
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	t.Fatalf("%s: no value", name)
	return 0
}

func TestCollector(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.tbl")
	m := open(t, path, true)
	other := open(t, path, false)
	ctx := ctxT(t)
	for range 3 {
		l, err := m.Acquire(ctx, "a", manager.RequestOptions{})
		require.NoError(t, err)
		require.NoError(t, l.Release())
	}
	lo, err := other.Acquire(ctx, "b", manager.RequestOptions{})
	require.NoError(t, err)
	_, err = m.Acquire(ctx, "b", manager.RequestOptions{Mode: manager.Shared, IfAvailable: true})
	require.ErrorIs(t, err, manager.ErrNotAvailable)
	ls, err := m.Acquire(ctx, "b", manager.RequestOptions{Steal: true})
	require.NoError(t, err)
	require.ErrorIs(t, lo.Release(), manager.ErrStolen)
	require.NoError(t, ls.Release())

	c, err := NewCollector(m, &Options{Names: []string{"b", "b", "never-used"}, ConstLabels: prometheus.Labels{"table": "t1"}})
	require.NoError(t, err)
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems)

	f := gather(t, c)
	require.Equal(t, 4.0, value(t, f, "shmlocks_requests_total", "mode", "exclusive", "outcome", "granted"), "three plus the steal")
	require.Equal(t, 1.0, value(t, f, "shmlocks_requests_total", "mode", "shared", "outcome", "not_available"))
	require.Equal(t, 0.0, value(t, f, "shmlocks_requests_total", "mode", "shared", "outcome", "aborted"))
	require.Equal(t, 4.0, value(t, f, "shmlocks_request_wait_seconds", "mode", "exclusive"))
	h := f["shmlocks_request_wait_seconds"].Metric[0].Histogram
	require.Len(t, h.Bucket, len(manager.WaitHistogram{}.Counts)-1)
	require.Equal(t, 1e-6, h.Bucket[0].GetUpperBound())
	require.Greater(t, h.Bucket[len(h.Bucket)-1].GetUpperBound(), 60.0)
	require.Equal(t, 1.0, value(t, f, "shmlocks_steals_total"))
	require.Equal(t, 0.0, value(t, f, "shmlocks_locks_lost_total"), "the victim was the other Manager")
	require.Equal(t, 2.0, value(t, f, "shmlocks_table_agents"))
	require.Equal(t, 16.0, value(t, f, "shmlocks_table_agents_limit"))
	require.Equal(t, 64.0, value(t, f, "shmlocks_table_names_limit"))
	require.Equal(t, 0.0, value(t, f, "shmlocks_table_requests", "state", "held"))
	require.Equal(t, 0.0, value(t, f, "shmlocks_lock_holders", "name", "b", "mode", "exclusive"))
	require.Equal(t, 0.0, value(t, f, "shmlocks_lock_holders", "name", "never-used", "mode", "shared"))
	require.Equal(t, 0.0, value(t, f, "shmlocks_lock_longest_hold_seconds", "name", "never-used"), "nothing held: 0")
	for _, mf := range f {
		for _, mt := range mf.Metric {
			labels := map[string]string{}
			for _, lp := range mt.Label {
				labels[lp.GetName()] = lp.GetValue()
			}
			require.Equal(t, "t1", labels["table"], "const label on %s", mf.GetName())
		}
	}

	// The allow-listed name while held and waited for.
	lb, err := other.Acquire(ctx, "b", manager.RequestOptions{})
	require.NoError(t, err)
	go m.Acquire(ctx, "b", manager.RequestOptions{Mode: manager.Shared})
	require.Eventually(t, func() bool {
		return value(t, gather(t, c), "shmlocks_lock_waiting", "name", "b", "mode", "shared") == 1
	}, 10*time.Second, time.Millisecond)
	f = gather(t, c)
	require.Equal(t, 1.0, value(t, f, "shmlocks_lock_holders", "name", "b", "mode", "exclusive"))
	require.Greater(t, value(t, f, "shmlocks_lock_longest_hold_seconds", "name", "b"), 0.0, "held (granted at once): its hold time")
	require.Equal(t, 1.0, value(t, f, "shmlocks_table_requests", "state", "waiting"))
	require.NotContains(t, f, "a", "only allow-listed names have series")
	require.NoError(t, lb.Release())
}

// Without OpenOptions.Stats only the table metrics are described and
// collected; a closed Manager collects nothing; an allow-listed name must
// be valid UTF-8.
func TestCollectorWithoutStats(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.tbl")
	m := open(t, path, false)
	c, err := NewCollector(m, nil)
	require.NoError(t, err)
	f := gather(t, c)
	require.NotContains(t, f, "shmlocks_requests_total")
	require.Contains(t, f, "shmlocks_table_agents")
	for name := range f {
		require.True(t, strings.HasPrefix(name, "shmlocks_table_"), name)
	}
	_, err = NewCollector(m, &Options{Names: []string{"bad\xff"}})
	require.ErrorIs(t, err, manager.ErrNotSupported)
	require.NoError(t, m.Close())
	require.Zero(t, testutil.CollectAndCount(c))
	_, err = NewCollector(m, nil)
	require.ErrorIs(t, err, manager.ErrClosed)
}

// The library registers nothing by itself: the default registry has no
// shmlocks metric after a Manager and a Collector were made and used.
func TestNothingRegisteredByDefault(t *testing.T) {
	m := open(t, filepath.Join(t.TempDir(), "c.tbl"), true)
	_, err := NewCollector(m, nil)
	require.NoError(t, err)
	mfs, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		require.False(t, strings.HasPrefix(mf.GetName(), "shmlocks_"), mf.GetName())
	}
}

// The core module does not depend on the Prometheus client library.
func TestCoreModuleHasNoPrometheus(t *testing.T) {
	for _, f := range []string{"../go.mod", "../go.sum"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NotContains(t, string(b), "prometheus", f)
	}
}
