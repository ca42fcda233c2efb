package manager

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Coalesce across processes. Every fn run appends to a counter file that
// the lock code never touches (O_APPEND), so runs are counted outside it.

type coalesced struct {
	tag, result, errkind string
	shared               bool
}

func parseCoalesced(line string) coalesced {
	var c coalesced
	for _, f := range strings.Fields(line)[1:] {
		switch k, v, _ := strings.Cut(f, "="); k {
		case "shared":
			c.shared = v == "true"
		case "result":
			c.result = v
		case "errkind":
			c.errkind = v
		default:
			if c.tag == "" {
				c.tag = f
			}
		}
	}
	return c
}

// counterLines returns the lines of the counter file starting with prefix.
func counterLines(t *testing.T, path, prefix string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// checkAll runs the table checker and the outcome store's checker.
func checkAll(t *testing.T, m *Manager) {
	t.Helper()
	require.NoError(t, m.Check())
	require.NoError(t, m.CheckCoalesce())
}

// joinFollowers starts n callers of Coalesce on name in each child and waits
// until they all wait in their process's flight, and until each child's
// pilot is queued for the flight lock (held by the leader).
func joinFollowers(t *testing.T, m *Manager, name, counter, mode string, n int, cs ...*child) {
	t.Helper()
	for i, c := range cs {
		for j := 0; j < n; j++ {
			c.send("coalesce %s f%d.%d %s %s", name, i, j, counter, mode)
		}
		c.send("members %s %d", name, n)
		c.expect("members " + name)
	}
	waitPending(t, m, "-c:"+name, len(cs))
}

// C leads with a blocked fn; 3 callers in each of A and B join; C's fn
// returns: every caller in every process gets C's bytes, fn ran once.
//
//	C: coalesce x (fn blocks)        -> running
//	A, B: 3 x coalesce x             -> wait (one pilot each queued on "-c:x")
//	C: go                            -> C: shared=false R; A, B: shared=true R (6 times)
func TestCoalesceProcessesRunOnce(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	counter := filepath.Join(t.TempDir(), "runs")
	a, b, c := spawn(t, path, nil), spawn(t, path, nil), spawn(t, path, nil)
	c.send("coalesce x lead %s block", counter)
	c.expect("running lead")
	joinFollowers(t, m, "x", counter, "quick", 3, a, b)
	checkAll(t, m)
	c.send("go lead")
	lead := parseCoalesced(c.expect("coalesced lead"))
	require.False(t, lead.shared)
	require.Equal(t, "none", lead.errkind)
	for _, ch := range []*child{a, b} {
		for j := 0; j < 3; j++ {
			got := parseCoalesced(ch.expect("coalesced"))
			require.Equal(t, "none", got.errkind)
			require.True(t, got.shared, "follower %s", got.tag)
			require.Equal(t, lead.result, got.result, "follower %s", got.tag)
		}
	}
	require.Len(t, counterLines(t, counter, "start"), 1, "fn ran once")
	require.Equal(t, []string{"run " + lead.result}, counterLines(t, counter, "run"))
	checkAll(t, m)

	// The flight is over: a caller arriving now runs fn again, and never
	// gets the old bytes.
	a.send("coalesce x late %s quick", counter)
	late := parseCoalesced(a.expect("coalesced late"))
	require.False(t, late.shared)
	require.NotEqual(t, lead.result, late.result)
	require.Len(t, counterLines(t, counter, "start"), 2)
}

// The leader is SIGKILLed in the middle of fn: one waiting caller leads,
// every caller gets its bytes, and fn ran exactly once more.
func TestCoalesceLeaderKilled(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	counter := filepath.Join(t.TempDir(), "runs")
	a, b, c := spawn(t, path, nil), spawn(t, path, nil), spawn(t, path, nil)
	c.send("coalesce x lead %s hang", counter)
	c.expect("running lead")
	joinFollowers(t, m, "x", counter, "quick", 3, a, b)
	c.kill()
	var results []coalesced
	for _, ch := range []*child{a, b} {
		for j := 0; j < 3; j++ {
			got := parseCoalesced(ch.expect("coalesced"))
			require.Equal(t, "none", got.errkind, "caller %s", got.tag)
			results = append(results, got)
		}
	}
	runs := counterLines(t, counter, "run")
	require.Len(t, runs, 1, "fn ran once after the leader died")
	require.Len(t, counterLines(t, counter, "start"), 2, "the dead leader's run and one more")
	leaders := 0
	for _, r := range results {
		require.Equal(t, "run "+r.result, runs[0], "caller %s got the new leader's bytes", r.tag)
		if !r.shared {
			leaders++
		}
	}
	require.Equal(t, 1, leaders)
	checkAll(t, m)
}

// A leader's error reaches followers in other processes as ErrLeaderFailed,
// an oversize result as ErrResultTooLarge (never a truncation); neither is
// reused by a later caller.
func TestCoalesceProcessesErrors(t *testing.T) {
	for _, tc := range []struct{ mode, lead, follower string }{
		{"block+fail", "other:boom_lead", "leaderfailed"},
		{"block+big", "toolarge", "toolarge"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			path := tablePath(t)
			m := openM(t, path, nil)
			counter := filepath.Join(t.TempDir(), "runs")
			a, c := spawn(t, path, nil), spawn(t, path, nil)
			c.send("coalesce x lead %s %s", counter, tc.mode)
			c.expect("running lead")
			joinFollowers(t, m, "x", counter, "quick", 2, a)
			c.send("go lead")
			got := parseCoalesced(c.expect("coalesced lead"))
			require.Equal(t, tc.lead, got.errkind)
			require.False(t, got.shared)
			for j := 0; j < 2; j++ {
				got := parseCoalesced(a.expect("coalesced"))
				require.Equal(t, tc.follower, got.errkind, "follower %s", got.tag)
				require.True(t, got.shared)
				require.Empty(t, got.result)
			}
			require.Len(t, counterLines(t, counter, "start"), 1)
			checkAll(t, m)
			a.send("coalesce x again %s quick", counter)
			again := parseCoalesced(a.expect("coalesced again"))
			require.Equal(t, "none", again.errkind)
			require.False(t, again.shared)
			require.Len(t, counterLines(t, counter, "start"), 2)
		})
	}
}
