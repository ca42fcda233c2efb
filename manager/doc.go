// Package manager is the public API of shmlocks: the W3C Web Locks API for
// the processes of one machine.
//
// Open maps a lock table file (the Web Locks storage bucket; created with
// the geometry of OpenOptions when it does not exist) and registers the
// process as an agent, a Web Locks client. Request runs a function while it
// holds a lock on a name; Acquire is its handle form (the caller Releases
// the Lock); Query lists every agent's held and pending requests; Close
// releases what the Manager holds. OpenOptions sets the table's geometry
// and fairness when it is created, and this Manager's spinning, statistics,
// logger and deadlock delay; RequestOptions asks for a Shared lock,
// IfAvailable or Steal.
//
// Requests on a name are granted in FIFO order: exclusive ones alone, a run
// of shared ones together, and a shared request never overtakes a queued
// exclusive one. IfAvailable grants only without waiting; Steal takes the
// lock from its holders (their Lost channel closes and their Request
// returns ErrStolen) and goes first; cancelling the ctx of a waiting
// request withdraws it. When a process dies, the other agents release its
// locks and drop its requests within milliseconds. Every grant carries a
// fencing token that strictly increases per name for the life of the file.
// Errors are sentinels (ErrClosed, ErrNotSupported, ErrAborted, ...) to
// match with errors.Is.
//
// A table created with OpenOptions.Fairness = Bounded(d) (fairness.go)
// trades arrival order for throughput, as sync.Mutex does: a request may
// take a free name ahead of queued ones while the oldest of them has
// waited less than d, after which the queue is served in order (while the
// oldest has waited d/2 to d, a release first serves its own process's old
// requests). The head of a queue, woken when a release leaves it the name,
// takes it itself (takeTurn, in wait.go's loops).
//
// State, WaitUnlocked and Watch observe a name without requesting it: its
// holders and queue, the first instant a request would be granted, every
// change. They take no part in grants and are woken by whoever changes the
// name (docs/watch.md).
//
// AcquireAll and RequestAll take several names at once, all or none, in
// byte order (so they never wait for each other in a cycle), FIFO per name.
// A request that waits in a wait-for cycle with requests of other processes
// (or other goroutines) fails with ErrDeadlock after about
// OpenOptions.DeadlockDelay (1s): a hold counts as blocked by a wait when
// the wait is made by the task that holds it, i.e. with the ctx of
// Request's or RequestAll's callback, or by AcquireAll itself.
// WaitGraph (and shmlocks dump) shows whom each waiter waits for. See
// docs/multi-and-deadlock.md.
//
// WithLock (and the ctx of Request's fn) makes a request on a lock the caller
// already holds a child grant instead of a self-deadlock, and an upgrade
// ErrWouldDeadlock. Children of one grant exclude each other as requests of
// the name do, and end (as a loss) before their parent's release gives the
// name up. See docs/multi-and-deadlock.md §3.
//
// Every grant gets a Lock of its own, never reused, so that a stale handle
// (or ctx) can never release (or carry) a later grant. Acquire, inlined
// into its caller, lets the compiler keep the Lock on the caller's stack
// when the handle does not outlive the caller's frame; Request allocates
// its Lock together with fn's ctx, which fn may keep. Waiting goroutines do
// not hold OS threads: 5,000 waiters in one process use a handful.
//
// Seeing the locks (docs/cli.md): OpenOptions.Stats makes a Manager count
// its requests by mode and outcome, their waits, steals, lost locks, reaps
// and repairs (Stats); OpenOptions.Logger receives reaps, latch takeovers,
// corrupt tables and steals; Locker adapts a name to sync.Locker; Check
// runs the table's consistency checker.
//
// Features built on the Manager are packages beside it, as singleflight
// sits beside sync: github.com/shmlocks/shmlocks/coalesce runs idempotent
// work once for all the callers of a key that overlap in time, in every
// process of the table, and shares its outcome. The Manager knows nothing of
// them: it admits their reserved lock names (starting with '-') and hands
// them a record store beside the table (internal/seam).
//
// # Inside: how a waiting request is woken
//
//	Request/Acquire                Release                 Close
//	      │                           │                      │
//	      ▼                           ▼                      ▼
//	validate ─▶ table.Acquire ─┬─▶ granted ─▶ *Lock ─▶ table.Release ─▶ grants next; deliver:
//	(closed,    (idle name:    │                                         poke ours, ring others
//	 name,       one CAS, no   └─▶ queued ─▶ spin on own slot ──▶ park on its channel
//	 options,    latch; else                 (SpinLimit without      ▲        │
//	 ctx)        the bucket                   a grant)               │ poke   │
//	             latch)                                              │        │
//	                       doorbell ─▶ bell loop ─▶ scan ────────────┘        │
//	                       (a ring)    (netpoller)                            │
//	                       reaper: death words (kernel) ─▶ lock byte free ─▶ reap┘
//
// The words of the wake-up path, one concept each:
//
//   - spin: a queued request looks at its own slot word in a loop, on its
//     CPU, while its name's queue moves (wait.go; who may spin is the
//     waiting policy's, waitpolicy.go).
//   - park: a request that stops spinning sleeps on its own channel
//     (wait.go), registered with its Manager's waiters (waitlist.go).
//   - deliver: after a table operation, hand out the wake-ups it left
//     (table.Wakes): poke our own parked requests, ring the other agents.
//   - poke: wake one parked request of this Manager through its channel,
//     by slot; no syscall (scan.go, pokeSlot).
//   - ring: wake another agent: one byte to its doorbell, and, for an
//     agent of another network namespace, its cross-namespace bell word
//     (manager/internal/wake, bell_*.go).
//   - doorbell: an agent's receiving end of rings (a datagram socket on
//     Linux, a polled word elsewhere); the bell loop is the goroutine that
//     waits on it and runs a scan per ring.
//   - scan: look at every parked request and held lock of this Manager,
//     poke the requests whose slot changed, mark lost the locks stolen
//     (scan.go).
//   - ready: poke a parked request so that it spins again before its
//     grant: one grant ahead of its turn (wake-ahead, from a scan) or at
//     the grant of the request before it of the same Manager (relay,
//     relayNext, on a crowded table).
//   - kick: arm the reaper, the death watcher: while the Manager waits its
//     threads wait on the other agents' death words (manager/internal/wake).
//
// The turn rules (turns.go, OpenOptions.HandOver) decide who runs after a
// release; the table's queue alone decides grants, so FIFO per request
// holds across processes. docs/waiting.md ("Who wakes whom") gives the
// protocol, and the file layout, state machines, memory-ordering argument,
// invariants and failure model are in the rest of docs/design.md.
package manager
