package prom

import (
	"bytes"
	"encoding/base64"
	"path/filepath"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/tablemetrics"
	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/table"
)

// The hand-written exposition of package tablemetrics (what `shmlocks serve
// --metrics` serves) is parsed by Prometheus's own text parser, with the
// strict legacy name validation: every family has its declared type, and
// label values with quotes, backslashes, newlines and invalid UTF-8 come
// back as the escaping promises.
func TestTableMetricsParse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.tbl")
	a, b := open(t, path, false), open(t, path, false)
	ctx := ctxT(t)
	names := []string{"x", "q\"uote\\back\nline", "bad\xffutf8", "bad\xfeutf8", "日本"}
	for _, n := range names {
		_, err := a.Acquire(ctx, n, manager.RequestOptions{})
		require.NoError(t, err)
	}
	_, err := a.Acquire(ctx, "y", manager.RequestOptions{Mode: manager.Shared})
	require.NoError(t, err)
	_, err = b.Acquire(ctx, "y", manager.RequestOptions{Mode: manager.Shared})
	require.NoError(t, err)
	go b.Acquire(ctx, "x", manager.RequestOptions{Mode: manager.Shared})
	ro, err := table.OpenReadOnly(path)
	require.NoError(t, err)
	defer ro.Close()
	var st tablemetrics.State
	require.Eventually(t, func() bool { // the slot is marked waiting before it is queued
		st, err = tablemetrics.Gather(ro, time.Now())
		return err == nil && len(st.Names) > 0 && st.Names[0].Waiting == 1
	}, 10*time.Second, time.Millisecond)
	var buf bytes.Buffer
	require.NoError(t, tablemetrics.Write(&buf, &st, time.Millisecond, tablemetrics.Options{Names: true}))
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err, "exposition:\n%s", buf.String())

	types := map[string]dto.MetricType{
		"shmlocks_table_up":                  dto.MetricType_GAUGE,
		"shmlocks_table_names":               dto.MetricType_GAUGE,
		"shmlocks_table_requests":            dto.MetricType_GAUGE,
		"shmlocks_table_agents":              dto.MetricType_GAUGE,
		"shmlocks_table_reaps_total":         dto.MetricType_COUNTER,
		"shmlocks_table_repairs_total":       dto.MetricType_COUNTER,
		"shmlocks_lock_holders":              dto.MetricType_GAUGE,
		"shmlocks_lock_waiting":              dto.MetricType_GAUGE,
		"shmlocks_lock_longest_wait_seconds": dto.MetricType_GAUGE,
	}
	for name, typ := range types {
		require.Contains(t, fams, name)
		require.Equal(t, typ, fams[name].GetType(), name)
	}
	require.Equal(t, 1.0, value(t, fams, "shmlocks_table_up"))
	require.Equal(t, 7.0, value(t, fams, "shmlocks_table_requests", "state", "held"))
	require.Equal(t, 1.0, value(t, fams, "shmlocks_table_requests", "state", "waiting"))
	require.Equal(t, 2.0, value(t, fams, "shmlocks_lock_holders", "name", "y", "mode", "shared"))
	require.Equal(t, 1.0, value(t, fams, "shmlocks_lock_waiting", "name", "x", "mode", "shared"))
	require.Equal(t, 1.0, value(t, fams, "shmlocks_lock_holders", "name", "q\"uote\\back\nline", "mode", "exclusive"))
	require.Equal(t, 1.0, value(t, fams, "shmlocks_lock_holders", "name", "bad\uFFFDutf8", "name_base64", "YmFk/3V0Zjg=", "mode", "exclusive"))
	require.Equal(t, 1.0, value(t, fams, "shmlocks_lock_holders", "name", "bad\uFFFDutf8", "name_base64", "YmFk/nV0Zjg=", "mode", "exclusive"))
	require.Equal(t, 1.0, value(t, fams, "shmlocks_lock_holders", "name", "日本", "mode", "exclusive"))
	require.Len(t, fams["shmlocks_lock_longest_wait_seconds"].Metric, 1, "only x has waiters")

	// Down: only shmlocks_table_up 0.
	buf.Reset()
	require.NoError(t, tablemetrics.Write(&buf, nil, 0, tablemetrics.Options{Names: true}))
	fams, err = p.TextToMetricFamilies(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	require.Len(t, fams, 1)
	require.Equal(t, 0.0, value(t, fams, "shmlocks_table_up"))
}

// shmlocks_lock_longest_hold_seconds is known for every holder, those
// granted at once included (the fast path on a name used before, and a
// new name under the latch): read 5 s after the grants it says about 5 s,
// and a name nobody holds has no series (0 only when nothing is held).
func TestTableMetricsLongestHoldUncontended(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.tbl")
	m := open(t, path, false)
	ctx := ctxT(t)
	for _, n := range []string{"fast", "gone"} { // used once: their entries stay idle
		l, err := m.Acquire(ctx, n, manager.RequestOptions{})
		require.NoError(t, err)
		require.NoError(t, l.Release())
	}
	before := time.Now()
	_, err := m.Acquire(ctx, "fast", manager.RequestOptions{})
	require.NoError(t, err)
	_, err = m.Acquire(ctx, "new", manager.RequestOptions{})
	require.NoError(t, err)
	after := time.Now()
	ro, err := table.OpenReadOnly(path)
	require.NoError(t, err)
	defer ro.Close()
	at := after.Add(5 * time.Second)
	st, err := tablemetrics.Gather(ro, at)
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, tablemetrics.Write(&buf, &st, time.Millisecond, tablemetrics.Options{Names: true}))
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err, "exposition:\n%s", buf.String())
	require.Equal(t, dto.MetricType_GAUGE, fams["shmlocks_lock_longest_hold_seconds"].GetType())
	require.Len(t, fams["shmlocks_lock_longest_hold_seconds"].Metric, 2, "fast and new; gone is not held")
	for _, n := range []string{"fast", "new"} {
		v := value(t, fams, "shmlocks_lock_longest_hold_seconds", "name", n)
		// Granted between before and after, stamped from a clock at most
		// about 0.1 s behind (a second of slack).
		require.GreaterOrEqual(t, v, at.Sub(after).Seconds(), n)
		require.LessOrEqual(t, v, at.Sub(before).Seconds()+1, n)
	}
}

// Metrics are lint-clean and lossless on a table with odd names: the
// names that differ (an invalid byte, the four characters \xff, U+FFFD,
// quotes, a newline, a backslash) stay different series, in the
// exposition of shmlocks serve (Prometheus's own parser, then its linter)
// and in the Collector (client_golang's testutil.CollectAndLint).
func TestMetricsLintCleanAndLossless(t *testing.T) {
	path := filepath.Join(t.TempDir(), "odd.tbl")
	m := open(t, path, true)
	ctx := ctxT(t)
	odd := []string{"a\xff", `a\xff`, "a\uFFFD", "a\xfe", "q\"uote", "new\nline", `back\slash`, "日本", "a"}
	for _, n := range odd {
		_, err := m.Acquire(ctx, n, manager.RequestOptions{})
		require.NoError(t, err, "%q", n)
	}
	ro, err := table.OpenReadOnly(path)
	require.NoError(t, err)
	defer ro.Close()
	st, err := tablemetrics.Gather(ro, time.Now())
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, tablemetrics.Write(&buf, &st, time.Millisecond, tablemetrics.Options{Names: true}))
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err, "exposition:\n%s", buf.String())
	var list []*dto.MetricFamily
	for _, f := range fams {
		list = append(list, f)
	}
	problems, err := promlint.NewWithMetricFamilies(list).Lint()
	require.NoError(t, err)
	require.Empty(t, problems, "exposition:\n%s", buf.String())
	holders := fams["shmlocks_lock_holders"]
	require.Len(t, holders.Metric, len(odd), "one series per name:\n%s", buf.String())
	seen := map[string]bool{}
	for _, mt := range holders.Metric {
		var name, b64 string
		for _, lp := range mt.Label {
			switch lp.GetName() {
			case "name":
				name = lp.GetValue()
			case "name_base64":
				b64 = lp.GetValue()
			}
		}
		exact := name
		if b64 != "" {
			raw, err := base64.StdEncoding.DecodeString(b64)
			require.NoError(t, err)
			exact = string(raw)
		}
		require.False(t, seen[exact], "%q twice", exact)
		seen[exact] = true
	}
	for _, n := range odd {
		require.True(t, seen[n], "%q has its series, exactly", n)
	}

	// The Collector: its allow-list is valid UTF-8 (a label value must
	// be); every odd valid name is its own series, lint-clean.
	var valid []string
	for _, n := range odd {
		if utf8.ValidString(n) {
			valid = append(valid, n)
		}
	}
	c, err := NewCollector(m, &Options{Names: valid})
	require.NoError(t, err)
	problems, err = testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems)
	f := gather(t, c)
	for _, n := range valid {
		require.Equal(t, 1.0, value(t, f, "shmlocks_lock_holders", "name", n, "mode", "exclusive"), "%q", n)
	}
	_, err = NewCollector(m, &Options{Names: []string{"a\xff"}})
	require.ErrorIs(t, err, manager.ErrNotSupported)
}
