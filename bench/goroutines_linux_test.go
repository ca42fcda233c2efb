//go:build linux

package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/futex"
	"github.com/shmlocks/shmlocks/table"

	"github.com/shmlocks/shmlocks/manager"
)

// kindChan is the in-process FIFO baseline of BenchmarkGoroutines: a channel
// of capacity 1 as a mutex (lock: send; unlock: receive). Blocked senders
// are served in order, so it is a strict FIFO lock within one process.
const kindChan = "chan"

// kindTicket is the cross-process strict-FIFO baseline of
// BenchmarkGoroutines: a ticket lock on two words of the shared control
// file (take a number, wait until it is served), each waiter spinning with
// Gosched for ticketSpin and then sleeping on the served word's futex, the
// release waking every sleeper. It is the textbook FIFO lock, with the same
// spin-then-park policy as shmlocks and nothing else (no queue to show, no
// cancellation, no crash recovery): what strict FIFO per request costs on
// this machine, measured beside shmlocks and flock.
const kindTicket = "ticket"

// Control-file words of kindTicket (one cache line each).
const (
	ctlTicketNext  = 640 // uint32: the next number to hand out
	ctlTicketServe = 704 // uint32: the number being served; the futex word
	ctlTicketSleep = 768 // uint32: waiters asleep on ctlTicketServe
)

// ticketSpin is how long a ticket waiter spins before it sleeps: shmlocks'
// default SpinLimit.
const ticketSpin = 50 * time.Microsecond

// ticketLock takes a number and waits until it is served (until ctx ends).
func ticketLock(ctx context.Context, ctl []byte) error {
	next, serve, sleep := ctlWord32(ctl, ctlTicketNext), ctlWord32(ctl, ctlTicketServe), ctlWord32(ctl, ctlTicketSleep)
	my := atomic.AddUint32(next, 1) - 1
	start := time.Now()
	for i := 0; ; i++ {
		s := atomic.LoadUint32(serve)
		if s == my {
			return nil
		}
		if i&63 != 63 || time.Since(start) < ticketSpin {
			runtime.Gosched()
			continue
		}
		if err := ctx.Err(); err != nil {
			return err // the lock is wedged from now on: the benchmark fails anyway
		}
		// The releaser adds to serve and then reads sleep; we add to sleep
		// and then the kernel compares serve with s: one of us sees the other.
		atomic.AddUint32(sleep, 1)
		err := futex.Wait(serve, s, 10*time.Millisecond)
		atomic.AddUint32(sleep, ^uint32(0))
		if err != nil {
			return err
		}
	}
}

// ticketUnlock serves the next number and wakes the sleepers (each looks
// whether its number is up).
func ticketUnlock(ctl []byte) error {
	serve := ctlWord32(ctl, ctlTicketServe)
	atomic.AddUint32(serve, 1)
	if atomic.LoadUint32(ctlWord32(ctl, ctlTicketSleep)) > 0 {
		_, err := futex.Wake(serve, 0)
		return err
	}
	return nil
}

// goroutineRows are the processes x goroutines of BenchmarkGoroutines (issue
// 18): more goroutines per process than GOMAXPROCS is where grants land on
// parked goroutines; and one goroutine per process (issue 37).
var goroutineRows = []struct{ procs, goroutines int }{
	{1, 64}, {2, 4}, {4, 4}, {4, 16}, {8, 2}, {2, 1}, {4, 1}, {8, 1},
}

// benchBound is the bound of the Bounded rows of BenchmarkGoroutines.
const benchBound = time.Millisecond

// BenchmarkGoroutines: P child processes with G goroutines each loop
// greedily on one exclusive name (lock, empty critical section, unlock,
// again), shmlocks then flock(LOCK_EX) in the same iteration (flock with one
// descriptor per goroutine, since flock locks belong to the open file
// description), sampled over the window like BenchmarkContention. For 1 x 64
// also the in-process FIFO baseline: a channel of capacity 1 as the lock, 64
// goroutines of one process.
//
// The shmlocks loop runs twice: on a table of the default fairness (shm,
// strict FIFO) and on one created with Bounded(benchBound) (bd).
//
// Reported: total ops/s of each, the ratios shm/flock, bd/flock (and
// shm/chan), the ratio of the most to the least operations done by one
// goroutine (g-maxmin) and by one process (maxmin), the 99.9th percentile
// and the longest of the requests' waits in the window (wait-p999-us,
// wait-max-us: from the lock call to the grant); with several processes,
// how long a cache line takes to cross between two CPUs around the
// shmlocks loop (line-ns, lineNs). It first prints where it runs (machine:
// a line of the output, which docs/bench.sh puts in its summary).
func BenchmarkGoroutines(b *testing.B) {
	fmt.Println(machine())
	for _, row := range goroutineRows {
		b.Run(fmt.Sprintf("procs=%d/goroutines=%d", row.procs, row.goroutines), func(b *testing.B) {
			var shm, bd, fl, tk, ch, ho loopResult
			for i := 0; i < b.N; i++ {
				shm = runLoop(b, loopCfg{kind: kindShm, procs: row.procs, goroutines: row.goroutines})
				bd = runLoop(b, loopCfg{kind: kindShm, procs: row.procs, goroutines: row.goroutines, opts: &manager.OpenOptions{Fairness: manager.Bounded(benchBound)}})
				fl = runLoop(b, loopCfg{kind: kindFlock, procs: row.procs, goroutines: row.goroutines})
				tk = runLoop(b, loopCfg{kind: kindTicket, procs: row.procs, goroutines: row.goroutines})
				if row.procs == 1 {
					ch = runLoop(b, loopCfg{kind: kindChan, procs: 1, goroutines: row.goroutines})
					// The same loop with OpenOptions.HandOver (turns.go).
					ho = runLoop(b, loopCfg{kind: kindShm, procs: 1, goroutines: row.goroutines, opts: &manager.OpenOptions{HandOver: true}})
				}
			}
			b.ReportMetric(shm.opsPerSec(), "shm-ops/s")
			b.ReportMetric(fl.opsPerSec(), "flock-ops/s")
			b.ReportMetric(shm.opsPerSec()/fl.opsPerSec(), "shm/flock")
			b.ReportMetric(tk.opsPerSec(), "ticket-ops/s")
			b.ReportMetric(shm.opsPerSec()/tk.opsPerSec(), "shm/ticket")
			b.ReportMetric(tk.opsPerSec()/fl.opsPerSec(), "ticket/flock")
			b.ReportMetric(shm.gMaxMin(), "shm-g-maxmin")
			b.ReportMetric(fl.gMaxMin(), "flock-g-maxmin")
			b.ReportMetric(tk.gMaxMin(), "ticket-g-maxmin")
			b.ReportMetric(bd.opsPerSec(), "bd-ops/s")
			b.ReportMetric(bd.opsPerSec()/fl.opsPerSec(), "bd/flock")
			b.ReportMetric(bd.opsPerSec()/shm.opsPerSec(), "bd/shm")
			b.ReportMetric(bd.gMaxMin(), "bd-g-maxmin")
			for _, w := range []struct {
				name string
				r    loopResult
			}{{"shm", shm}, {"bd", bd}, {"flock", fl}} {
				b.ReportMetric(w.r.waitP999/1e3, w.name+"-wait-p999-us")
				b.ReportMetric(w.r.waitMax/1e3, w.name+"-wait-max-us")
			}
			if row.procs > 1 {
				b.ReportMetric(shm.maxMin(), "shm-maxmin")
				b.ReportMetric(fl.maxMin(), "flock-maxmin")
				b.ReportMetric(shm.xproc(), "shm-xproc%")
				b.ReportMetric(bd.xproc(), "bd-xproc%")
				b.ReportMetric(fl.xproc(), "flock-xproc%")
				b.ReportMetric(tk.xproc(), "ticket-xproc%")
				b.ReportMetric(shm.lineNs, "line-ns") // 0: not measured (bench.sh pairs the runs by index)
			} else {
				b.ReportMetric(ch.opsPerSec(), "chan-ops/s")
				b.ReportMetric(shm.opsPerSec()/ch.opsPerSec(), "shm/chan")
				b.ReportMetric(ch.gMaxMin(), "chan-g-maxmin")
				b.ReportMetric(ho.opsPerSec(), "ho-ops/s")
				b.ReportMetric(ho.opsPerSec()/fl.opsPerSec(), "ho/flock")
				b.ReportMetric(ho.opsPerSec()/ch.opsPerSec(), "ho/chan")
				b.ReportMetric(ho.gMaxMin(), "ho-g-maxmin")
			}
		})
	}
}

// xproc is the share of grants (%) whose previous holder was a goroutine
// of another process: where strict FIFO makes the next grant wait for
// another process to run.
func (r loopResult) xproc() float64 {
	if r.changes+r.repeats == 0 {
		return 0
	}
	return 100 * float64(r.changes) / float64(r.changes+r.repeats)
}

// gMaxMin is the ratio of the most to the least operations done by one
// goroutine (0 ops: the ops of the max, as maxMin).
func (r loopResult) gMaxMin() float64 {
	if len(r.gops) == 0 {
		return r.maxMin()
	}
	return spread(r.gops)
}

// benchLoopGoroutines is the child's loop with a.Goroutines goroutines
// (kinds shm, flock, chan; exclusive, greedy, no ping-pong): each counts its
// operations at ctlGOps + 64*(Index*Goroutines+g) and checks mutual
// exclusion under its own id, so the owner changes are between goroutines.
func benchLoopGoroutines(a benchArgs, ctl []byte, m *manager.Manager, _ int) (uint64, error) {
	ng := max(a.Goroutines, 1)
	if (a.Index+1)*ng > ctlMaxG {
		return 0, fmt.Errorf("%d goroutines in child %d: the control file has %d counters", ng, a.Index, ctlMaxG)
	}
	stop := ctlWord32(ctl, ctlStop)
	owner, inCS := ctlWord32(ctl, ctlOwner), ctlWord32(ctl, ctlInCS)
	changes, repeats, viol := ctlWord64(ctl, ctlChanges), ctlWord64(ctl, ctlRepeats), ctlWord64(ctl, ctlViol)
	critical := func(me uint32) {
		if !atomic.CompareAndSwapUint32(inCS, 0, me) {
			atomic.AddUint64(viol, 1)
		}
		// changes counts grants whose previous holder was a goroutine of
		// another process, repeats those within the process (xproc%).
		if prev := atomic.LoadUint32(owner); prev != 0 && (prev-1)/uint32(ng) == (me-1)/uint32(ng) {
			atomic.AddUint64(repeats, 1)
		} else {
			atomic.AddUint64(changes, 1)
		}
		atomic.StoreUint32(owner, me)
		spinWork(a.CSIters)
		atomic.CompareAndSwapUint32(inCS, me, 0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.Limit)
	defer cancel()
	mutex := make(chan struct{}, 1) // kindChan
	// Waits are timed from just before the lock call to the grant, on the
	// table's clock (MonoNow: the time-stamp counter where the kernel keeps
	// time with it), the same for every kind: one reading in the critical
	// section, recorded after the release (a histogram update while holding
	// would lengthen every section).
	var total atomic.Uint64
	errs := make(chan error, ng)
	var wg sync.WaitGroup
	for g := range ng {
		id := a.Index*ng + g
		ops, me := ctlWord64(ctl, ctlGOps+64*id), uint32(id+1)
		waits := newWaitRecorder(ctl, id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var n uint64
			defer func() { total.Add(n) }()
			switch a.Kind {
			case kindShm:
				var granted int64
				fn := func(context.Context, *manager.Lock) error {
					granted = table.MonoNow()
					critical(me)
					return nil
				}
				for atomic.LoadUint32(stop) == 0 {
					start := table.MonoNow()
					if err := m.Request(ctx, a.Name, manager.RequestOptions{}, fn); err != nil {
						errs <- err
						return
					}
					waits.record(granted - start)
					n++
					atomic.AddUint64(ops, 1)
				}
			case kindFlock:
				f, err := os.OpenFile(a.Flock, os.O_CREATE|os.O_RDWR, 0o600)
				if err != nil {
					errs <- err
					return
				}
				defer f.Close()
				fd := int(f.Fd())
				for atomic.LoadUint32(stop) == 0 {
					start := table.MonoNow()
					if err := syscall.Flock(fd, syscall.LOCK_EX); err != nil {
						errs <- err
						return
					}
					granted := table.MonoNow()
					critical(me)
					if err := syscall.Flock(fd, syscall.LOCK_UN); err != nil {
						errs <- err
						return
					}
					waits.record(granted - start)
					n++
					atomic.AddUint64(ops, 1)
				}
			case kindChan:
				for atomic.LoadUint32(stop) == 0 {
					start := table.MonoNow()
					mutex <- struct{}{}
					granted := table.MonoNow()
					critical(me)
					<-mutex
					waits.record(granted - start)
					n++
					atomic.AddUint64(ops, 1)
				}
			case kindTicket:
				for atomic.LoadUint32(stop) == 0 {
					start := table.MonoNow()
					if err := ticketLock(ctx, ctl); err != nil {
						errs <- err
						return
					}
					granted := table.MonoNow()
					critical(me)
					if err := ticketUnlock(ctl); err != nil {
						errs <- err
						return
					}
					waits.record(granted - start)
					n++
					atomic.AddUint64(ops, 1)
				}
			default:
				errs <- fmt.Errorf("unknown kind %q", a.Kind)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return total.Load(), <-errs
}

// TestBenchGoroutinesLoop runs BenchmarkGoroutines' loop briefly for each
// kind: every goroutine's count is reported, the per-process sums add up to
// the total, and no critical section overlapped another.
func TestBenchGoroutinesLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("seven child processes")
	}
	for _, c := range []struct {
		kind, name        string
		procs, goroutines int
		opts              *manager.OpenOptions
	}{{kindShm, "shm", 2, 3, nil}, {kindFlock, "flock", 2, 3, nil}, {kindTicket, "ticket", 2, 3, nil}, {kindChan, "chan", 1, 4, nil},
		{kindShm, "shm-handover", 1, 8, &manager.OpenOptions{HandOver: true}},
		{kindShm, "shm-bounded", 2, 3, &manager.OpenOptions{Fairness: manager.Bounded(benchBound)}},
		{kindShm, "shm-one-per-process", 2, 1, nil}} {
		t.Run(c.name, func(t *testing.T) {
			// A window in which every goroutine was served: 200 ms, longer
			// on a machine busy enough to leave one out (up to 3.2 s).
			var r loopResult
			for window := 200 * time.Millisecond; ; window *= 4 {
				r = runLoop(t, loopCfg{kind: c.kind, procs: c.procs, goroutines: c.goroutines, opts: c.opts,
					warmup: 50 * time.Millisecond, window: window})
				if !slices.Contains(r.gops, 0) || window >= 3200*time.Millisecond {
					break
				}
			}
			require.Len(t, r.gops, c.procs*c.goroutines)
			require.Len(t, r.ops, c.procs)
			var sum uint64
			for i, v := range r.gops {
				sum += v
				if c.kind != kindFlock { // flock may starve a goroutine for a window; FIFO locks serve each in turn
					require.Positive(t, v, "goroutine %d of %v", i, r.gops)
				}
			}
			require.Equal(t, r.total, sum)
			require.Positive(t, r.total)
			require.GreaterOrEqual(t, r.gMaxMin(), 1.0)
			require.Zero(t, r.viol)
			// The waits of the window: a median, a 99.9th percentile and a
			// longest wait, in order (the percentiles are bucket tops: the
			// 99.9th is at most the top of the longest wait's bucket, up to
			// 25% above it).
			require.Positive(t, r.waitP50)
			require.LessOrEqual(t, r.waitP50, r.waitP999)
			require.LessOrEqual(t, r.waitP999, benchWaitBucketTop(benchWaitBucket(int64(r.waitMax))))
		})
	}
}
