package manager_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

// acquireLogged is the child side of "acqlog NAME ID LOG": one goroutine
// acquires NAME exclusively, appends "PID ID TOKEN\n" to LOG while it holds
// the lock (one write to an O_APPEND descriptor: the file's order is the
// order of the critical sections, seen by nobody's lock code), releases, and
// says "logged ID TOKEN".
func acquireLogged(m *Manager, name, id, log string) {
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()
	l, err := m.Acquire(ctx, name, RequestOptions{})
	if err != nil {
		say("error acqlog %s %v", id, err)
		return
	}
	f, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err == nil {
		_, err = fmt.Fprintf(f, "%d %s %d\n", os.Getpid(), id, l.Token())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if rerr := l.Release(); err == nil {
		err = rerr
	}
	if err != nil {
		say("error acqlog %s %v", id, err)
		return
	}
	say("logged %s %d", id, l.Token())
}

// grantLog is one line of the O_APPEND grant log.
type grantLog struct {
	pid   int
	id    string
	token uint64
}

func readGrantLog(t *testing.T, path string) []grantLog {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []grantLog
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		require.Len(t, f, 3, "log line %q", line)
		pid, err := strconv.Atoi(f[0])
		require.NoError(t, err)
		tok, err := strconv.ParseUint(f[2], 10, 64)
		require.NoError(t, err)
		out = append(out, grantLog{pid, f[1], tok})
	}
	return out
}

// TestProcessesGoroutinesFollowQueryOrder: P processes with G goroutines
// each queue on one name behind a holder (this process); Query shows the
// pending order; on release every request is granted in exactly that order,
// as recorded by the grantees themselves in an O_APPEND file while they hold
// the lock, with strictly increasing tokens. FIFO is per request, not per
// process: a process's later request never overtakes another process's
// earlier one, nor its own goroutines' earlier ones.
//
// Round 1 queues the goroutines one at a time in a random interleaving of
// the processes (the seed is logged), waiting for each to appear in the
// table, so the order is known per goroutine: Query must show it, and the
// log must follow it goroutine by goroutine. Round 2 lets all goroutines of
// all processes race into the queue at once: the log must follow, process by
// process, the order Query showed.
func TestProcessesGoroutinesFollowQueryOrder(t *testing.T) {
	const procs, gor = 3, 4
	path := tablePath(t)
	m := openM(t, path, nil)
	kids := make([]*child, procs)
	pidOf := map[int]*child{}
	for i := range kids {
		kids[i] = spawn(t, path, nil)
		pidOf[kids[i].Pid] = kids[i]
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 18))
	ctx := ctxT(t, eventually)

	// round runs one round: hold, queue (via enqueue), Query, release,
	// collect; it returns the PIDs of the pending requests Query showed and the log.
	round := func(name string, enqueue func(log string)) ([]int, []grantLog) {
		t.Helper()
		log := filepath.Join(t.TempDir(), "grants.log")
		h, err := m.Acquire(ctx, name, RequestOptions{})
		require.NoError(t, err)
		enqueue(log)
		waitPending(t, m, name, procs*gor)
		snap, err := m.Query(ctx)
		require.NoError(t, err)
		var order []int
		for _, p := range snap.Pending {
			require.Equal(t, name, p.Name)
			order = append(order, p.PID)
		}
		check(t, m)
		require.NoError(t, h.Release())
		for _, k := range kids {
			for g := 0; g < gor; g++ {
				k.Expect("logged ")
			}
		}
		got := readGrantLog(t, log)
		require.Len(t, got, procs*gor)
		prev := h.Token()
		for i, gl := range got {
			require.Greater(t, gl.token, prev, "grant %d (%+v): tokens strictly increase", i, gl)
			prev = gl.token
		}
		check(t, m)
		return order, got
	}

	// Round 1: a known interleaving, one request at a time.
	var want []grantLog // pid and id, in queue order
	left := make([]int, procs)
	for i := range left {
		left[i] = gor
	}
	for len(want) < procs*gor {
		i := rng.IntN(procs)
		if left[i] == 0 {
			continue
		}
		want = append(want, grantLog{pid: kids[i].Pid, id: fmt.Sprintf("r1-%d-%d", i, gor-left[i])})
		left[i]--
	}
	order, got := round("q1", func(log string) {
		for n, w := range want {
			pidOf[w.pid].Send("acqlog q1 %s %s", w.id, log)
			waitPending(t, m, "q1", n+1)
		}
	})
	for i, w := range want {
		require.Equal(t, w.pid, order[i], "Query position %d", i)
		require.Equal(t, w.pid, got[i].pid, "grant %d: want %s, got %+v", i, w.id, got[i])
		require.Equal(t, w.id, got[i].id, "grant %d", i)
	}

	// Round 2: every goroutine of every process requests at once.
	order, got = round("q2", func(log string) {
		for i, k := range kids {
			for g := 0; g < gor; g++ {
				k.Send("acqlog q2 r2-%d-%d %s", i, g, log)
			}
		}
	})
	var gotPIDs []int
	for _, gl := range got {
		gotPIDs = append(gotPIDs, gl.pid)
	}
	require.Equal(t, order, gotPIDs, "grants follow the queue order Query showed")

	snap, err := m.Query(ctx)
	require.NoError(t, err)
	require.Empty(t, snap.Held)
	require.Empty(t, snap.Pending)
}
