// Package manager is the public API of shmlocks: the W3C Web Locks API for
// the processes of one machine.
//
// A lock table file is the Web Locks storage bucket; every Manager opened on
// it is an agent (a Web Locks client). Requests on a name are granted in FIFO
// order: exclusive ones alone, a run of shared ones together, and a shared
// request never overtakes a queued exclusive one. IfAvailable grants only
// without waiting; Steal takes the lock from its holders (their Lost channel
// closes and their Request returns ErrStolen) and goes first; cancelling the
// ctx of a waiting request withdraws it. When a process dies, the other
// agents release its locks and drop its requests within milliseconds. Every
// grant carries a fencing token that strictly increases per name for the
// life of the file.
//
//	Request/Acquire                Release                 Close
//	      │                           │                      │
//	      ▼                           ▼                      ▼
//	validate ─▶ table.Acquire ─┬─▶ granted ─▶ *Lock ─▶ table.Release ─▶ grants next, rings its agent
//	(closed,    (idle name:    │                                         if that request sleeps
//	 name,       one CAS, no   └─▶ queued ─▶ spin on own slot (50µs ─▶ park on a channel
//	 options,    latch; else   (at most 4 of   without a grant)            │
//	 ctx)        the bucket    ours at once;     ▲                         │
//	             latch)        else park)        │                         │
//	                                             └── bell loop ◀── doorbell ◀─┘ (granter's byte;
//	                                                   (netpoller)   our own sleepers: poked by slot,
//	                                                                 no byte, no bell: pokeSlot)
//	                                                 watcher: pidfds of the other agents → reap the dead
//
// Many goroutines of one process on one name form the local level of a
// two-level queue: the Manager keeps its requests per name in queue order,
// at most spinWindow of them spin, and the others are readied one grant
// ahead of their turn when the grant before theirs comes from another
// process, and at their grant when it comes from their own (the releaser,
// a goroutine of the same Manager, pokes them by slot: table.DeliverLocal,
// no syscall, no bell, no scan). When a process cannot spin all its
// waiting requests on a crowded table (more agents than its CPUs, at least
// GOMAXPROCS of its requests waiting), each grant of one of them readies
// the next sleeping one of the same Manager to spin (relayNext), and while
// more than GOMAXPROCS wait its spinners yield to the OS, not to its own
// goroutines (spinYields). The table's queue alone decides grants, so FIFO
// per request holds across processes (docs/design.md §4, "Many requests per
// process"). The local level is waitlist.go (with the waiters' free list),
// the wait itself (spin, park, relay, abort) wait.go, the one watch of a
// context's Done channel that many parked requests share donewatch.go, and
// what the bell loop does on a ring scan.go.
// The waiting policy (waitpolicy.go) decides only who burns a
// CPU: a process yields its CPU outside the queue (so that queues are made
// of running processes) only while the table has more agents than it has
// CPUs, or while none of its requests waits. With OpenOptions.HandOver
// (off by default), turns.go decides who runs after a release: a release
// that granted a sleeping request of its own Manager yields the P to it,
// and while a goroutine sits in such a yield every 16th release yields
// too, so that goroutines take turns at an emptied name (throughput for
// short sections; fairness per goroutine is then the Go scheduler's).
//
// A table created with OpenOptions.Fairness = Bounded(d) (fairness.go)
// trades arrival order for throughput, as sync.Mutex does: a request may
// take a free name ahead of queued ones while the oldest of them has
// waited less than d, after which the queue is served in order. Queued
// requests never overtake one another; the head of a queue, woken when a
// release leaves it the name, takes it itself (takeTurn, in wait.go's loops).
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
// Waiting goroutines do not hold OS threads: 5,000 waiters in one process
// use a handful. Every grant gets a Lock of its own, never reused, so that a
// stale handle (or ctx) can never release (or carry) a later grant: Request
// allocates its Lock together with fn's ctx (one 80-byte object, which fn
// may keep), and Acquire, inlined into its caller, lets the compiler put the
// Lock on the caller's stack when the handle does not outlive the caller's
// frame (no heap allocation), else it is one 64-byte heap object. Release
// retains nothing; Lost registers the Lock with the bell loop, so a caller
// that calls Lost gets a heap Lock.
//
// WithLock (and the ctx of Request's fn) makes a request on a lock the caller
// already holds a child grant instead of a self-deadlock, and an upgrade
// ErrWouldDeadlock. Children of one grant exclude each other as requests of
// the name do, and end (as a loss) before their parent's release gives the
// name up. See docs/multi-and-deadlock.md §3.
//
// Features built on the Manager are packages beside it, as singleflight
// sits beside sync: github.com/shmlocks/shmlocks/coalesce runs idempotent
// work once for all the callers of a key that overlap in time, in every
// process of the table, and shares its outcome. The Manager knows nothing of
// them: it admits their reserved lock names (starting with '-') and hands
// them a record store beside the table (internal/seam).
//
// Seeing the locks (docs/cli.md): OpenOptions.Stats makes a Manager count
// its requests by mode and outcome, their waits, steals, lost locks, reaps
// and repairs (Stats; off by default, so the request path only tests one
// field); OpenOptions.Logger receives reaps, latch takeovers, corrupt
// tables and steals (events.go); Locker adapts a name to sync.Locker.
//
// See docs/design.md for the file layout, the state
// machines, the memory-ordering argument, the invariants (Manager.Check runs
// the checker on a live table) and the failure model.
package manager
