// Package table is the byte layout of a shmlocks lock table and the
// non-blocking state machines that change it: claiming request slots,
// enqueueing, granting, releasing, aborting, stealing, freeing names,
// registering and reaping agents, and rebuilding a bucket whose latch was
// left held by a dead process. It never waits for a lock (only, briefly, for
// a bucket latch); waiting, contexts and wake-ups belong to package manager.
//
// The file is shared by the processes of one machine and holds native-endian
// words. Every 32-bit field is at an offset that is a multiple of 4 and every
// 64-bit field at a multiple of 8 (the mapping is page aligned), so
// sync/atomic works on them on every architecture, GOARCH=386 included.
// Bytes read from the file are untrusted: every index is bounds-checked and
// every walk is bounded, so a corrupt file yields ErrCorrupt naming the
// field, never a panic or a hang; a file truncated under us is caught with
// runtime/debug.SetPanicOnFault wherever the table is read (Guard, or
// BeginGuard/EndGuard on the hot paths of the manager package). Any change
// of layout, or of Hash (the
// bucket of a name), bumps FormatVersion.
//
// # Regions
//
//	offset 0                      header        HeaderSize (256)
//	bucketsOff  = 256             buckets       nBuckets × 16     nBuckets = 2^ceil(log2(2·MaxResources))
//	entriesOff                    entries       MaxResources × entryStride, entryStride = 80 + align8(MaxNameLen)
//	slotsOff                      slots         (MaxRequests + MaxResources) × 64: request slots, then one reserved slot per entry
//	agentsOff                     agents        MaxAgents × 128
//	size = agentsOff + 128·MaxAgents
//
// # Header
//
//	Offset Size Field          Written by            Read by        Atomic Invariant
//	0      8    magic          creator, once         Open           no     "SHMLOCK1"
//	8      4    version        creator, once         Open           no     FormatVersion
//	12     4    header size    creator, once         Open           no     256
//	16     4    MaxResources   creator, once         Open           no     1 ≤ v ≤ 2^24-2
//	20     4    MaxRequests    creator, once         Open           no     1 ≤ v ≤ 2^24-2
//	24     4    MaxAgents      creator, once         Open           no     1 ≤ v ≤ 2^24-2
//	28     4    MaxNameLen     creator, once         Open           no     1 ≤ v ≤ 65536
//	32     4    nBuckets       creator, once         Open           no     as derived
//	36     4    entry stride   creator, once         Open           no     as derived
//	40     8    file size      creator, once         Open           no     = actual size
//	48..79 8×4  region offsets creator, once         Open           no     as derived
//	80     8    nonce          creator, once         all            no     random; names the doorbells
//	88     8    created        creator, once         dump           no     unix ns
//	96     4    fairness       creator, once         all            no     0 FIFO, 1 bounded (fairness.go)
//	100    4    fairness spare creator, once         Open           no     0
//	104    8    fairness bound creator, once         all            no     ns: 0 with FIFO, 1..MaxFairnessBound with bounded
//	112    4    checksum       creator, once         Open           no     CRC-32C of [0, 112)
//	128    16   boot id        Open (stale boot)     Open, dump     yes    kernel boot id at last reset
//	144    12   hints          (reserved)            -              -      -
//	156    4    agentsGen      registrants, sentinels death watchers yes  bumped (and futex-woken) per registration (live.go)
//	168    8    reaps          reapers               dump           yes    statistics
//	176    8    repairs        latch takers-over     dump           yes    statistics
//	184    4    spare          benchmarks            benchmarks     yes    raw-CAS floor word
//
// # Bucket (stride 16)
//
//	Offset Size Field     Written by                        Read by           Atomic Invariant
//	0      4    latch     latch CAS/Swap, takers-over       everyone          yes    0 or owner agent+1 [| 1<<31 waiters]; futex word
//	4      4    head      latch holder                      latch holder, Snapshot (skip test) yes chain of live entries of this bucket
//	8      8    maxToken  latch holder (entry freed)        latch holder      no     ≥ every token of every entry freed here
//
// # Entry (stride 80 + align8(MaxNameLen)): one live name
//
//	Offset Size Field    Written by                 Read by            Atomic Invariant
//	0      4    state    allocator CAS, latch holder repair, reapers   yes    0 free, else bucket+1
//	4      4    next     latch holder               latch holder       no     chain link (index+1)
//	8      4    qHead    latch holder               latch holder       no     first WAITING slot+1
//	12     4    qTail    latch holder               latch holder       no     last WAITING slot+1
//	16     4    hHead    latch holder               latch holder       no     first HELD slot+1
//	20     4    nHeld    latch holder               latch holder       no     = length of held list
//	24     4    hMode    latch holder               latch holder       no     mode of every holder
//	28     4    seq      latch holder               latch holder       no     next queue sequence number (wraps)
//	32     8    token    latch holder               latch holder       no     last token granted on this entry
//	40     8    hash     latch holder               latch holder       no     Hash(name)
//	48     4    nameLen  latch holder               latch holder       no     ≤ MaxNameLen
//	52     4    nWait    latch holder               latch holder       no     = length of queue
//	56     8    fast     fast path CAS, latch holder everyone          yes    counter<<32 | state: 0 latched, idle, held by agent A (A+1); see fast.go
//	64     4    wHead    latch holder               latch holder       no     first WATCHING slot+1 (watch.go); non-zero: latched, kept live
//	68     4    gen      latch holder (atomic add)  watchers           yes    bumped by every change of a watched entry's holders or queue
//	72     8    stamp    fast holder, after its CAS snapshot, inflate   yes    counter<<32 | coarse grant time of the fast grant with that counter (stamp.go); any value decodes safely
//	80     …    name     latch holder               latch holder       no     nameLen bytes
//
// # Request slot (stride 64)
//
// Slots 0..MaxRequests-1 are claimed for requests; slot MaxRequests+e is
// reserved for entry e's fast holder, moved there by a latch holder (fast.go).
//
//	Offset Size Field    Written by                      Read by              Atomic Invariant
//	0      8    word     claimer CAS, latch holder, owner everyone            yes    serial<<32 | agent<<8 | state
//	8      4    entry    latch holder                    latch holder, repair no     entry+1 while WAITING/HELD/WATCHING
//	12     4    mode     latch holder                    latch holder         no     0 exclusive, 1 shared (WATCHING: 2 = any change)
//	16     4    prev     latch holder                    latch holder         no     list link
//	20     4    next     latch holder                    latch holder         no     list link
//	24     4    seq      latch holder                    latch holder, repair no     queue order
//	28     4    flags    latch holder                    dump, deadlock, watch no    1: granted by steal; HELD: bits 1-31 task tag (tag.go); WATCHING: 2 fired (watch.go)
//	32     8    token    latch holder (grant)            owner after HELD     no     fencing token
//	40     8    enqueued latch holder                    dump                 no     unix ns
//	48     8    granted  latch holder (grant)            dump                 no     unix ns (a grant made at once: the coarse clock, stamp.go)
//	56     4    park     owner (atomic)                  granter, wakeAhead   yes    1 while the WAITING request's goroutine sleeps; 0 at enqueue
//	60     4    reserved
//
// # Agent record (stride 128): one Manager
//
//	Offset Size Field     Written by                 Read by                 Atomic Invariant
//	0      8    word      registrant CAS, reaper CAS everyone                yes    pid<<32 | start24<<8 | state; 0 free
//	8      8    start     registrant                 liveness checks         yes    process start time (ticks)
//	16     8    boot      registrant                 liveness checks         yes    hash of the boot id
//	24     8    nonce     registrant                 granters (doorbell name) yes   random; the client id
//	32     4    bell      granters, stealers         the agent               yes    bumped per wake-up of a sleeper, steal, watch, reap
//	36     4    parked    the agent                  granters                yes    goroutines asleep on the doorbell
//	40     4    stealSeq  stealers, repairers        the agent               yes    bumped when a hold is taken away
//	48     8    since     registrant                 dump                    yes    unix ns
//	56     8    slotMask  the agent (before a claim) reapers                 yes    slot ranges ever owned (also set by a latch holder moving a fast hold)
//	64     8    entryMask the agent (before a fast CAS) reapers, orphan check yes   entry ranges ever taken by the fast path
//	72     8    coOwner   the agent (SetCoOwner)     liveness checks         yes    0, or pgid<<32 | start32: 2 ≤ pgid ≤ 2^22; zeroed at registration (coowner.go)
//	80     4    death     sentinel thread; kernel    death watchers          yes    robust futex word: TID | owner-died bit 30 | waiters bit 31 (a hint)
//	84     4    xbell     ringers of another netns   the agent's sentinel    yes    cross-namespace bell: add, then futex wake
//	88     8    pidNS     registrant                 dump, watchers          yes    PID namespace inode (0 unknown)
//	96     8    netNS     registrant                 ringers                 yes    network namespace inode (0 unknown)
//	104    24   reserved
//
// Lock bytes (open-file-description locks on byte ranges, not data; live.go):
// [0, 8) the in-use lock, read-locked by every process that maps the file;
// LockBase + 2·i agent i's life lock, held by the agent's own open file;
// LockBase + 2·i + 1 its keep-alive lock (KeepAliveFile). A record in use
// whose two bytes no open file holds names a dead agent.
//
// # Slot state machine
//
//	        claim (CAS, no latch)         enqueue (latch)
//	FREE ───────────────────────▶ CLAIMED ─────────────────▶ WAITING
//	 ▲  ▲                            │ grant at once (latch)    │ grant by a releaser,
//	 │  │ owner/reaper (CAS)         ▼                          │ aborter or reaper (latch)
//	 │  └──────────────────────── HELD ◀──────────────────────┘
//	 │      release (latch)          │ steal (latch)   ▲
//	 │                               ▼                 │ reserved slot: its entry's fast
//	 └──────── owner (CAS) ──────  STOLEN              │ holder moved in by a latch holder
//
// A claimed slot may instead become WATCHING under the latch: a watch,
// linked into its entry's watch list (never the queue or the held list),
// unlinked and freed by its owner or reaper under the latch (watch.go).
//
// A grant from a queue writes the slot's token, grant time and held-list
// links and then its word, back to back (the waiter spins on that cache
// line), and mends the queue and the counts after the word, under the same
// latch: for a moment the HELD slot is still the queue's head.
//
// On a table of bounded fairness (fairness.go) a release may leave a free
// name to the head of its queue instead of granting it, and hand the entry,
// queue and all, to the fast path: new requests may then take the name
// ahead of the queue (until its head has waited the bound) and the head
// takes it itself (TakeTurn). Queued requests are still granted only from
// the head, in order.
//
// WAITING and HELD slots change only under their bucket's latch; CLAIMED and
// STOLEN slots are in no list and only their owner (or its reaper) frees
// them. An exclusive request on an idle name is granted without a slot or
// the latch, by one CAS on the entry's fast word, which then names the
// agent; its Ref is the entry's reserved slot with the fast counter as the
// serial (fast.go; a latch holder that needs the lists first moves such a
// hold into the reserved slot, as a HELD slot of that agent). The slot words
// and fast words are the truth: entry lists, counts and chains are a cache
// that repair rebuilds from them.
package table
