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
//	(closed,    (idle name:    │
//	 name,       one CAS, no   └─▶ queued ─▶ spin on own slot (50µs ─▶ park on a channel
//	 options,    latch; else   without a grant)  ▲                            │
//	 ctx)        the bucket                      │                            │
//	             latch)                          │                            │
//	                                             └── bell loop ◀── doorbell ◀─┘ (granter's byte)
//	                                                   (netpoller)   watcher: pidfds of the other
//	                                                                 agents → reap the dead
//
// Waiting goroutines do not hold OS threads: 5,000 waiters in one process
// use a handful. See docs/design.md for the file layout, the state
// machines, the memory-ordering argument, the invariants (Manager.Check runs
// the checker on a live table) and the failure model.
package manager
