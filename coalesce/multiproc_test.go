package coalesce

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/proctest"
	"github.com/shmlocks/shmlocks/internal/seam"
	"github.com/shmlocks/shmlocks/manager"
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

// joinFollowers starts n callers of Coalesce on name in each child and waits
// until they all wait in their process's flight, and until each child's
// pilot is queued for the flight lock (held by the leader).
func joinFollowers(t *testing.T, m *manager.Manager, name, counter, mode string, n int, cs ...*proctest.Child) {
	t.Helper()
	for i, c := range cs {
		for j := 0; j < n; j++ {
			c.Send("coalesce %s f%d.%d %s %s", name, i, j, counter, mode)
		}
		c.Send("members %s %d", name, n)
		c.Expect("members " + name)
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
	m := openM(t, path)
	counter := filepath.Join(t.TempDir(), "runs")
	a, b, c := spawn(t, path), spawn(t, path), spawn(t, path)
	c.Send("coalesce x lead %s block", counter)
	c.Expect("running lead")
	joinFollowers(t, m, "x", counter, "quick", 3, a, b)
	checkAll(t, m)
	c.Send("go lead")
	lead := parseCoalesced(c.Expect("coalesced lead"))
	require.False(t, lead.shared)
	require.Equal(t, "none", lead.errkind)
	for _, ch := range []*proctest.Child{a, b} {
		for j := 0; j < 3; j++ {
			got := parseCoalesced(ch.Expect("coalesced"))
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
	a.Send("coalesce x late %s quick", counter)
	late := parseCoalesced(a.Expect("coalesced late"))
	require.False(t, late.shared)
	require.NotEqual(t, lead.result, late.result)
	require.Len(t, counterLines(t, counter, "start"), 2)
}

// The leader is SIGKILLed in the middle of fn: one waiting caller leads,
// every caller gets its bytes, and fn ran exactly once more.
func TestCoalesceLeaderKilled(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path)
	counter := filepath.Join(t.TempDir(), "runs")
	a, b, c := spawn(t, path), spawn(t, path), spawn(t, path)
	c.Send("coalesce x lead %s hang", counter)
	c.Expect("running lead")
	joinFollowers(t, m, "x", counter, "quick", 3, a, b)
	c.Kill()
	var results []coalesced
	for _, ch := range []*proctest.Child{a, b} {
		for j := 0; j < 3; j++ {
			got := parseCoalesced(ch.Expect("coalesced"))
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
			m := openM(t, path)
			counter := filepath.Join(t.TempDir(), "runs")
			a, c := spawn(t, path), spawn(t, path)
			c.Send("coalesce x lead %s %s", counter, tc.mode)
			c.Expect("running lead")
			joinFollowers(t, m, "x", counter, "quick", 2, a)
			c.Send("go lead")
			got := parseCoalesced(c.Expect("coalesced lead"))
			require.Equal(t, tc.lead, got.errkind)
			require.False(t, got.shared)
			for j := 0; j < 2; j++ {
				got := parseCoalesced(a.Expect("coalesced"))
				require.Equal(t, tc.follower, got.errkind, "follower %s", got.tag)
				require.True(t, got.shared)
				require.Empty(t, got.result)
			}
			require.Len(t, counterLines(t, counter, "start"), 1)
			checkAll(t, m)
			a.Send("coalesce x again %s quick", counter)
			again := parseCoalesced(a.Expect("coalesced again"))
			require.Equal(t, "none", again.errkind)
			require.False(t, again.shared)
			require.Len(t, counterLines(t, counter, "start"), 2)
		})
	}
}

// A caller that arrives after a flight published its outcome never gets
// that outcome, even when it joins its process's flight that is still
// waiting for the lock: C publishes and is held at coalesce.renamed (lock
// still held); A's first caller, there before the publish, gets C's bytes;
// A's second caller, there after it, leads a new run.
//
//	C: pause coalesce.renamed; coalesce x (fn blocks)  -> running
//	A: coalesce x (early)                               -> waits, A's pilot queued
//	C: go                                               -> C published, paused
//	A: coalesce x (late)                                -> joins A's flight
//	C: resume                                           -> C released
//	A: early: C's bytes, shared; late: a new run, not shared
func TestCoalesceNeverOlderThanArrival(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path)
	counter := filepath.Join(t.TempDir(), "runs")
	a, c := spawn(t, path), spawn(t, path)
	c.Send("pause coalesce.renamed")
	c.Expect("armed")
	c.Send("coalesce x lead %s block", counter)
	c.Expect("running lead")
	a.Send("coalesce x early %s quick", counter)
	a.Send("members x 1")
	a.Expect("members x")
	waitPending(t, m, "-c:x", 1)
	c.Send("go lead")
	c.Expect("paused coalesce.renamed")
	a.Send("coalesce x late %s quick", counter)
	a.Send("members x 2")
	a.Expect("members x")
	c.Send("resume")
	lead := parseCoalesced(c.Expect("coalesced lead"))
	early := parseCoalesced(a.Expect("coalesced early"))
	late := parseCoalesced(a.Expect("coalesced late"))
	require.Equal(t, lead.result, early.result)
	require.True(t, early.shared)
	require.False(t, late.shared, "the late caller leads")
	require.NotEqual(t, lead.result, late.result)
	require.Equal(t, []string{"run " + lead.result, "run " + late.result}, counterLines(t, counter, "run"))
	checkAll(t, m)

	// CoalesceWithin accepts a recent result without a run.
	res, shared, err := New(m).DoWithin(ctxT(t, eventually), "x", eventually, func(context.Context) ([]byte, error) {
		t.Fatal("fn ran although a recent result was published")
		return nil, nil
	})
	require.NoError(t, err)
	require.True(t, shared)
	require.Equal(t, late.result, string(res))
}

// The crash points of a leader: killed at each, no follower is left waiting
// and none gets a partial result; fn runs again only if nothing was published.
func TestCoalesceCrashPoints(t *testing.T) {
	published := map[string]bool{"coalesce.ran": false, "coalesce.written": false, "coalesce.renamed": true}
	for _, point := range crashPoints {
		t.Run(point, func(t *testing.T) {
			pub, ok := published[point]
			if !ok {
				t.Fatalf("coalesce crash point %q has no multi-process test", point)
			}
			path := tablePath(t)
			m := openM(t, path)
			counter := filepath.Join(t.TempDir(), "runs")
			a, c := spawn(t, path), spawn(t, path)
			c.Send("crash %s", point)
			c.Expect("armed")
			c.Send("coalesce x lead %s block", counter)
			c.Expect("running lead")
			joinFollowers(t, m, "x", counter, "quick", 2, a)
			c.Send("go lead")
			c.Closed() // it died at its crash point
			c.Wait()
			var got []coalesced
			for j := 0; j < 2; j++ {
				r := parseCoalesced(a.Expect("coalesced"))
				require.Equal(t, "none", r.errkind)
				got = append(got, r)
			}
			runs := counterLines(t, counter, "run")
			require.Len(t, runs, map[bool]int{true: 1, false: 2}[pub])
			require.Equal(t, got[0].result, got[1].result)
			require.Equal(t, "run "+got[0].result, runs[len(runs)-1], "the bytes of the last run, whole")
			if pub {
				require.True(t, got[0].shared && got[1].shared, "the dead leader's published result")
			} else {
				require.NotEqual(t, got[0].shared, got[1].shared, "one follower led")
			}
			temps, _ := filepath.Glob(filepath.Join(path+".coalesce", "*"+seam.TempInfix+"*"))
			require.Empty(t, temps, "the next leader removed the dead leader's temporary file")
			checkAll(t, m)
		})
	}
	for point := range published {
		require.Contains(t, crashPoints, point)
	}
}

// N processes x M goroutines call Coalesce on one name, again and again,
// while the first leader hangs in fn and is SIGKILLed: every caller of the
// survivors returns, with bytes that a real run of fn produced; fn ran
// fewer times than it was called.
func TestCoalesceProcessesStress(t *testing.T) {
	procs, goroutines, rounds := 3, 4, 20
	if testing.Short() {
		rounds = 5
	}
	path := tablePath(t)
	m := openM(t, path)
	counter := filepath.Join(t.TempDir(), "runs")
	v := spawn(t, path)
	v.Send("coalesce x victim %s hang", counter)
	v.Expect("running victim")
	var cs []*proctest.Child
	for i := 0; i < procs; i++ {
		c := spawn(t, path)
		c.Send("loop x %d %d %s", goroutines, rounds, counter)
		cs = append(cs, c)
	}
	waitPending(t, m, "-c:x", procs)
	v.Kill()
	calls := 0
	for _, c := range cs {
		line := c.Expect("loopdone")
		var n, led, failed int
		var results string
		for _, f := range strings.Fields(line)[1:] {
			k, val, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				n = atoi(val)
			case "led":
				led = atoi(val)
			case "failed":
				failed = atoi(val)
			case "results":
				results = val
			}
		}
		require.Zero(t, failed, "child %d: %s", c.Pid, line)
		require.Equal(t, goroutines*rounds, n)
		runs := counterLines(t, counter, "run")
		for _, r := range strings.Split(results, ",") {
			require.Contains(t, runs, "run "+r, "a result no run produced")
		}
		require.LessOrEqual(t, led, n)
		calls += n
	}
	runs := counterLines(t, counter, "run")
	require.Less(t, len(runs), calls, "coalesced: fewer runs than calls")
	t.Logf("%d calls in %d processes x %d goroutines, %d runs of fn", calls, procs, goroutines, len(runs))
	checkAll(t, m)
}
