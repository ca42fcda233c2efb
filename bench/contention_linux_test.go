//go:build linux

package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/manager"
)

// BenchmarkContention: 2, 4 and 8 child processes loop greedily on one
// exclusive name (lock, critical section, unlock, again), started together
// and sampled over a fixed window; the same with flock(LOCK_EX) on one file,
// in the same run. Critical sections: empty and ~1µs of CPU work. Variants:
// unpinned, and every child born bound to one CPU.
//
// Reported: total ops/s of each, the ratio shm/flock, the ratio of the most
// to the least operations done by one process (fairness), the share of grants
// that went back to the previous holder (with every process always
// requesting, a FIFO lock gives it only when nobody else was queued yet), the
// calibration, the children's CPU count and, unpinned, how long a cache
// line takes to cross between two CPUs around the shmlocks loop (line-ns:
// the rows have two modes with the placement of the vCPUs, lineNs).
func BenchmarkContention(b *testing.B) {
	cs1us := int(spinItersPerMicro())
	for _, pinned := range []bool{false, true} {
		for _, procs := range []int{2, 4, 8} {
			for _, cs := range []struct {
				name  string
				iters int
			}{{"0", 0}, {"1us", cs1us}} {
				name := fmt.Sprintf("procs=%d/cs=%s/%s", procs, cs.name, pinName(pinned))
				b.Run(name, func(b *testing.B) {
					var shm, fl loopResult
					for i := 0; i < b.N; i++ {
						shm = runLoop(b, loopCfg{kind: kindShm, procs: procs, csIters: cs.iters, pinned: pinned, calib: true})
						fl = runLoop(b, loopCfg{kind: kindFlock, procs: procs, csIters: cs.iters, pinned: pinned})
					}
					b.ReportMetric(shm.opsPerSec(), "shm-ops/s")
					b.ReportMetric(fl.opsPerSec(), "flock-ops/s")
					b.ReportMetric(shm.opsPerSec()/fl.opsPerSec(), "shm/flock")
					b.ReportMetric(shm.maxMin(), "shm-maxmin")
					b.ReportMetric(fl.maxMin(), "flock-maxmin")
					b.ReportMetric(shm.cpuMaxMin(), "shm-cpu-maxmin")
					b.ReportMetric(shm.opsPerCPUMaxMin(), "shm-opspercpu-maxmin")
					b.ReportMetric(shm.repeatPct(), "shm-repeat%")
					b.ReportMetric(fl.repeatPct(), "flock-repeat%")
					b.ReportMetric(shm.calib, "calib-2v1")
					if !pinned {
						b.ReportMetric(shm.lineNs, "line-ns") // 0: not measured (bench.sh pairs the runs by index)
					}
					if shm.gaps {
						reportGaps(b, "shm", shm)
						reportGaps(b, "flock", fl)
					}
					reportPinning(b, shm)
				})
			}
		}
	}
}

// reportGaps reports the gaps between sections of r (SHMLOCKS_BENCH_GAPS).
func reportGaps(b *testing.B, kind string, r loopResult) {
	b.ReportMetric(r.gapP50(), kind+"-gap-p50-ns")
	b.ReportMetric(r.gapMean(), kind+"-gap-mean-ns")
	b.ReportMetric(r.stallPct(), kind+"-stall%")
}

// BenchmarkSharedReaders: 1 and 2 child processes loop on a shared request
// of one name (nobody ever asks for it exclusively), against flock(LOCK_SH)
// on one file in the same run. Reported: total ops/s of each and the ratio.
func BenchmarkSharedReaders(b *testing.B) {
	for _, procs := range []int{1, 2} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) {
			var shm, fl loopResult
			for i := 0; i < b.N; i++ {
				shm = runLoop(b, loopCfg{kind: kindShm, procs: procs, mode: manager.Shared, calib: true})
				fl = runLoop(b, loopCfg{kind: kindFlock, procs: procs, mode: manager.Shared})
			}
			b.ReportMetric(shm.opsPerSec(), "shm-ops/s")
			b.ReportMetric(fl.opsPerSec(), "flock-ops/s")
			b.ReportMetric(shm.opsPerSec()/fl.opsPerSec(), "shm/flock")
			if procs > 1 {
				b.ReportMetric(shm.calib, "calib-2v1")
			}
		})
	}
}

// BenchmarkYieldShare measures what sched_yield costs the process that calls
// it, on this kernel: two children bound to one CPU for 1 s, both doing 1 µs
// work units, one calling sched_yield after each unit. Reported: the units
// of the busy child per unit of the yielding one (about 1 when a yield is
// free, as under CFS; far above 1 when a yield forfeits the rest of the
// time slice, as under EEVDF). This is why a waiter confined to one CPU
// yields once and then parks (spinStep).
func BenchmarkYieldShare(b *testing.B) {
	cpu := firstCPU()
	var ratio float64
	for i := 0; i < b.N; i++ {
		dir := b.TempDir()
		ctlPath := filepath.Join(dir, "ctl")
		require.NoError(b, os.WriteFile(ctlPath, make([]byte, ctlSize), 0o600))
		busy := startBenchChild(b, "loop", ctlPath, benchArgs{Kind: "none", Limit: time.Minute}, cpu)
		yielder := startBenchChild(b, "loop", ctlPath, benchArgs{Kind: "none", Index: 1, Limit: time.Minute}, cpu)
		busy.Send("share0")
		yielder.Send("share1")
		units := func(c benchChildInfo) float64 {
			v, err := strconv.ParseFloat(strings.Fields(c.Expect("share"))[1], 64)
			require.NoError(b, err)
			return v
		}
		nb, ny := units(busy), units(yielder)
		busy.CloseStdin()
		yielder.CloseStdin()
		busy.Wait()
		yielder.Wait()
		ratio = nb / max(ny, 1)
	}
	b.ReportMetric(ratio, "busy/yielder")
}
