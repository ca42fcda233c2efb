package tablemetrics

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/table"
)

// LiveTable is a table with held locks of both modes and queued requests,
// one name per awkward label value; it returns the path and a read-only view.
func LiveTable(t *testing.T) (string, *table.Table) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.tbl")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	open := func() *manager.Manager {
		m, err := manager.Open(path, &manager.OpenOptions{MaxResources: 64, MaxRequests: 256, MaxAgents: 16, MaxNameLen: 64})
		require.NoError(t, err)
		t.Cleanup(func() { m.Close() })
		return m
	}
	a, b := open(), open()
	acq := func(m *manager.Manager, name string, o manager.RequestOptions) {
		_, err := m.Acquire(ctx, name, o)
		require.NoError(t, err)
	}
	acq(a, "x", manager.RequestOptions{})
	acq(a, "y", manager.RequestOptions{Mode: manager.Shared})
	acq(b, "y", manager.RequestOptions{Mode: manager.Shared})
	acq(a, "q\"uote\\back\nline", manager.RequestOptions{})
	acq(a, "bad\xffutf8", manager.RequestOptions{})
	for _, o := range []manager.RequestOptions{{}, {Mode: manager.Shared}} {
		go b.Acquire(ctx, "x", o) // queued behind a's hold until cleanup
	}
	ro, err := table.OpenReadOnly(path)
	require.NoError(t, err)
	t.Cleanup(func() { ro.Close() })
	require.Eventually(t, func() bool { // a slot is marked waiting before it is queued
		st, err := Gather(ro, time.Now())
		return err == nil && len(st.Names) > 0 && st.Names[0].Waiting == 2
	}, 10*time.Second, time.Millisecond)
	return path, ro
}

func TestGather(t *testing.T) {
	_, ro := LiveTable(t)
	now := time.Now().Add(time.Second)
	st, err := Gather(ro, now)
	require.NoError(t, err)
	require.Equal(t, 2, st.Agents)
	require.Zero(t, st.Dead)
	require.Equal(t, 64, st.Geometry.MaxResources)
	require.Len(t, st.Names, 4)
	x := st.Names[0]
	require.Equal(t, "x", x.Name, "the name with waiters sorts first")
	require.Equal(t, 2, x.Waiting)
	require.Equal(t, 1, x.WaitingExclusive)
	require.Equal(t, 1, x.WaitingShared)
	require.GreaterOrEqual(t, x.LongestWait, time.Second, "queued before now-1s")
	require.Len(t, x.Holders, 1)
	require.Equal(t, uint32(table.ModeExclusive), x.Holders[0].Mode)
	require.NotZero(t, x.Holders[0].Token)
	require.NotEmpty(t, x.Holders[0].ClientID)
	require.Equal(t, st.LongestWait(), x.LongestWait)
	for _, n := range st.Names[1:] {
		require.Zero(t, n.Waiting, n.Name)
		if n.Name == "y" {
			require.Len(t, n.Holders, 2)
			require.Less(t, n.Holders[0].Token, n.Holders[1].Token, "holders by token")
		}
	}
}

func TestWrite(t *testing.T) {
	_, ro := LiveTable(t)
	st, err := Gather(ro, time.Now())
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, &st, time.Millisecond, Options{Names: true}))
	out := buf.String()
	for _, line := range []string{
		"shmlocks_table_up 1",
		"shmlocks_table_names 4",
		"shmlocks_table_names_limit 64",
		`shmlocks_table_requests{state="held"} 5`,
		`shmlocks_table_requests{state="waiting"} 2`,
		"shmlocks_table_agents 2",
		"shmlocks_table_agents_limit 16",
		"shmlocks_table_agents_dead 0",
		"# TYPE shmlocks_table_reaps_total counter",
		`shmlocks_lock_holders{name="x",mode="exclusive"} 1`,
		`shmlocks_lock_holders{name="y",mode="shared"} 2`,
		`shmlocks_lock_waiting{name="x",mode="exclusive"} 1`,
		`shmlocks_lock_waiting{name="x",mode="shared"} 1`,
		`shmlocks_lock_holders{name="q\"uote\\back\nline",mode="exclusive"} 1`,
		`shmlocks_lock_holders{name="bad�utf8",name_base64="YmFk/3V0Zjg=",mode="exclusive"} 1`,
	} {
		require.Contains(t, out, line+"\n")
	}
	require.Regexp(t, `\nshmlocks_lock_longest_wait_seconds\{name="x"\} [0-9.e-]+\n`, out)
	require.NotContains(t, out, `shmlocks_lock_longest_wait_seconds{name="y"}`, "no waiters, no series")

	buf.Reset()
	require.NoError(t, Write(&buf, &st, 0, Options{}))
	require.NotContains(t, buf.String(), "name=", "per-name series are opt-in")

	buf.Reset()
	require.NoError(t, Write(&buf, nil, 0, Options{Names: true}))
	require.Equal(t, "# HELP shmlocks_table_up 1 if the lock table could be read at this scrape, else 0.\n# TYPE shmlocks_table_up gauge\nshmlocks_table_up 0\n", buf.String())
}

func TestNameLabels(t *testing.T) {
	for in, want := range map[string]string{
		"plain":       `name="plain"`,
		"a\"b":        `name="a\"b"`,
		`a\b`:         `name="a\\b"`,
		"a\nb":        `name="a\nb"`,
		`\xff`:        `name="\\xff"`,
		"\xff":        `name="�",name_base64="/w=="`,
		"\xfe":        `name="�",name_base64="/g=="`,
		"�":           `name="�"`,
		"héllo\x00":   "name=\"héllo\x00\"",
		"orders/2026": `name="orders/2026"`,
	} {
		require.Equal(t, want, nameLabels(in), "%q", in)
	}
}

func TestHandler(t *testing.T) {
	_, ro := LiveTable(t)
	var errs []error
	srv := httptest.NewServer(Handler(func() (*table.Table, error) { return ro, nil }, Options{Names: true}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, ContentType, resp.Header.Get("Content-Type"))
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	require.Contains(t, buf.String(), "shmlocks_table_up 1\n")

	down := httptest.NewServer(Handler(func() (*table.Table, error) { return nil, table.ErrCorrupt },
		Options{OnError: func(err error) { errs = append(errs, err) }}))
	defer down.Close()
	resp2, err := http.Get(down.URL)
	require.NoError(t, err)
	defer resp2.Body.Close()
	buf.Reset()
	buf.ReadFrom(resp2.Body)
	require.True(t, strings.HasSuffix(buf.String(), "shmlocks_table_up 0\n"))
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], table.ErrCorrupt)
}
