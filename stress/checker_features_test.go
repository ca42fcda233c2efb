//go:build unix

package stress

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// kinds returns the violations counted per kind name (only the non-zero ones).
func kinds(r *Region) map[string]int {
	out := map[string]int{}
	for k := 0; k < numKinds; k++ {
		if n := r.kindCount(k); n > 0 {
			out[kindNames[k]] = n
		}
	}
	return out
}

// TestCheckerChildGrants: children of one grant exclude each other as
// requests of the name would (exclusive children one at a time, shared ones
// together); a child is inside its parent and its own child inside it; a
// child that is still inside when someone else is granted the name (its
// parent gone) is a violation.
func TestCheckerChildGrants(t *testing.T) {
	r := testRegion(t, 1, 2, 1)
	clock := fakeClock()
	c0, c1 := testChecker(r, 0, clock), testChecker(r, 1, clock)
	outer := grant(c0, 0, 0, modeExclusive, false, 7)

	a := c0.GrantedChild(outer, 1, modeExclusive, 7)
	nested := c0.GrantedChild(a, 2, modeExclusive, 7) // a child of a: inside a and outer
	n, msgs := violations(r)
	require.Zero(t, n, msgs)
	nested.Release()
	a.Release()

	s1 := c0.GrantedChild(outer, 1, modeShared, 7)
	s2 := c0.GrantedChild(outer, 3, modeShared, 7)
	n, msgs = violations(r)
	require.Zero(t, n, "shared children together: %s", msgs)

	x := c0.GrantedChild(outer, 5, modeExclusive, 7) // an exclusive sibling of two shared ones
	n, msgs = violations(r)
	require.Equal(t, 2, n, msgs)
	require.Contains(t, msgs, "child: pid 1000: exclusion broken on stress-0: exclusive child grant token 7 (goroutine 0) overlapped shared holder token 7 (child grant")
	require.Equal(t, map[string]int{"child": 2}, kinds(r))
	x.Release()
	s1.Release()

	// The parent ends while s2 is still inside; another process is granted.
	release(outer)
	release(grant(c1, 0, 0, modeExclusive, false, 8))
	n, msgs = violations(r)
	require.Equal(t, 3, n, msgs)
	require.Contains(t, msgs, "exclusive grant token 8 (goroutine 0) overlapped shared holder token 7 (child grant (pid")
	require.Equal(t, map[string]int{"child": 3}, kinds(r))
	s2.Release()
}

// TestCheckerExecCommand: an exec command holds under its own pid: a grant
// that overlaps it while it runs is an exec violation, whatever happened to
// its wrapper; once it is dead its record is not a hold. A command that
// does not know its token is excused by a steal after its wrapper started.
func TestCheckerExecCommand(t *testing.T) {
	r := testRegion(t, 1, 2, 2)
	clock := fakeClock()
	c0, c1 := testChecker(r, 0, clock), testChecker(r, 1, clock)
	cmd := &Request{c: c0, rec: 0, name: 0, mode: modeExclusive, flags: recExec,
		pid: int64(os.Getpid()), pstart: processStart(os.Getpid()), asked: clock()}
	cmd.Granted(3)
	cmd.Enter()
	q := grant(c1, 0, 0, modeExclusive, false, 4)
	n, msgs := violations(r)
	require.Equal(t, 1, n, msgs)
	require.Contains(t, msgs, "exec: pid 1001: exclusion broken on stress-0: exclusive grant token 4 (goroutine 0) overlapped exclusive holder token 3 (exec command pid")
	release(q)
	cmd.Exit() // the counter moved under it: a second exec violation
	cmd.Release()
	require.Equal(t, map[string]int{"exec": 2}, kinds(r))

	// A dead command's record is ignored.
	dead := deadPID(t)
	gone := &Request{c: c0, rec: 1, name: 0, mode: modeExclusive, flags: recExec, pid: int64(dead), asked: clock()}
	gone.Granted(5)
	release(grant(c1, 0, 0, modeExclusive, false, 6))
	n, _ = violations(r)
	require.Equal(t, 2, n)
	gone.Release()

	// Without a token: excused by a steal granted after its wrapper started.
	tl := &Request{c: c0, rec: 0, name: 0, mode: modeExclusive, flags: recExec, noToken: true,
		pid: int64(os.Getpid()), asked: clock()}
	tl.Granted(0)
	tl.Enter()
	thief := grant(c1, 0, 0, modeExclusive, true, 9)
	release(thief)
	tl.Exit()
	tl.Release()
	n, msgs = violations(r)
	require.Equal(t, 2, n, msgs)
}

// deadPID returns the pid of a process that has exited and been waited for.
func deadPID(t *testing.T) int {
	t.Helper()
	p, err := os.StartProcess("/bin/sh", []string{"sh", "-c", "exit 0"}, &os.ProcAttr{})
	if err != nil {
		t.Skip("no /bin/sh: ", err)
	}
	_, err = p.Wait()
	require.NoError(t, err)
	return p.Pid
}

// TestCheckerFlightLeaders: two leaders of one Coalesce key at once are a
// flight violation; a killed leader's record is not.
func TestCheckerFlightLeaders(t *testing.T) {
	r := testRegion(t, 2, 3, 1)
	clock := fakeClock()
	c0, c1, c2 := testChecker(r, 0, clock), testChecker(r, 1, clock), testChecker(r, 2, clock)
	lead := func(c *Checker, key int) *Request {
		q := c.begin(want{rec: 0, name: r.flight(key), mode: modeExclusive})
		q.End()
		q.Granted(0)
		q.Enter()
		return q
	}
	a := lead(c0, 1)
	other := lead(c1, 0) // another key: fine
	n, msgs := violations(r)
	require.Zero(t, n, msgs)
	release(other)
	b := lead(c1, 1)
	n, msgs = violations(r)
	require.Equal(t, 1, n, msgs)
	require.Contains(t, msgs, "flight: pid 1001: two leaders of flight stress-1 at once")
	release(b)
	r.setSlotState(0, slotKilled) // a's process is killed: the next leader may run
	r.AddKill()
	release(lead(c2, 1))
	n, msgs = violations(r)
	require.Equal(t, 1, n, msgs)
	require.Equal(t, map[string]int{"flight": 1}, kinds(r))

	// Without the occupancy record (a leader that overlapped unseen), the
	// key's counter tells: a's section ends after two others wrote it.
	a.Exit()
	n, msgs = violations(r)
	require.Equal(t, 2, n, msgs)
	require.Contains(t, msgs, "flight: pid 1000: exclusion broken on flight stress-1: its counter changed from 0 to 2")
}

func TestFlightResult(t *testing.T) {
	arrive := mono()
	res := flightResult(2, 5, 1, 42, arrive-int64(time.Millisecond), arrive, 300)
	require.Empty(t, checkFlightResult(res, 2, arrive, time.Second))
	require.Contains(t, checkFlightResult(res[:len(res)-1], 2, arrive, time.Second), "partial or corrupt")
	require.Contains(t, checkFlightResult(res[:20], 2, arrive, time.Second), "not a whole flight result")
	bad := append([]byte(nil), res...)
	bad[100] ^= 1
	require.Contains(t, checkFlightResult(bad, 2, arrive, time.Second), "partial or corrupt")
	require.Contains(t, checkFlightResult(res, 3, arrive, time.Second), "another key (stress-2)")
	require.Contains(t, checkFlightResult(res, 2, arrive+int64(3*time.Second), time.Second), "ended 3s before the caller arrived")
	require.Empty(t, checkFlightResult(flightResult(0, 0, 0, 1, 1, 2, 0), 0, 2, time.Second), "an empty payload")
}

func TestViolationKindsAndPositions(t *testing.T) {
	r := testRegion(t, 1, 4, 1)
	r.violation(kindExec, "x")
	r.Violation("y")
	n, msgs := r.Violations()
	require.Equal(t, 2, n)
	require.Equal(t, "exec: x", msgs[0])
	require.Equal(t, "other: y", msgs[1])

	// A replacement takes its victim's position: the scans visit it, not
	// the victim's slot.
	r.ClaimSlot(3, 1)
	var seen []int
	r.liveSlots(func(s int) { seen = append(seen, s) })
	require.Equal(t, []int{0, 3, 2}, seen[:3])
}

func TestParseFeatures(t *testing.T) {
	f, err := ParseFeatures("exec, child,exec")
	require.NoError(t, err)
	require.Equal(t, []string{"exec", "child"}, f)
	f, err = ParseFeatures("every")
	require.NoError(t, err)
	require.Equal(t, AllFeatures, f)
	for _, bad := range []string{"", "mutex", "plain,nope"} {
		_, err := ParseFeatures(bad)
		require.ErrorIs(t, err, ErrUsage, bad)
	}
	c := Config{Worker: []string{"x"}, Features: []string{FeaturePlain, FeatureChild}, Procs: 2}
	c.Defaults()
	require.NoError(t, c.Validate())
	for _, mut := range []func(*Config){
		func(c *Config) { c.Procs = 1 },                      // a feature without a process
		func(c *Config) { c.Backend = BackendFlock },         // child needs shmlocks
		func(c *Config) { c.Features = []string{"exec"} },    // no exec command
		func(c *Config) { c.Features = []string{"unknown"} }, // no such feature
	} {
		c := c
		mut(&c)
		require.ErrorIs(t, c.Validate(), ErrUsage)
	}
	require.Equal(t, childRecords, recordsPerGoroutine([]string{FeaturePlain, FeatureChild}))
	require.Equal(t, allMax, recordsPerGoroutine([]string{FeatureAll}))
	require.Equal(t, 1, recordsPerGoroutine(nil))
}

// TestWriteTextFeatures: the features table, with max/min requests per
// process within each feature; the fairness rows of a run whose processes
// do different features say so instead of comparing them, and a max/min
// whose min is 0 is no ratio.
func TestWriteTextFeatures(t *testing.T) {
	rep := &Report{Backend: "shmlocks", Features: map[string]FeatureReport{
		FeatureExec:     {Processes: 1, Requests: 10, Grants: 9, Kills: 4, ExecKills: map[string]int{"wrapper": 2, "command": 1, "group": 1}},
		FeaturePlain:    {Processes: 2, Requests: 100, Grants: 90, Kills: 3, Fairness: FeatureFairness{Max: 60, Min: 40, Ratio: 1.5}},
		FeatureCoalesce: {Processes: 2, Requests: 70, Grants: 70, Fairness: FeatureFairness{Max: 70, Min: 0}},
	}, ViolationsByKind: map[string]int{"exec": 2}, Violations: 2,
		Fairness: Fairness{Max: 70, Min: 0, Goroutine: GoroutineFairness{Max: 35, Min: 0}}}
	var b strings.Builder
	require.NoError(t, WriteText(&b, []*Report{rep}))
	out := b.String()
	require.Regexp(t, `plain\s+2\s+100\s+90\s+3\s+1\.50`, out)
	require.Regexp(t, `exec\s+1\s+10\s+9\s+4\s+-`, out)
	require.Regexp(t, `coalesce\s+2\s+70\s+70\s+0\s+one had none`, out)
	require.Contains(t, out, "kills: wrapper 2, command 1, group 1")
	require.Contains(t, out, "violations by kind: exclusion 0, exec 2,")
	require.Regexp(t, `fairness max/min\s+per feature \(features\)`, out)
	require.Regexp(t, `fairness per goroutine \(grants\) max/min\s+per feature \(features\)`, out)

	one := &Report{Backend: "shmlocks", Fairness: Fairness{Max: 7, Min: 0, Goroutine: GoroutineFairness{Max: 9, Min: 3, Ratio: 3}}}
	b.Reset()
	require.NoError(t, WriteText(&b, []*Report{one}))
	require.Regexp(t, `fairness max/min\s+7/0 \(one had none\)`, b.String())
	require.Regexp(t, `fairness per goroutine \(grants\) max/min\s+9/3 = 3\.00`, b.String())
}
