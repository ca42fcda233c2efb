package manager

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shmlocks/shmlocks/table"
)

// OpenOptions configure Open. The geometry fields are used only when the file
// is created; an existing file keeps its own. Zero fields take the defaults.
type OpenOptions struct {
	MaxResources int         // distinct names held or queued at once (default 4096)
	MaxRequests  int         // held + pending requests at once, all agents together (default 32768)
	MaxAgents    int         // open Managers at once, all processes together (default 256)
	MaxNameLen   int         // bytes (default 256)
	FileMode     os.FileMode // permission bits when created (default 0600)

	// SpinLimit bounds how long a queued request spins on its slot while
	// no grant is made on its name, before it parks (default 50µs;
	// negative: never spin, never yield the CPU before queueing, and no
	// HandOver).
	SpinLimit time.Duration

	// HandOver trades fairness per goroutine for throughput when many
	// goroutines of this process contend for a name with short sections
	// (turns.go, docs/design.md §4). A release that grants a sleeping
	// request of this Manager yields the goroutine's P to it, and while a
	// goroutine sits in such a yield every 16th release of the Manager
	// yields too, so that goroutines take turns at a name their hand-overs
	// emptied. FIFO per request is unchanged (a yield comes after a
	// release, before the caller's next request), but goroutines waiting
	// in Go's run queue have not asked yet, so fairness per goroutine is
	// the Go scheduler's: 64 goroutines on 2 Ps, empty sections, about
	// 10x the grants per second, max/min grants per goroutine 1.01-1.03;
	// 1 µs sections 1.6x, max/min 1.1-4.2 (off: 1.00-1.02). A queue of
	// goroutines that leave after one grant drains about 35% slower. It
	// does nothing while the table has more agents than the process has
	// usable CPUs. Off by default.
	HandOver bool

	// Fairness is the order in which the table grants a name's requests:
	// FIFO (the zero value: strict arrival order, Web Locks) or Bounded(d)
	// (a request may take a free name ahead of queued ones while the oldest
	// of them has waited less than d). Used only when the file is created;
	// an existing file keeps its own (Manager.Fairness). See fairness.go.
	Fairness Fairness

	// Stats makes the Manager count its requests by mode and outcome, their
	// time queued, steals, lost locks, reaps and repairs (see Stats): an
	// atomic add per request, and two clock reads and three adds more for a
	// request that queues. Off by default: the request paths then test one
	// field and count nothing.
	Stats bool
	// Logger receives the events an operator cares about: a dead agent
	// reaped, a bucket latch taken over, a corrupt table, a steal (both
	// sides); see events.go. nil: discard.
	Logger *slog.Logger
	// DeadlockDelay is how long a request waits before the wait-for graph
	// is checked for a cycle through it, and then again every
	// DeadlockDelay while it waits (default 1s, like PostgreSQL's
	// deadlock_timeout; negative: this Manager never checks, and its
	// requests are never chosen as victims; they still mark what their
	// task holds, so that other Managers and shmlocks dump see cycles
	// through them). See docs/multi-and-deadlock.md.
	DeadlockDelay time.Duration
}

// Defaults used for zero OpenOptions fields.
var (
	DefaultMaxResources = table.DefaultGeometry.MaxResources
	DefaultMaxRequests  = table.DefaultGeometry.MaxRequests
	DefaultMaxAgents    = table.DefaultGeometry.MaxAgents
	DefaultMaxNameLen   = table.DefaultGeometry.MaxNameLen
)

const (
	defaultSpin = 50 * time.Microsecond
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

// Manager is one agent of a lock table: the handle through which a process
// requests, holds and releases locks. It is safe for concurrent use.
type Manager struct {
	t        *table.Table
	a        *table.Agent
	be       Backend // nil: the table; else the locks live in be (NewBackendManager)
	maxName  int     // MaxNameLen of the table or the backend
	path     string
	clientID string
	spin     time.Duration
	handOver bool          // OpenOptions.HandOver, and spinning allowed (turns.go)
	bounded  bool          // the table's fairness is Bounded (fairness.go)
	deadlock time.Duration // OpenOptions.DeadlockDelay; <= 0: no checks
	dl       deadlockState // this Manager's deadlock checks (deadlock.go)

	closed   atomic.Bool
	inflight atomic.Int64  // table operations in progress (Close waits for them)
	closing  chan struct{} // closed by Close: waiters give up
	faulted  atomic.Bool   // a read of the mapping faulted (file truncated): inflight may be off

	held registry  // our granted locks whose loss is watched, by slot
	obs  observers // our watches of names (WaitUnlocked, Watch), by slot: observe.go

	mu          sync.Mutex
	nwait       int                            // our parked requests (in queues)
	bySlot      slotIndex[waiter]              // the same by slot, read without mu (pokeSlot)
	queues      map[string]*waitList           // the same, per name in queue order
	freeWaiters *waiter                        // removed waiters kept for reuse, linked by next (waitlist.go)
	nfree       int                            // waiters on freeWaiters
	dones       map[<-chan struct{}]*doneWatch // watched Done channels of parked requests (donewatch.go)
	lastDone    <-chan struct{}                // the Done channel of the last park that did not register
	nidle       int                            // registrations in dones with no park
	doneIdleSeq uint64                         // orders idle registrations (oldest stopped first)

	bell      *doorbell
	watch     *watcher
	ringFn    func(agent uint32, nonce uint64)
	pokeFn    func(slot uint32) // pokeSlot
	faultFn   func()            // m.noteFault, bound once (EndGuard's onFault)
	stopOnce  sync.Once
	bg        sync.WaitGroup
	lastBell  atomic.Uint32
	spinners  atomic.Int32  // requests of ours in spinHead now
	loops     atomic.Uint64 // bell-loop rounds done (tests wait for one after a change)
	lastStl   atomic.Uint32
	lastInWay atomic.Int64 // unix ns of the last reapHolders look
	lastYield atomic.Int64 // m.mono() when this Manager last got its CPU back from a yield
	cpuAt     atomic.Int64 // m.mono() when cpus, usable and agents were last looked up (0: never)
	cpus      atomic.Int32 // CPUs this process may run on (its affinity), as of cpuAt
	usable    atomic.Int32 // min(cpus, GOMAXPROCS), as of cpuAt
	procs     atomic.Int32 // GOMAXPROCS, as of cpuAt
	agents    atomic.Int32 // live agents on the table, as of cpuAt (waitpolicy.go)
	turnState              // who yields the P at a release (turns.go)

	stats *stats   // nil unless OpenOptions.Stats; written once by Open
	log   eventLog // OpenOptions.Logger (events.go)
}

// Open maps the lock table at path, creating it with the geometry in opts
// when it does not exist, and registers the calling process as a new agent.
// opts may be nil (defaults). Open also reaps agents whose process is gone,
// and resets the agents of a table that outlived a reboot.
func Open(path string, opts *OpenOptions) (*Manager, error) {
	var o OpenOptions
	if opts != nil {
		o = *opts
	}
	g := table.Geometry{
		MaxResources: orDefault(o.MaxResources, DefaultMaxResources),
		MaxRequests:  orDefault(o.MaxRequests, DefaultMaxRequests),
		MaxAgents:    orDefault(o.MaxAgents, DefaultMaxAgents),
		MaxNameLen:   orDefault(o.MaxNameLen, DefaultMaxNameLen),
	}
	spin := o.SpinLimit
	if spin == 0 {
		spin = defaultSpin
	}
	deadlock := o.DeadlockDelay
	if deadlock == 0 {
		deadlock = DefaultDeadlockDelay
	}
	if err := checkTablePath(path); err != nil { // path.go
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := o.Fairness.validate(); err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	t, _, err := table.OpenFair(path, g, o.FileMode, o.Fairness.tableBound())
	if err != nil {
		(&eventLog{l: o.Logger, path: path}).corrupt(nil, "open", err)
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := checkOpenedTable(path, t); err != nil {
		t.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	var nb [8]byte
	if _, err := rand.Read(nb[:]); err != nil {
		t.Close()
		return nil, err
	}
	nonce := binary.NativeEndian.Uint64(nb[:]) | 1
	m := &Manager{
		t:        t,
		maxName:  t.Geometry().MaxNameLen,
		path:     path,
		spin:     spin,
		handOver: o.HandOver && spin > 0,
		bounded:  t.Bound() > 0,
		deadlock: deadlock,
		closing:  make(chan struct{}),
		held:     newRegistry(t.Slots()),
		bySlot:   newSlotIndex[waiter](t.Slots()),
		queues:   map[string]*waitList{},
		dones:    map[<-chan struct{}]*doneWatch{},
		clientID: ClientIDOf(nonce),
	}
	m.log.l, m.log.path = o.Logger, path
	if m.log.l == nil {
		m.log.l = discard
	}
	if o.Stats {
		m.stats = new(stats)
	}
	t.SetEventHook(m.tableEvent)
	m.bell, err = newDoorbell(t.Nonce(), nonce)
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("open %s: doorbell: %w", path, err)
	}
	m.ringFn = m.ring
	m.pokeFn = m.pokeSlot
	m.faultFn = m.noteFault
	t.SetRinger(m.ringFn)
	err = table.Guard(func() error {
		m.a, err = t.Register(table.Self(), nonce)
		if err != nil {
			return err
		}
		m.a.InFlight = &m.inflight
		var w table.Wakes
		_, err = t.ReapDead(m.a, &w)
		t.Deliver(&w, m.ringFn)
		m.refreshView(m.mono()) // the waiting policy's first view of the machine (waitpolicy.go)
		if err == nil && t.StaleBoot() {
			t.MarkBoot()
		}
		return err
	})
	if err != nil {
		m.noteErr("open", err)
		m.bell.close()
		t.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	m.watch = newWatcher(m)
	m.bg.Add(1)
	go m.bellLoop()
	runtime.AddCleanup(m, func(t *table.Table) { t.Close() }, t)
	return m, nil
}

// errNeverOpened is what every method of a zero Manager (not made by Open
// or NewBackendManager) returns.
var errNeverOpened = fmt.Errorf("%w: the Manager was never opened (make one with Open)", ErrClosed)

// unopened reports whether m is a zero Manager.
func (m *Manager) unopened() bool { return m.t == nil && m.be == nil }

func orDefault(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

// ClientID is an opaque identifier, unique per Manager and stable for its life.
func (m *Manager) ClientID() string { return m.clientID }

// Path returns the table file's path.
func (m *Manager) Path() string { return m.path }

// Table exposes the underlying table (inspection and tests).
func (m *Manager) Table() *table.Table { return m.t }

// Agent exposes this Manager's agent record (inspection and tests).
func (m *Manager) Agent() *table.Agent { return m.a }

// Check runs the table's consistency checker on the live table.
func (m *Manager) Check() error {
	if m.unopened() {
		return errNeverOpened
	}
	if !m.enter() {
		return ErrClosed
	}
	if m.be != nil {
		m.leave()
		return nil
	}
	defer m.leave()
	return m.t.Check(m.a)
}

// enter marks a table operation in progress; false if the Manager is closed.
func (m *Manager) enter() bool {
	m.inflight.Add(1)
	if m.closed.Load() {
		m.inflight.Add(-1)
		return false
	}
	return true
}

func (m *Manager) leave() { m.inflight.Add(-1) }

// Close releases every lock the Manager holds (their Lost channels close and
// a later Release returns an error), aborts its pending requests with
// ErrClosed, deregisters the agent and unmaps the table. A second Close
// returns nil. Close of a zero Manager (never opened) returns an error
// matching ErrClosed.
func (m *Manager) Close() error {
	if m.unopened() {
		return errNeverOpened
	}
	if m.closed.Swap(true) {
		return nil
	}
	if m.be != nil {
		return m.closeBackend()
	}
	close(m.closing)
	// Wake every parked request: it sees closed at its next look and
	// returns ErrClosed. (A parked request does not wait on closing: a
	// channel every parked goroutine selects on is a lock they all take
	// at every park and wake-up, 6% of the CPU with 64 of them.)
	m.pokeAll()
	m.mu.Lock()
	m.stopDones() // a park after this one sees closed and does not register
	m.mu.Unlock()
	// A fault on the mapping (the file truncated under us) may have
	// unwound an operation between enter and leave: the count is then not
	// to be trusted, so the wait is bounded like the one below.
	for start := time.Now(); m.inflight.Load() != 0; {
		if m.faulted.Load() && time.Since(start) > time.Second {
			break
		}
		time.Sleep(10 * time.Microsecond)
	}
	// Parked requests were poked: each sees closed, takes itself off the
	// agent's parked count and leaves. Wait for them (bounded) before the
	// record is freed: a decrement after that would land in the record of
	// the next Manager to register there, whose count would read one low
	// (a grant to its parked request would then skip the doorbell).
	pollUntil(time.Second, func() bool { return m.parkedWaiters() == 0 })
	// The uncontended path of acquire is not counted in flight: wait until
	// no request of ours is between claiming its slot and its outcome (a
	// few hundred nanoseconds; bounded in case the slot words are garbage).
	// A fast acquire claims nothing: it looks at closed after its CAS and
	// gives the lock back itself if it finds it set, while Deregister
	// releases every fast hold it finds (see acquire).
	pollUntil(time.Second, func() bool { return m.t.ClaimsSettled(m.a) })
	m.watch.stop()
	m.bell.close()
	m.bg.Wait()
	// The watched locks are lost before the table lets anyone else have
	// their names: their Lost channels close, fn's ctxs are cancelled and
	// their child grants end first.
	m.held.takeAll(func(l *Lock) { l.markLost(l.state.Load(), lockClosed) })
	var w table.Wakes
	err := table.Guard(func() error {
		err := m.t.Deregister(m.a, &w)
		m.deliver(&w)
		return err
	})
	// The descriptor is closed now; the mapping stays until the Manager is
	// garbage (a cleanup registered by Open unmaps it), so that a Release
	// racing with this Close reads valid memory: it finds its slot freed by
	// the deregistration and does nothing.
	if cerr := m.t.CloseFile(); err == nil {
		err = cerr
	}
	return err
}

// pollUntil looks at done every 10 µs until it says true or bound has passed.
func pollUntil(bound time.Duration, done func() bool) {
	for deadline := time.Now().Add(bound); !done() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Microsecond)
	}
}

// parkedWaiters returns how many requests of ours are registered as parked.
func (m *Manager) parkedWaiters() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.nwait
}

// noteFault records that a read of the mapping faulted (the file was
// truncated under us): the in-flight count may be off (Close stops trusting
// it), and every parked request is poked, to meet the fault in its own
// guarded goroutine and return ErrCorrupt.
func (m *Manager) noteFault() {
	m.faulted.Store(true)
	m.noteErr("read", fmt.Errorf("%w: a read of the mapping faulted (file truncated under us?)", ErrCorrupt))
	m.pokeAll()
}

// ring is called by Deliver for an agent that must be woken.
func (m *Manager) ring(agent uint32, nonce uint64) {
	if m.a != nil && agent == m.a.Idx {
		m.scan(false)
		return
	}
	m.bell.ring(nonce)
}

// deliver delivers w: a sleeping request of this Manager that was granted
// or made the head is poked directly (pokeSlot), every other agent rung.
// It returns how many requests of ours it poked.
func (m *Manager) deliver(w *table.Wakes) int {
	return m.t.DeliverLocal(w, m.a.Idx, m.pokeFn, m.ringFn)
}

// pokeSlot pokes the parked waiter of ours at slot s, if any. A waiter
// is indexed before it sets its park mark, and a poke only makes it look
// at its slot again, so a poke for a waiter that has just left (or for
// the next request parked at the same slot) costs one look.
func (m *Manager) pokeSlot(s uint32) {
	if w := m.bySlot.load(s); w != nil {
		w.poke()
	}
}

// reap reaps every dead agent, delivering the wakes.
func (m *Manager) reap() error {
	if !m.enter() {
		return ErrClosed
	}
	defer m.leave()
	err := table.Guard(func() error {
		var w table.Wakes
		n, err := m.t.ReapDead(m.a, &w)
		m.deliver(&w)
		if n > 0 {
			m.scanWaiters(true) // a dead agent may have granted to us and died before ringing
		}
		return err
	})
	m.noteErr("reap", err)
	return err
}

// reapOne reaps agent idx if it is dead.
func (m *Manager) reapOne(idx uint32) {
	m.reapAgent(idx, func() (bool, uint64) { return m.t.AgentDeadWord(idx) })
}

// reapExited reaps agent idx, whose process a pidfd has reported exited
// while the record held word (the pidfd was opened on the process the record
// named, see watcher.refresh). No liveness check is needed: reading
// /proc/PID/stat of a process in the middle of its exit took 40-70 µs, the
// largest part of the time from a holder's death to the next grant. Reap is
// keyed on word, so a record reused meanwhile is left alone.
func (m *Manager) reapExited(idx uint32, word uint64) {
	m.reapAgent(idx, func() (bool, uint64) { return true, word })
}

// reapAgent reaps agent idx if dead says it is dead, with the record's word.
func (m *Manager) reapAgent(idx uint32, dead func() (bool, uint64)) {
	if !m.enter() {
		return
	}
	defer m.leave()
	table.Guard(func() error {
		isDead, word := dead()
		if !isDead {
			return nil
		}
		var w table.Wakes
		err := m.t.Reap(m.a, idx, word, &w)
		m.deliver(&w)
		// The dead agent may have granted to us and died before ringing.
		m.scanWaiters(true)
		return err
	})
}
