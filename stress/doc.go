// Package stress is the workload generator and independent checker behind
// "shmlocks stress".
//
// A supervisor (Run) starts worker processes (re-executions of a binary that
// calls WorkerMain when WorkerEnv is set). Each worker makes requests from
// several goroutines through the manager package, or through flock(2) for
// comparison, with a configurable mix of modes and options and a hold-time
// distribution.
//
// # Independent checks
//
// The checkers do not use the lock code. They share a second memory-mapped
// file (the check region, next to the table) in which every goroutine
// publishes what it holds and what it waits for, and per-name evidence:
//
//   - Occupancy. After a grant a goroutine publishes its hold, then scans
//     every live worker's records for a conflicting holder of the same name
//     (exclusive with anything, shared with exclusive). With sequentially
//     consistent atomics, of two overlapping holders at least one sees the
//     other. Records of processes the supervisor killed are ignored (it
//     marks the victim before the SIGKILL, so before the table can reap it),
//     and an overlap is excused when a steal grant lies between the two
//     tokens (the older holder was stolen from and may still be running).
//     Per-holder records rather than shared reader/writer counters mean that
//     a SIGKILL at any instruction leaves nothing to undo.
//   - A non-atomic counter per name: read at the start of an exclusive
//     section, checked unchanged and written +1 at its end. It must not
//     change during a section (unless a steal explains it), and at the end it
//     must equal the exclusive grants minus the sections that learnt they
//     were stolen and skipped their write. It may fall short by at most
//     kills + steals (a killed holder may die before it writes; a stolen-from
//     holder preempted between its fence check and its write may overwrite
//     one increment); without kills and steals it must be exact.
//   - Fencing tokens: an exclusive grant's token must exceed every token
//     recorded before it on the name, a shared grant's every exclusive token
//     (shared grants made together may be recorded out of order), unless the
//     holder was stolen from before it looked.
//   - A lock reported lost at release (or stolen before its grant was seen)
//     must be explained by a recorded steal (the victim waits up to a second
//     for the stealer to record it; with kills in the run a stealer may have
//     died before recording, so a missing record is then not reported).
//   - Watchdog (supervisor): a request waiting longer than Config.Stuck on a
//     name that no live process holds and on which nothing was granted or
//     released for Config.Stuck is stuck; a request still waiting
//     Config.Stuck after its deadline ignored it; workers that do not stop
//     within Config.Grace of the end hang.
//   - At the end the table's own checker runs (manager.Open, Check) and
//     Query must be empty: every dead worker was reaped. For flock every lock
//     file must be lockable.
//
// FIFO order is sampled, not checked: a goroutine takes a ticket just before
// its request enters the lock, and a process can be descheduled between the
// two, so "a waiter whose ticket is older by more than 5ms still waits when
// a later one is granted" is reported as a statistic (fifo.overtaken).
//
// # Measurements
//
// Acquire wait (request call to grant) per mode; handoff (a releaser that
// saw waiters stamps CLOCK_MONOTONIC in the region before it releases, the
// first grantee that was already waiting takes now minus the stamp); reap
// latency (the supervisor arms a watch on each name a victim holds
// exclusively just before the SIGKILL; the first grant after it, if the
// victim's hold record is still there, stamps its time). Histograms are
// HdrHistograms recorded in the workers and merged by the supervisor from
// result files the workers rewrite every 250ms, so a killed worker loses at
// most its last 250ms. Request counts live in the region and are exact.
//
// Fairness: the requests made per process position (fairness.perProcess,
// max/min) and the grants obtained per requesting goroutine
// (fairness.goroutine.grants[position][goroutine], max/min), each counted in
// the region, so a --chaos replacement continues its victim's counts. With
// several goroutines per process the second is the one that shows whether a
// process's goroutines share its grants (a FIFO lock serves each request in
// turn, so with every goroutine always requesting the counts stay close).
package stress
