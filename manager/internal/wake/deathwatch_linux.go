//go:build linux && !shmlocks_poll

package wake

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shmlocks/shmlocks/futex"
	"github.com/shmlocks/shmlocks/table"
)

// The death watch: the kernel tells every Manager when another agent's
// process dies, in any namespace, without polling.
//
// The sentinel: thread 0 of a Manager's watch is an OS thread locked to
// its goroutine for the Manager's life. It puts the agent's death word
// (agent record offset 80) on the kernel's robust futex list of that
// thread (set_robust_list: one entry, in this process's memory, whose
// futex_offset points into the shared mapping) and writes its TID, as
// seen in its own PID namespace, into the word. When the thread dies
// (SIGKILL, exit, exec), the kernel sets FUTEX_OWNER_DIED in the word and
// wakes one waiter (if FUTEX_WAITERS is set): shared futexes are keyed by
// the file, so the waiter may be in any PID or network namespace.
//
// The watchers: thread 0 and, for more than watchPerThread agents, more
// threads (one per 126 more, created as needed, at most MaxAgents/126)
// wait in futex_waitv on the death words of every other agent (FUTEX_WAITERS
// set first), the table's agents generation (a registration), thread 0 on
// the agent's cross-namespace bell, and a kick word of this process (close,
// more threads). Woken by a death, a watcher wakes every other waiter of
// that word (the kernel woke one) and hands the agent to the reaper, which
// reaps it once its lock byte is free. Every return rebuilds the set; a
// timeout (watchTimeout) bounds a missed registration, or a wake the kernel
// gave to a watcher killed before it passed it on.
//
// A death word is a hint: the proof is the agent's lock byte (live.go). A
// TID of another namespace that collides with ours is harmless: the kernel
// only ever processes the dying thread's own list.

const (
	futexWaiters   = 1 << 31
	futexOwnerDied = 1 << 30
	futex2SizeU32  = 0x02
	waitvMax       = 128
	watchFixed0    = 3 // kick, agents generation, cross-namespace bell
	watchFixed     = 2 // kick, agents generation
)

type robustHead struct {
	next    uintptr
	off     int64
	pending uintptr
}

type robustEntry struct{ next uintptr }

type futexWaitv struct {
	val   uint64
	uaddr uint64
	flags uint32
	_     uint32
}

type deathWatch struct {
	r       *Reaper
	kick    *uint32 // a futex word of this process's memory (never moved: heap)
	stopped atomic.Bool
	wg      sync.WaitGroup

	armed atomic.Bool // the last build of thread 0 watched death words

	mu      sync.Mutex
	threads int // watcher threads started (thread 0 included)

	head  *robustHead  // the sentinel's robust list (kept reachable while registered)
	entry *robustEntry //
}

func startDeathWatch(r *Reaper) *deathWatch {
	d := &deathWatch{r: r, kick: new(uint32), threads: 1}
	r.dw = d // before any thread of it can call back into r
	d.wg.Add(1)
	go d.sentinel()
	return d
}

// stop ends every watcher thread; the sentinel takes the death word off
// its robust list first.
func (d *deathWatch) stop() {
	d.stopped.Store(true)
	d.poke()
	d.wg.Wait()
}

func (d *deathWatch) poke() {
	atomic.AddUint32(d.kick, 1)
	futex.Wake(d.kick, 1<<30)
}

func (d *deathWatch) sentinel() {
	defer d.wg.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := d.r
	registered := false
	if r.h.Enter() {
		table.Guard(func() error {
			dw := r.a.DeathWord()
			d.head, d.entry = &robustHead{}, &robustEntry{}
			d.head.next = uintptr(unsafe.Pointer(d.entry))
			d.entry.next = uintptr(unsafe.Pointer(d.head))
			d.head.off = int64(uintptr(unsafe.Pointer(dw)) - uintptr(unsafe.Pointer(d.entry)))
			_, _, errno := unix.RawSyscall(unix.SYS_SET_ROBUST_LIST, uintptr(unsafe.Pointer(d.head)), unsafe.Sizeof(*d.head), 0)
			if errno == 0 {
				registered = true
				atomic.StoreUint32(dw, uint32(unix.Gettid()))
				r.t.BumpAgentsGen()
			}
			return nil
		})
		r.h.Leave()
	}
	d.watch(0)
	if registered {
		// Off the list before the record can be reused: an empty list.
		d.head.next = uintptr(unsafe.Pointer(d.head))
		unix.RawSyscall(unix.SYS_SET_ROBUST_LIST, uintptr(unsafe.Pointer(d.head)), unsafe.Sizeof(*d.head), 0)
		if r.h.Enter() {
			table.Guard(func() error { atomic.StoreUint32(r.a.DeathWord(), 0); return nil })
			r.h.Leave()
		}
	}
}

// watch is watcher thread n's loop.
func (d *deathWatch) watch(n int) {
	r := d.r
	var (
		ws     []futexWaitv
		lastX  uint32
		xbell  *uint32
		noWait bool
	)
	if n == 0 && r.h.Enter() {
		table.Guard(func() error { xbell = r.a.XBell(); lastX = atomic.LoadUint32(xbell); return nil })
		r.h.Leave()
	}
	for !d.stopped.Load() {
		if !r.h.Enter() {
			return
		}
		need := 0
		fault := table.Guard(func() error {
			ws, need = d.build(n, ws[:0], xbell)
			return nil
		})
		r.h.Leave()
		if fault != nil {
			r.h.NoteFault()
			return
		}
		if n == 0 {
			d.grow(need)
		}
		if noWait {
			sleepBriefly()
		} else if _, err := waitv(ws); err == unix.ENOSYS {
			noWait = true // a kernel before 5.16: look every few milliseconds
		}
		if d.stopped.Load() {
			return
		}
		if xbell != nil && r.h.Enter() {
			// A ring from another network namespace: scan here, at once
			// (a ring of our own doorbell would add a hop through the
			// netpoller and the bell loop's goroutine).
			if table.Guard(func() error {
				if x := atomic.LoadUint32(xbell); x != lastX {
					lastX = x
					r.h.Scan(false)
				}
				return nil
			}) != nil {
				r.h.NoteFault()
			}
			r.h.Leave()
		}
	}
}

// build lists the futex words thread n waits on: the kick, the agents
// generation, thread 0 the cross-namespace bell, then its share of the
// other agents' death words, with FUTEX_WAITERS set. Dead ones (the
// kernel marked them) go to the reaper instead. It returns how many
// threads the agents need.
func (d *deathWatch) build(n int, ws []futexWaitv, xbell *uint32) ([]futexWaitv, int) {
	r := d.r
	add := func(p *uint32, val uint32) {
		ws = append(ws, futexWaitv{val: uint64(val), uaddr: uint64(uintptr(unsafe.Pointer(p))), flags: futex2SizeU32})
	}
	add(d.kick, atomic.LoadUint32(d.kick))
	gen := r.t.AgentsGen()
	add(gen, atomic.LoadUint32(gen))
	if n == 0 && xbell != nil {
		add(xbell, atomic.LoadUint32(xbell))
	}
	// Only a Manager that waits (or watches) watches the others: the
	// kernel wakes one waiter of a death word, the one that needs it; a
	// kick arms the watch when a request starts waiting.
	interested := d.interested()
	if n == 0 {
		d.armed.Store(interested)
	}
	per0, per := waitvMax-watchFixed0, waitvMax-watchFixed
	k := 0 // position among the watched agents
	for idx := uint32(0); idx < uint32(r.t.Geometry().MaxAgents); idx++ {
		word := r.t.AgentWord(idx)
		if idx == r.a.Idx || word == 0 {
			continue
		}
		dp := r.t.DeathWord(idx)
		v := atomic.LoadUint32(dp)
		if v == 0 {
			continue // no sentinel (yet): the full pass covers it
		}
		if v&futexOwnerDied != 0 {
			// Handled whether or not this Manager waits: the kernel woke
			// one watcher, maybe this one, whose waits have ended since.
			if !d.r.handling(idx, word) {
				futex.Wake(dp, 1<<30) // wake the rest
				d.r.hint(idx, word)
			}
			continue
		}
		if !interested {
			continue
		}
		mine := k < per0 && n == 0 || k >= per0 && (k-per0)/per+1 == n
		k++
		if !mine {
			continue
		}
		if v&futexWaiters == 0 {
			if !atomic.CompareAndSwapUint32(dp, v, v|futexWaiters) {
				continue // changed: the next round looks again (a kick follows any death)
			}
			v |= futexWaiters
		}
		add(dp, v)
	}
	need := 1
	if k > per0 {
		need += (k - per0 + per - 1) / per
	}
	return ws, need
}

// interested reports whether the Manager has waiting requests or watches.
func (d *deathWatch) interested() bool { return d.r.h.Busy() }

// arm makes the watchers watch the death words, if they do not already.
func (d *deathWatch) arm() {
	if !d.armed.Load() {
		d.poke()
	}
}

// grow starts watcher threads until there are need.
func (d *deathWatch) grow(need int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for d.threads < need && !d.stopped.Load() {
		n := d.threads
		d.threads++
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			d.watch(n)
		}()
	}
}

// watchTimeout bounds a watcher's wait: a wake the kernel gave to a thread
// that was killed before passing it on is picked up by then.
const watchTimeout = time.Second

// waitv waits on ws (futex_waitv, Linux 5.16) up to watchTimeout; it returns
// the index of the word woken, or an error (EAGAIN: a value had changed,
// ETIMEDOUT, EINTR, ENOSYS).
func waitv(ws []futexWaitv) (int, error) {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	ts = unix.NsecToTimespec(unix.TimespecToNsec(ts) + int64(watchTimeout))
	r, _, errno := unix.Syscall6(unix.SYS_FUTEX_WAITV, uintptr(unsafe.Pointer(&ws[0])), uintptr(len(ws)), 0,
		uintptr(unsafe.Pointer(&ts)), unix.CLOCK_MONOTONIC, 0)
	runtime.KeepAlive(ws)
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

func sleepBriefly() { time.Sleep(5 * time.Millisecond) }
