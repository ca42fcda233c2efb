// Package stress is the workload generator and independent checker behind
// "shmlocks stress".
//
// A supervisor (Run) starts worker processes (re-executions of a binary that
// calls WorkerMain when WorkerEnv is set). Each worker makes requests from
// several goroutines through the manager package, or through flock(2) for
// comparison, with a configurable mix of modes and options and a hold-time
// distribution.
//
// # Features
//
// Each process position runs one feature (Config.Features, position p the
// feature p modulo their number), so that the lock is checked as users
// hold it, not only through Acquire:
//
//   - plain: Acquire/Release of one name, with the mix of modes,
//     IfAvailable, Steal and deadlines below;
//   - exec: goroutines that run "shmlocks exec" wrappers one after the
//     other; each wrapper's command is this binary again, which checks in
//     as the holder under its own pid while it runs (10-40 ms), so the
//     checkers see the command's occupancy, not the wrapper's;
//   - child: Requests whose fn hands its ctx to one or two goroutines that
//     each request the name with it (child grants: exclusive children of one
//     grant one at a time, shared ones together), half of them making a
//     nested request from their own fn (a child of the child, granted at
//     once), and some keeping fn's ctx to request the name again after
//     Request returned (it carries nothing by then);
//   - coalesce: Coalesce calls on the lock names as keys; fn holds the
//     key's flight entry and returns a checksummed result naming its key
//     and its times (one flight in twenty fails, with an error naming its
//     key);
//   - all: AcquireAll or RequestAll of two or three names.
//
// With Config.Chaos the supervisor sends its SIGKILLs to the feature
// killed least so far that has a victim at that moment, where the feature
// is most fragile: a plain worker that holds a lock, a child worker inside a
// child grant, a Coalesce worker whose fn leads, an AcquireAll worker that
// holds two names or more; for exec, a command that has checked in: its
// wrapper (six in ten), the command itself (two in ten) or the wrapper's
// process group (two in ten). A killed worker is replaced at once; so is a
// worker that dies on its own (a violation all the same).
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
//     and so are those of a process found dead when the conflict is seen
//     (a worker that died on its own, which is reported as such), and an overlap is excused when a steal grant lies between the two
//     tokens (the older holder was stolen from and may still be running).
//     Per-holder records rather than shared reader/writer counters mean that
//     a SIGKILL at any instruction leaves nothing to undo. Every hold is a
//     record: each name of an AcquireAll, each child grant (with the ids of
//     its parent and grandparent: a hold and its ancestors are inside
//     together by design, anyone else is checked as any grant, so children
//     of one grant must exclude each other and a child still inside when the
//     name is granted elsewhere is caught), each exec command (under its own
//     pid: its record counts while that process runs, whatever happened to
//     its wrapper, and not once it is dead or being killed; without
//     SHMLOCKS_TOKEN a steal after its wrapper started excuses it). The
//     scans visit the current worker of every position, not every slot
//     ever used, so thousands of kills do not slow them.
//   - Children of one grant also keep a non-atomic counter of their
//     exclusive sections (as the per-name counter below); a nested request
//     made with a child's ctx must be granted within Config.Stuck.
//   - Coalesce: fn holds its key's flight entry, checked as an exclusive
//     hold (two leaders of one key at once), with a counter per key; every
//     caller checks what it got: a whole result (length and checksum) of its
//     own key from a flight that did not end more than Config.Stuck before
//     it arrived, or an error naming its own key.
//   - A non-atomic counter per name: read at the start of an exclusive
//     section, checked unchanged and written +1 at its end. It must not
//     change during a section (unless a steal explains it), and at the end it
//     must equal the exclusive grants minus the sections that learnt they
//     were stolen and skipped their write. It may fall short by at most
//     kills + workers that died + steals (a killed holder may die before it writes; a stolen-from
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
//     released for Config.Stuck is stuck (an AcquireAll: every name it
//     waits for; an exec request, whose wait includes starting its wrapper
//     and command, is given five times Config.Stuck); a request still waiting
//     Config.Stuck after its deadline ignored it; workers that do not stop
//     within Config.Grace of the end hang.
//   - At the end the table's own checker runs (manager.Open, Check) and
//     Query must be empty: every dead worker was reaped. For flock every lock
//     file must be lockable.
//
// Every violation has a kind (exclusion, exec, child, flight, counter,
// token, lost, stuck, table, failure); the report counts them per kind, and
// kills per feature.
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
// With several features the positions do different work, so these figures
// compare like with like only within one feature.
package stress
