//go:build linux

package bench

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shmlocks/shmlocks/manager"
)

// nsAttr starts a child in new PID and network namespaces (a container).
func nsAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNET}
}

// canUnshare reports whether this process may start children in new PID
// and network namespaces (root, or a user namespace allowing it).
func canUnshare() bool {
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = nsAttr()
	return cmd.Run() == nil
}

// monoNow is CLOCK_MONOTONIC in ns: one clock for every process of the
// machine, whatever PID or network namespace it lives in.
func monoNow() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return unix.TimespecToNsec(ts)
}

// BenchmarkReleaseToGrantAcrossNetworks: a release in one process, the
// grant of a parked waiter in another, timed on CLOCK_MONOTONIC from just
// before the Release to just after the Acquire returns, both ways between
// this process and a child, with the child on the host and in new PID and
// network namespaces of its own (whose abstract doorbells this process
// cannot reach: the ring goes through the table's cross-namespace bell),
// every iteration one of each. Reported: p50 and p99 per case (µs), and
// ratio-ns-p50 (the namespaced child over the host child, the same way).
func BenchmarkReleaseToGrantAcrossNetworks(b *testing.B) {
	if !canUnshare() {
		b.Skip("cannot create namespaces here (root needed)")
	}
	path := filepath.Join(b.TempDir(), "rtg.tbl")
	m, err := manager.Open(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	kids := map[bool]*child{false: spawnHolderIn(b, path, false), true: spawnHolderIn(b, path, true)}
	type key struct{ ns, childReleases bool }
	got := map[key][]time.Duration{}
	settle := func() { time.Sleep(2 * time.Millisecond) } // the waiter parks (a settling time for the measurement, not a synchronisation)
	for i := 0; i < b.N; i++ {
		for _, ns := range []bool{false, true} {
			c := kids[ns]
			// The child holds and releases; this process waits.
			c.Send("acquire x")
			c.Expect("acquired x")
			done := make(chan int64, 1)
			go func() {
				l, err := m.Acquire(context.Background(), "x", manager.RequestOptions{})
				t1 := monoNow()
				if err != nil {
					b.Error(err)
				} else {
					l.Release()
				}
				done <- t1
			}()
			waitPending(b, m, "x", 1)
			settle()
			c.Send("release x")
			var t0 int64
			fmt.Sscanf(c.Expect("released x"), "released x %d", &t0)
			got[key{ns, true}] = append(got[key{ns, true}], time.Duration(<-done-t0))
			// This process holds and releases; the child waits.
			l, err := m.Acquire(context.Background(), "x", manager.RequestOptions{})
			if err != nil {
				b.Fatal(err)
			}
			c.Send("acquire x")
			waitPending(b, m, "x", 1)
			settle()
			t0 = monoNow()
			l.Release()
			var tok, t1 int64
			fmt.Sscanf(c.Expect("acquired x"), "acquired x %d %d", &tok, &t1)
			got[key{ns, false}] = append(got[key{ns, false}], time.Duration(t1-t0))
			c.Send("release x")
			c.Expect("released x")
		}
	}
	pct := func(d []time.Duration, p float64) float64 {
		d = slices.Clone(d)
		slices.Sort(d)
		return float64(d[int(float64(len(d)-1)*p)].Microseconds())
	}
	for _, k := range []key{{false, true}, {true, true}, {false, false}, {true, false}} {
		name := map[bool]string{false: "host", true: "ns"}[k.ns] + map[bool]string{true: "-child-releases", false: "-child-waits"}[k.childReleases]
		b.ReportMetric(pct(got[k], 0.5), name+"-p50-us")
		b.ReportMetric(pct(got[k], 0.99), name+"-p99-us")
	}
	b.ReportMetric(pct(got[key{true, true}], 0.5)/max(pct(got[key{false, true}], 0.5), 1), "ratio-ns-p50-child-releases")
	b.ReportMetric(pct(got[key{true, false}], 0.5)/max(pct(got[key{false, false}], 0.5), 1), "ratio-ns-p50-child-waits")
}
