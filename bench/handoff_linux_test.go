//go:build linux

package bench

import (
	"testing"

	"github.com/shmlocks/shmlocks/manager"
)

// BenchmarkHandoff: two child processes pass one exclusive lock back and
// forth, side by side in the same run:
//
//   - shm: both loop on Request(name); the holder releases only once the
//     partner has announced it is about to request (a flag in the control
//     file; see benchLoop), so with FIFO handoff every release is a grant to
//     the partner.
//   - flock: the same protocol on flock(LOCK_EX)/flock(LOCK_UN) of one file;
//     flock lets the releaser take the lock back before the partner runs
//     (a "repeat": it unlocks, yields and retries), so the figure is the
//     window divided by the number of ownership changes.
//   - futex: a bare ping-pong on a MAP_SHARED turn word (futex.Wait/Wake), the
//     floor of a sleeping handoff.
//
// Reported per variant (unpinned: the scheduler places the processes on the
// 2 vCPUs; pinned: both children born bound to one CPU; pinned-nospin: the
// same with OpenOptions.SpinLimit < 0, a diagnostic of the waiter's spin
// phase, which yields only to goroutines, never the CPU): ns per ownership
// change for each, the ratios shm/futex and shm/flock, the share of grants
// that went back to the last holder, and the calibration (a CPU loop in two
// processes at once vs alone).
func BenchmarkHandoff(b *testing.B) {
	for _, v := range []struct {
		name   string
		pinned bool
		opts   *manager.OpenOptions
	}{
		{"unpinned", false, nil},
		{"pinned", true, nil},
		{"pinned-nospin", true, &manager.OpenOptions{SpinLimit: -1}},
	} {
		pinned := v.pinned
		b.Run(v.name, func(b *testing.B) {
			var shm, fl, fx loopResult
			for i := 0; i < b.N; i++ {
				shm = runLoop(b, loopCfg{kind: kindShm, procs: 2, ping: true, pinned: pinned, opts: v.opts, calib: true})
				fl = runLoop(b, loopCfg{kind: kindFlock, procs: 2, ping: true, pinned: pinned})
				fx = runLoop(b, loopCfg{kind: kindFutex, procs: 2, pinned: pinned})
			}
			b.ReportMetric(shm.nsPerChange(), "shm-ns/handoff")
			b.ReportMetric(fl.nsPerChange(), "flock-ns/handoff")
			b.ReportMetric(fx.nsPerChange(), "futex-ns/handoff")
			b.ReportMetric(shm.nsPerChange()/fx.nsPerChange(), "shm/futex")
			b.ReportMetric(shm.nsPerChange()/fl.nsPerChange(), "shm/flock")
			b.ReportMetric(shm.repeatPct(), "shm-repeat%")
			b.ReportMetric(fl.repeatPct(), "flock-repeat%")
			b.ReportMetric(shm.calib, "calib-2v1")
			if !pinned {
				b.ReportMetric(shm.lineNs, "line-ns") // 0: not measured
			}
			reportPinning(b, shm)
		})
	}
}
