//go:build linux

package bench

import (
	"bytes"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"golang.org/x/sys/unix"
)

// How long each request of BenchmarkGoroutines waited, from just before
// its lock call to its grant: every goroutine counts its waits in a
// histogram of its own in the control file (its own cache lines: no
// traffic between the loops), and keeps its longest. The parent takes the
// difference of the histograms between the start and the end of the
// window, and zeroes the maxima at the start, so both cover the window.
//
// Buckets: four per power of two (each 19% wide), waits below 4 ns in
// buckets 0-3, the last bucket holding everything from about 4 s.
const (
	waitBuckets  = 128
	waitStride   = (waitBuckets + 1) * 8 // the buckets, then the longest wait (ns)
	waitStride64 = (waitStride + 63) &^ 63
)

// benchWaitBucket is the bucket of a wait of ns nanoseconds.
func benchWaitBucket(ns int64) int {
	if ns < 4 {
		return int(max(ns, 0))
	}
	e := bits.Len64(uint64(ns)) - 1 // >= 2
	i := 4*(e-1) + int(uint64(ns)>>(e-2))&3
	return min(i, waitBuckets-1)
}

// benchWaitBucketTop is the upper bound (ns) of bucket i.
func benchWaitBucketTop(i int) float64 {
	if i < 4 {
		return float64(i + 1)
	}
	e, sub := i/4+1, i%4
	return float64(uint64(4+sub+1) << (e - 2))
}

// waitsOf returns goroutine id's histogram and longest wait in ctl.
func waitsOf(ctl []byte, id int) (hist []uint64, longest *uint64) {
	off := ctlWaits + waitStride64*id
	p := (*[waitBuckets + 1]uint64)(unsafe.Pointer(&ctl[off : off+waitStride][0]))
	return p[:waitBuckets], &p[waitBuckets]
}

// waitRecorder records one goroutine's waits.
type waitRecorder struct {
	hist    []uint64
	longest *uint64
}

func newWaitRecorder(ctl []byte, id int) waitRecorder {
	h, l := waitsOf(ctl, id)
	return waitRecorder{hist: h, longest: l}
}

// record counts a wait of ns nanoseconds: the longest first, so that a
// wait the parent finds in the histogram is never above the longest it
// reads after. A negative wait counts as 0: the two readings may come from
// two CPUs whose time-stamp counters differ by a little (a guest's vCPUs),
// and as an unsigned number it was once reported as the longest wait of a
// run (18446744073708876 µs).
func (r waitRecorder) record(ns int64) {
	ns = max(ns, 0)
	for {
		old := atomic.LoadUint64(r.longest)
		if uint64(ns) <= old || atomic.CompareAndSwapUint64(r.longest, old, uint64(ns)) {
			break
		}
	}
	atomic.AddUint64(&r.hist[benchWaitBucket(ns)], 1)
}

// waitSnapshot is the parent's reading of every goroutine's histogram.
type waitSnapshot []uint64

// readWaits sums the histograms of goroutines [0, n).
func readWaits(ctl []byte, n int) waitSnapshot {
	s := make(waitSnapshot, waitBuckets)
	for id := range n {
		h, _ := waitsOf(ctl, id)
		for i := range h {
			s[i] += atomic.LoadUint64(&h[i])
		}
	}
	return s
}

// resetLongest zeroes the longest wait of goroutines [0, n) (the window
// starts).
func resetLongest(ctl []byte, n int) {
	for id := range n {
		_, l := waitsOf(ctl, id)
		atomic.StoreUint64(l, 0)
	}
}

// readLongest is the longest wait of goroutines [0, n), ns.
func readLongest(ctl []byte, n int) float64 {
	var m uint64
	for id := range n {
		_, l := waitsOf(ctl, id)
		m = max(m, atomic.LoadUint64(l))
	}
	return float64(m)
}

// quantile is the upper bound of the bucket that holds quantile q of the
// waits counted in s1 and not in s0 (ns; 0 if none).
func quantile(s0, s1 waitSnapshot, q float64) float64 {
	var n uint64
	for i := range s1 {
		n += s1[i] - s0[i]
	}
	if n == 0 {
		return 0
	}
	want := uint64(q*float64(n-1)) + 1
	var c uint64
	for i := range s1 {
		if c += s1[i] - s0[i]; c >= want {
			return benchWaitBucketTop(i)
		}
	}
	return benchWaitBucketTop(waitBuckets - 1)
}

var (
	machineOnce sync.Once
	machineLine string
)

// machine describes where the benchmarks run: the CPU model, the CPUs this
// process may use, how long a cache line takes to cross between two of
// them (lineNs, measured now), and the kernel. Figures measured on one CPU
// model do not compare with those of another (docs/benchmarks.md).
func machine() string {
	machineOnce.Do(func() {
		model := "unknown CPU"
		if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
			for _, l := range bytes.Split(b, []byte("\n")) {
				if k, v, ok := bytes.Cut(l, []byte(":")); ok && strings.TrimSpace(string(k)) == "model name" {
					model = strings.TrimSpace(string(v))
					break
				}
			}
		}
		var u unix.Utsname
		kernel := "unknown kernel"
		if unix.Uname(&u) == nil {
			kernel = unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:])
		}
		machineLine = fmt.Sprintf("machine: %s, %d CPUs (GOMAXPROCS %d), cache line crossing %.0f ns, %s",
			model, cpusAllowed(), runtime.GOMAXPROCS(0), lineNs(lineTrips), kernel)
	})
	return machineLine
}

// TestBenchWaitBuckets: every wait falls in a bucket whose top is above it
// and at most 25% above it (from 4 ns), and buckets are in order.
func TestBenchWaitBuckets(t *testing.T) {
	last := -1
	for _, ns := range []int64{0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 100, 1000, 12345, 1e6, 1e9, 4e9, 1 << 40} {
		i := benchWaitBucket(ns)
		require.GreaterOrEqual(t, i, last, "%d ns", ns)
		last = i
		if i == waitBuckets-1 {
			continue
		}
		top := benchWaitBucketTop(i)
		require.Greater(t, top, float64(ns), "%d ns in bucket %d (top %v)", ns, i, top)
		if ns >= 4 {
			require.LessOrEqual(t, top, 1.25*float64(ns)+1, "%d ns in bucket %d (top %v)", ns, i, top)
		}
	}
}

// TestBenchWaitRecorder: the longest wait is the largest recorded, and a
// negative wait (clocks of two CPUs) counts as 0 in both the histogram and
// the longest.
func TestBenchWaitRecorder(t *testing.T) {
	words := make([]uint64, (ctlSize+7)/8) // 8-byte aligned, as the mapping is
	r := newWaitRecorder(unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), ctlSize), 0)
	r.record(-700)
	require.Zero(t, *r.longest)
	require.EqualValues(t, 1, r.hist[0])
	r.record(1500)
	r.record(900)
	require.EqualValues(t, 1500, *r.longest)
	require.EqualValues(t, 1, r.hist[benchWaitBucket(1500)])
}

// cpusAllowed is the number of CPUs this process may run on.
func cpusAllowed() int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return runtime.NumCPU()
	}
	return set.Count()
}
