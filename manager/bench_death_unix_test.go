//go:build unix

package manager

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// BenchmarkDeathToGrant: a child process holds both a shmlocks lock and an
// flock(2) lock; this process waits on both; one SIGKILL. Reported: the
// median and p99 time from the kill to each waiter's grant, side by side.
func BenchmarkDeathToGrant(b *testing.B) {
	path := filepath.Join(b.TempDir(), "death.tbl")
	flockPath := filepath.Join(b.TempDir(), "death.flock")
	m, err := Open(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	var ours, theirs []time.Duration
	for i := 0; i < b.N; i++ {
		c := spawn(b, path, nil)
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
			l, err := m.Acquire(ctx, "d", RequestOptions{})
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
		ours = append(ours, tg.Sub(t0))
		theirs = append(theirs, tf.Sub(t0))
		cancel()
		f.Close()
		c.Wait()
	}
	slices.Sort(ours)
	slices.Sort(theirs)
	pct := func(d []time.Duration, p float64) float64 { return float64(d[int(float64(len(d)-1)*p)].Microseconds()) }
	b.ReportMetric(pct(ours, 0.5), "shm-p50-us")
	b.ReportMetric(pct(ours, 0.99), "shm-p99-us")
	b.ReportMetric(pct(theirs, 0.5), "flock-p50-us")
	b.ReportMetric(pct(theirs, 0.99), "flock-p99-us")
	b.ReportMetric(pct(ours, 0.5)/max(pct(theirs, 0.5), 1), "ratio-p50")
}
