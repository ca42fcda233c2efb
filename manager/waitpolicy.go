package manager

import (
	"runtime"
	"sync/atomic"
	"time"
)

// The waiting policy: when a request that finds its name taken gives its
// CPU away before it joins the queue, which queued requests spin and how,
// and which sleep at once. None of it decides who is granted: only the
// table's queue does, in order (docs/waiting.md). It decides who burns
// a CPU, and when.

const (
	// yieldEvery: a Manager that has run for this long since it last gave
	// up its CPU does so before its next request joins a queue (it checks
	// on every request that finds its name taken, and on every release of
	// a token that is a multiple of yieldCheckOps), never while it holds or
	// waits.
	yieldEvery    = 50 * time.Microsecond
	yieldCheckOps = 32
	// goschedEvery: a spinning request that need not yield between looks
	// (spinLooksOnly: a P free for the rest of its process, no request of
	// its Manager parked) gives its P to the process's other goroutines
	// this often, instead of after every look.
	goschedEvery = 10 * time.Microsecond
)

// machineView is what the waiting policy knows of the machine and of its
// own spinners; the machine is looked up at most every 100 ms (refreshView).
type machineView struct {
	spinners  atomic.Int32 // requests of ours in spinHead now
	lastYield atomic.Int64 // m.mono() when this Manager last got its CPU back from a yield
	cpuAt     atomic.Int64 // m.mono() when cpus, usable and agents were last looked up (0: never)
	cpus      atomic.Int32 // CPUs this process may run on (its affinity), as of cpuAt
	usable    atomic.Int32 // min(cpus, GOMAXPROCS), as of cpuAt
	procs     atomic.Int32 // GOMAXPROCS, as of cpuAt
	agents    atomic.Int32 // live agents on the table, as of cpuAt
	gaveP     atomic.Int32 // goroutines of ours in goschedTurn now: they gave their P away and wait for one

	spinYieldHook func() // tests: called instead of cpuYield by a spinner that gives its CPU to the OS
}

// yieldDue reports whether this Manager has kept its CPU for yieldEvery.
func (m *Manager) yieldDue() bool {
	return m.mono()-m.view.lastYield.Load() > int64(yieldEvery)
}

// yieldIfDue gives the CPU to another runnable process if this Manager has
// not done so for yieldEvery. The time is recorded when the CPU comes back:
// what counts is how long we have been running, not how long we waited.
func (m *Manager) yieldIfDue() {
	now := m.mono()
	last := m.view.lastYield.Load()
	if now-last <= int64(yieldEvery) || !m.view.lastYield.CompareAndSwap(last, now) {
		return // not due, or another goroutine of ours is yielding
	}
	m.osYield()
	if m.cfg.bounded && m.ownWaiting() {
		m.goschedTurn()
	}
	m.view.lastYield.Store(m.mono())
}

// goschedTurn gives the goroutine's P to the process's other goroutines
// (gosched). A Manager on a bounded table does so at every
// due yield (yieldIfDue, at most once per yieldEvery) while a request of
// its own waits (with none, at 2 x 1, it cost fairness between the two
// processes: max/min 2.2-4.1 against 1.3-1.4): a goroutine that
// takes the name again and again by the fast path never blocks, so until
// the runtime preempts it (10 ms) the goroutines of its process queued on
// its P wait, a latch waiter among them, and with it every request on the
// name's bucket (waits of 10-20 ms at 4 x 4 on 2 CPUs; 3.3-5 ms with this
// yield: docs/experiments.md). It is counted in gaveP until it runs again:
// the process's spinners then give it a P (spinChoice's ownFirst).
func (m *Manager) goschedTurn() {
	m.view.gaveP.Add(1)
	m.gosched()
	m.view.gaveP.Add(-1)
}

// gosched gives the goroutine's P to the process's other goroutines
// (runtime.Gosched; tests: yieldHook instead).
func (m *Manager) gosched() {
	if h := m.turn.yieldHook; h != nil {
		h()
		return
	}
	runtime.Gosched()
}

// yieldsOutsideQueue reports whether a Manager that is due to give its
// CPU away (yieldIfDue: after a release, or when a request finds its name
// taken, before it queues) should: while more processes use the table
// (agents) than this process can run on (cpus), or while none of its own
// requests waits (waiting: asleep or spinning).
//
// The yield is there so that the queue is made of processes that run: with
// more lockers than CPUs, a process that queues and is then preempted
// stalls every grant after its own. With no more lockers than CPUs they can
// all run at once, and a yield helps only the others' fast paths. But
// while a request of the yielding process waits in a queue, the yield
// stalls that request: on EEVDF a sched_yield forfeits the rest of the
// caller's time slice, and the request readied one grant ahead (a call
// within the process) waits in the yielding thread's run queue
// (docs/experiments.md has the measurements).
func yieldsOutsideQueue(agents, cpus int, waiting bool) bool {
	return agents > cpus || !waiting
}

// shouldYield reports whether this Manager is due to give its CPU away
// (yieldDue) and yieldsOutsideQueue says it should. Asked between a
// release and the next request, and by a request that found its name
// taken, before it queues (never while the caller holds or is queued);
// the caller then yields with yieldIfDue.
//
// The rule is asked first with the view of the machine as last refreshed,
// so that the common case of several goroutines of one process on a name
// (a request of ours waits, the table no more crowded than our CPUs) reads
// no clock. The view is refreshed every 100 ms by whoever reads the clock
// anyway: a spinning request, a park, a due yield.
func (m *Manager) shouldYield() bool {
	waiting := m.ownWaiting()
	if !yieldsOutsideQueue(int(m.view.agents.Load()), int(m.view.usable.Load()), waiting) {
		return false
	}
	now := m.mono()
	if now-m.view.lastYield.Load() <= int64(yieldEvery) { // not yieldDue
		return false
	}
	m.refreshView(now)
	return yieldsOutsideQueue(int(m.view.agents.Load()), int(m.view.usable.Load()), waiting)
}

// mayYield is shouldYield's rule with the view of the machine as last
// refreshed and no clock read: false means shouldYield would say no.
func (m *Manager) mayYield() bool {
	return yieldsOutsideQueue(int(m.view.agents.Load()), int(m.view.usable.Load()), m.ownWaiting())
}

// ownWaiting reports whether a request of this Manager waits (asleep or
// spinning).
func (m *Manager) ownWaiting() bool {
	return atomic.LoadUint32(m.life.a.Parked()) > 0 || m.view.spinners.Load() > 0
}

// onOneCPU reports whether this process may run on a single CPU only (then
// a spinning waiter keeps the holder it waits for off the CPU unless it
// yields), as last refreshed (refreshView: at Open, then at most every
// 100 ms by whoever reads the clock).
func (m *Manager) onOneCPU() bool {
	return m.view.cpus.Load() == 1
}

// refreshView looks up, at most every 100 ms, what the policy needs of the
// machine: the CPUs this process may use (its affinity; for shouldYield also
// bounded by GOMAXPROCS, which Go derives from the cgroup's CPU quota) and
// how many agents the table has (counted up to one more than those CPUs).
func (m *Manager) refreshView(now int64) {
	if at := m.view.cpuAt.Load(); at != 0 && now-at <= int64(100*time.Millisecond) {
		return
	}
	cpus, procs := cpusAllowed(), runtime.GOMAXPROCS(0)
	usable := min(cpus, procs)
	m.view.cpus.Store(int32(cpus))
	m.view.procs.Store(int32(procs))
	m.view.usable.Store(int32(usable))
	m.view.agents.Store(int32(m.life.t.LiveAgents(usable + 1))) // enough to tell agents > usable
	m.view.cpuAt.Store(now | 1)
}

// arrivalSpins reports whether a request that has just joined a queue may
// spin (if it also gets one of the spinWindow places), given how many of
// its Manager's requests sleep (parked) and spin (spinners) now, and
// whether the table has more agents than this process has CPUs (crowded).
// Behind spinWindow or more of its own waiting requests, an arrival sleeps
// at once: it is far from its turn (its spin would only keep the
// runtime's scheduler busy), and it is readied one grant ahead of its
// turn. With fewer waiting it spins even if one of them sleeps (a sibling
// that parked after a stall of its name): parking it too can leave every
// request asleep and each grant waiting for a wake-up. On a crowded table
// the CPUs are what the other processes' holders and next requests need,
// so an arrival spins only while at most one request of its Manager waits.
// docs/experiments.md has the measurements.
func arrivalSpins(parked uint32, spinners int32, crowded bool) bool {
	limit := int64(spinWindow)
	if crowded {
		limit = 2
	}
	return int64(parked)+int64(spinners) < limit
}

// arrivalMaySpin is arrivalSpins for this Manager now. It reads the view
// of the machine as last refreshed (every spin and every due yield refresh
// it; never refreshed: not crowded), so that an arrival reads no clock.
func (m *Manager) arrivalMaySpin() bool {
	return arrivalSpins(atomic.LoadUint32(m.life.a.Parked()), m.view.spinners.Load(), m.view.agents.Load() > m.view.usable.Load())
}

// spinLooksOnly reports whether a spinning request may look at its slot
// again and again without giving its P to the process's other goroutines
// (then it does so only every goschedEvery). That is safe while the
// Manager's spinning requests (spinners, this one included) are fewer than
// its process's Ps (procs, GOMAXPROCS), so that a P is free for any other
// goroutine, and while none of its requests is parked
// (a grant to one makes a goroutine runnable on the P of whoever reads the
// doorbell, often a spinner's). It is worth it because a Gosched with an
// idle P calls wakep, which wakes an idle thread of the process: on every
// look, a thread that competes for the CPUs with the holder and the next in
// line (docs/waiting.md). A process confined to one CPU keeps spinStep.
func spinLooksOnly(oneCPU bool, spinners, procs int32, parked uint32) bool {
	return !oneCPU && spinners < procs && parked == 0
}

// spinAction is what a spinning waiter does between two looks at its slot.
type spinAction int

const (
	spinGosched spinAction = iota // yield to this process's goroutines only
	spinOSYield                   // give the CPU to any runnable thread
	spinPark                      // stop spinning: park until rung
)

// spinStep is the waiting policy's step i. A waiter that may use several
// CPUs keeps its CPU (Gosched only) until its budget runs out, unless
// yields (spinYields): then it gives its CPU to the OS between two looks. A
// waiter confined to one CPU spins only to let the holder, which needs that
// very CPU, run once: it yields to the OS once and then parks. More yields
// do not help it and cost it its share of the CPU: on this kernel (EEVDF,
// Linux 6.18) a sched_yield forfeits the rest of the yielder's time slice,
// so a process that yields ten times per wait runs far less than one that
// sleeps (BenchmarkYieldShare; docs/waiting.md).
func spinStep(i int, oneCPU, yields bool) spinAction {
	switch {
	case !oneCPU && yields:
		return spinOSYield
	case !oneCPU:
		return spinGosched
	case i == 0:
		return spinGosched // our own goroutines first: the holder may be one
	case i == 1:
		return spinOSYield
	}
	return spinPark
}

// relays reports whether a request granted after it waited readies the
// earliest sleeping request of its Manager on the name to spin
// (relayNext), given how many of its Manager's requests still wait, asleep
// (parked) and spinning: on a crowded table (more agents than this
// process's usable CPUs) while they are at least as many as its Ps
// (procs), one of them asleep. That is when a process cannot spin all its
// waiting requests and the next grant of its own on the name, a few grants
// away, would otherwise wait for the doorbell's chain of thread wake-ups.
// With fewer, its requests spin on arrival anyway, and readying a sibling
// asleep after a stall only costs (docs/experiments.md).
func relays(crowded bool, parked uint32, spinners, procs int32) bool {
	return crowded && parked > 0 && int64(parked)+int64(spinners) >= int64(procs)
}

// spinYields reports whether a spinning request of a process that may use
// several CPUs gives its CPU to the OS between two looks (sched_yield)
// rather than to its own goroutines (Gosched): on a crowded table (more
// agents than this process's usable CPUs) while more of its Manager's
// requests wait (parked and spinners) than it has Ps (procs), some of them
// asleep. Then the queue holds requests whose processes must be scheduled
// before their grants complete (their requests sleep, since the process
// cannot spin them all), and a waiter that keeps its CPU with Gosched keeps
// them off it. With no more waiting requests than Ps every queued request
// spins on a CPU of its own process and the yields only cost
// (docs/experiments.md).
func spinYields(crowded bool, parked uint32, spinners, procs int32) bool {
	return crowded && parked > 0 && int64(parked)+int64(spinners) > int64(procs)
}

// spinsOffCPU reports whether a spinning request gives its CPU to the OS
// between every two looks at its slot, whatever its own Manager's waiting
// requests: on a table of bounded fairness that is crowded (more agents
// than this process's usable CPUs). There the name goes to whoever runs
// (a release leaves it free, and the releaser or another running request
// takes it again), so a head need not be on a CPU at the very moment of a
// release, while a spinner that keeps its CPU (Gosched) keeps the
// processes that hold or have just been granted the name off it: every
// hand-off the bound forces then waits for the spinner's time slice to end.
// Measured with one or two goroutines per process (8 x 1, 4 x 1, 8 x 2 on 2
// CPUs): grants crossing processes fell from 16-24% to 0.5-0.9% and grants
// per second rose 1.4-2.3x (docs/experiments.md). A strict FIFO table
// keeps spinYields' rule: there the head must be running when its turn
// comes, or every later grant waits.
func spinsOffCPU(bounded, crowded bool) bool {
	return bounded && crowded
}

// spinChoice is what a spinning request does between two looks, given the
// rules above: whether it only looks (spinLooksOnly), and if not, whether
// its step gives the CPU to the OS (spinYields, spinsOffCPU) or to its own
// goroutines (spinStep decides with it). ownFirst: before it gives the CPU
// to the OS it gives its P to its own goroutines (a spinner of a crowded
// bounded table while a request of its Manager sleeps, or while a goroutine
// of its Manager waits for a P after it gave its own away: gaveP,
// goschedTurn). A grant to a sleeping request readies its goroutine on the
// P of whoever pokes it, often this spinner's (the runtime's runnext), and
// a sched_yield keeps the P, so the granted request would wait for the
// spin to end. With it, 8 x 2 on 2 CPUs did 1.35x the grants per second;
// with it also when none sleeps, 8 x 1 lost 15-20% to the Gosched calls. A
// goroutine that gave its P at a due yield (a request about to queue, or a
// releaser) waited, while every P of its process was a spinner's, until the
// runtime preempted one (10 ms): those were the longest waits at 4 x 4 and
// 4 x 16 on 2 CPUs, 6.5-11 ms, and 3-5 ms with this rule
// (docs/experiments.md).
func spinChoice(oneCPU, bounded, crowded bool, spinners, procs int32, parked uint32, gaveP int32) (lookOnly, yields, ownFirst bool) {
	if spinsOffCPU(bounded, crowded) {
		return false, true, parked > 0 || gaveP > 0
	}
	return spinLooksOnly(oneCPU, spinners, procs, parked), spinYields(crowded, parked, spinners, procs), false
}

// turnPatience: a spinning head of a bounded table takes its turn
// (TakeTurn) only once the name has stayed free this long (no grant on it
// between two looks: table.TurnOpen's mark). A release leaves the name
// free, and the releaser, running, usually wants it again within a few
// hundred ns; a head that takes it first moves the name, with its cache
// lines, to another process. Measured at 2 x 1 on 2 CPUs (the head only
// looks between looks): grants crossing processes 21-23% -> 0.4-0.8%,
// 1.2-1.3x -> 3.0-3.5x flock (1 and 3 µs alike); on crowded tables (the
// head yields between looks) crossings 0.8% -> 0.3% and 4 x 16 and 4 x 4
// 10-30% more grants per second (docs/experiments.md). A head that waits
// for the name longer costs at most this, once per release that nobody
// follows, against a bound of milliseconds.
const turnPatience = 2 * time.Microsecond

// spinWindow bounds how many of a Manager's requests spin at once on
// arrival (and an arrival spins only while fewer than spinWindow of its
// Manager's requests wait: arrivalSpins); the others park at once, and each
// is readied when it becomes the head of its name's queue, one grant ahead
// of its turn (wakeAhead), or at its grant when its Manager's own request
// holds the name (a poke by slot within the process, not a syscall). More
// spinners than Ps make every spinner's Gosched a trip through the
// runtime's run queues and keep the holder, often a goroutine of the same
// process, off a P; 4 leaves the workloads with at most 3 waiting requests
// per process spinning as before (docs/waiting.md, docs/experiments.md).
const spinWindow = 4

// takeSpinPlace takes one of the spinWindow places of this Manager's
// spinning requests, if one is free.
func (m *Manager) takeSpinPlace() bool {
	for {
		n := m.view.spinners.Load()
		if n >= spinWindow {
			return false
		}
		if m.view.spinners.CompareAndSwap(n, n+1) {
			return true
		}
	}
}
