//go:build unix

package bench

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/internal/proctest"
	"github.com/shmlocks/shmlocks/manager"
)

// BenchmarkDeathToGrant: a child process holds both a shmlocks lock and an
// flock(2) lock; this process waits on both; one SIGKILL. Reported: the
// median and p99 time from the kill to each waiter's grant, side by side;
// and, where this process may create namespaces (root), the same with the
// holder in new PID and network namespaces of its own (a container sharing
// the table), every other iteration (ns-p50-us, ns-p99-us, ratio-ns-p50:
// that over the same-namespace median of the same run).
func BenchmarkDeathToGrant(b *testing.B) {
	nsOK := canUnshare()
	path := filepath.Join(b.TempDir(), "death.tbl")
	flockPath := filepath.Join(b.TempDir(), "death.flock")
	m, err := manager.Open(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	var ours, theirs, across []time.Duration
	for i := 0; i < b.N*2; i++ {
		inNS := i%2 == 1
		if inNS && !nsOK {
			continue
		}
		c := spawnHolderIn(b, path, inNS)
		c.Send("acquire d")
		c.Expect("acquired d")
		c.Send("flock %s", flockPath)
		c.Expect("flocked")
		f, err := os.OpenFile(flockPath, os.O_RDWR, 0)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), eventually)
		got := make(chan time.Time, 1)
		flocked := make(chan time.Time, 1)
		go func() {
			l, err := m.Acquire(ctx, "d", manager.RequestOptions{})
			now := time.Now()
			if err != nil {
				b.Error(err)
			} else {
				l.Release()
			}
			got <- now
		}()
		go func() {
			syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
			flocked <- time.Now()
			syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		}()
		waitPending(b, m, "d", 1)
		time.Sleep(2 * time.Millisecond) // let both waiters go to sleep (not a synchronisation: a settling time for the measurement)
		t0 := time.Now()
		c.Cmd.Process.Kill()
		tg, tf := <-got, <-flocked
		if os.Getenv("DEBUG_REAP") != "" {
			println("kill", t0.UnixMicro(), "grant", tg.UnixMicro(), "flock", tf.UnixMicro())
		}
		if inNS {
			across = append(across, tg.Sub(t0))
		} else {
			ours = append(ours, tg.Sub(t0))
			theirs = append(theirs, tf.Sub(t0))
		}
		cancel()
		f.Close()
		c.Wait()
	}
	slices.Sort(ours)
	slices.Sort(theirs)
	slices.Sort(across)
	pct := func(d []time.Duration, p float64) float64 { return float64(d[int(float64(len(d)-1)*p)].Microseconds()) }
	b.ReportMetric(pct(ours, 0.5), "shm-p50-us")
	b.ReportMetric(pct(ours, 0.99), "shm-p99-us")
	b.ReportMetric(pct(theirs, 0.5), "flock-p50-us")
	b.ReportMetric(pct(theirs, 0.99), "flock-p99-us")
	b.ReportMetric(pct(ours, 0.5)/max(pct(theirs, 0.5), 1), "ratio-p50")
	if len(across) > 0 {
		b.ReportMetric(pct(across, 0.5), "ns-p50-us")
		b.ReportMetric(pct(across, 0.99), "ns-p99-us")
		b.ReportMetric(pct(across, 0.5)/max(pct(ours, 0.5), 1), "ratio-ns-p50")
	}
}

// spawnHolderIn is spawnHolder, in new PID and network namespaces if ns.
func spawnHolderIn(t testing.TB, path string, ns bool) *child {
	t.Helper()
	if !ns {
		return spawnHolder(t, path)
	}
	cmd := proctest.CommandWith(proctest.Options{Within: eventually}, "holder", path)
	cmd.SysProcAttr = nsAttr()
	c := &child{Child: proctest.Start(t, cmd, proctest.Options{Within: eventually}), t: t}
	c.Expect("ready")
	return c
}

func init() { childRoles["holder"] = holderMain }

// spawnHolder starts a holder child on the table at path and waits for
// "ready".
func spawnHolder(t testing.TB, path string) *child {
	t.Helper()
	c := &child{Child: proctest.SpawnWith(t, proctest.Options{Within: eventually}, "holder", path), t: t}
	c.Expect("ready")
	return c
}

// holderMain is the role "holder": it opens the table args[0] (smallTable)
// and obeys
//
//	acquire NAME -> "acquired NAME TOKEN" (exclusive, held until the child dies)
//	flock PATH   -> "flocked" (an exclusive flock(2) on PATH, held as long)
func holderMain(args []string) int {
	m, err := manager.Open(args[0], smallTable)
	if err != nil {
		proctest.Say("error open %v", err)
		return 2
	}
	proctest.Say("ready")
	var held []any // what the holder keeps until it dies
	for f := range proctest.Commands() {
		switch f[0] {
		case "acquire":
			l, err := m.Acquire(context.Background(), f[1], manager.RequestOptions{})
			if err != nil {
				proctest.Say("error acquire %v", err)
				continue
			}
			held = append(held, l)
			proctest.Say("acquired %s %d %d", f[1], l.Token(), monoNow())
		case "release": // release NAME -> "released NAME MONO": the time just before it
			for i, h := range held {
				if l, ok := h.(*manager.Lock); ok && l.Name() == f[1] {
					t0 := monoNow()
					l.Release()
					held = append(held[:i], held[i+1:]...)
					proctest.Say("released %s %d", f[1], t0)
					break
				}
			}
		case "flock":
			fl, err := os.OpenFile(f[1], os.O_CREATE|os.O_RDWR, 0o600)
			if err == nil {
				err = syscall.Flock(int(fl.Fd()), syscall.LOCK_EX)
			}
			if err != nil {
				proctest.Say("error flock %v", err)
				continue
			}
			held = append(held, fl)
			proctest.Say("flocked")
		}
	}
	_ = held
	return 0
}
