package table

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/bits"
	"unsafe"
)

// File format. Every multi-byte field is in the machine's native byte order
// (the file is shared by processes of one machine, never moved between
// machines); the magic records which order wrote it. All offsets of 32-bit
// words are multiples of 4 and all offsets of 64-bit words multiples of 8, so
// sync/atomic works on them also under GOARCH=386 (the mapping is page aligned).
const (
	Magic         = "SHMLOCK1"
	FormatVersion = 8 // 8: liveness by open-file-description locks (the in-use lock on bytes [0, 8), one lock byte per agent and per keep-alive: docs/design.md §6), an agent's death word, PID and network namespaces (agent offsets 80-103), the agents generation (header offset 156); 7: an agent's co-owner process group (agent offset 72), a fast holder's grant stamp (entry offset 72; 80-byte entry header), the table's fairness in the header (offsets 96-111; checksum at 112 over [0, 112)); 6: a waiting request's park mark (slot offset 56); 5: watch lists (WATCHING slots, entry wHead and gen; 72-byte entry header); 4: fast holds name their agent, one reserved slot per entry (3: held by a claimed slot; 2: FNV-1a hash)

	HeaderSize = 256 // bytes; region 0
	BucketSize = 16  // bytes per bucket
	SlotSize   = 64  // bytes per request slot
	AgentSize  = 128 // bytes per agent record
	entryFixed = 80  // bytes of an entry before its name

	// Limits of the geometry, enforced at creation and on open.
	MaxAgentsLimit    = 1<<24 - 2 // agent index+1 must fit the 24-bit latch owner field
	MaxRequestsLimit  = 1<<24 - 2
	MaxResourcesLimit = 1<<24 - 2
	MaxNameLenLimit   = 1 << 16
)

// Header field offsets (region 0). Fields up to hdrChecksum are written once
// by the creator before the file is published and never again; the checksum
// covers them. The fields after it are mutable and atomic.
const (
	hdrMagic        = 0   // [8]byte
	hdrVersion      = 8   // uint32
	hdrHeaderSize   = 12  // uint32
	hdrMaxResources = 16  // uint32
	hdrMaxRequests  = 20  // uint32
	hdrMaxAgents    = 24  // uint32
	hdrMaxNameLen   = 28  // uint32
	hdrBuckets      = 32  // uint32, power of two
	hdrEntryStride  = 36  // uint32
	hdrFileSize     = 40  // uint64
	hdrBucketsOff   = 48  // uint64
	hdrEntriesOff   = 56  // uint64
	hdrSlotsOff     = 64  // uint64
	hdrAgentsOff    = 72  // uint64
	hdrNonce        = 80  // uint64, random, names this table (doorbells)
	hdrCreated      = 88  // int64, unix nanoseconds
	hdrFairness     = 96  // uint32, fairFIFO or fairBounded (fairness.go)
	hdrFairSpare    = 100 // uint32, 0
	hdrFairBound    = 104 // int64, ns: the bound of fairBounded (0 with fairFIFO)
	hdrChecksum     = 112 // uint32, CRC-32C of bytes [0, 112)
	hdrBootID       = 128 // [2]uint64, boot id of the kernel that last reset the agents
	hdrEntryHint    = 144 // uint32, reserved (0): allocation hints live per agent, in process memory
	hdrSlotHint     = 148 // uint32, reserved (0)
	hdrAgentHint    = 152 // uint32, reserved (0)
	hdrAgentsGen    = 156 // uint32, bumped (and futex-woken) by every registration: death watchers look at the agents again
	hdrReaps        = 168 // uint64, agents reaped (statistics, advisory)
	hdrRepairs      = 176 // uint64, buckets rebuilt after a dead latch owner (statistics, advisory)
	hdrSpare        = 184 // uint32, reserved for benchmarks (raw CAS floor)
)

// Bucket field offsets (stride BucketSize).
const (
	bkLatch    = 0 // uint32: 0 free, else owner agent index+1 | latchWaiters
	bkHead     = 4 // uint32: first entry index+1 of the chain, 0 none
	bkMaxToken = 8 // uint64: highest token of any entry freed from this bucket
)

// Entry field offsets (stride entryStride = 80 + MaxNameLen rounded up to 8).
const (
	enState   = 0  // uint32: 0 free, else bucket index+1 (the entry is live in that bucket)
	enNext    = 4  // uint32: next entry index+1 in the bucket chain
	enQHead   = 8  // uint32: first waiting slot index+1
	enQTail   = 12 // uint32: last waiting slot index+1
	enHHead   = 16 // uint32: first held slot index+1
	enNHeld   = 20 // uint32: number of held slots
	enHMode   = 24 // uint32: mode of the held slots (meaningful when nHeld > 0)
	enSeq     = 28 // uint32: next enqueue sequence number (wraps)
	enToken   = 32 // uint64: last fencing token granted on this entry
	enHash    = 40 // uint64: hash of the name
	enNameLen = 48 // uint32
	enNWait   = 52 // uint32: number of waiting slots
	enFast    = 56 // uint64: counter<<32 | fast state (see fast.go): idle, held by one agent, or latched (0)
	enWHead   = 64 // uint32: first WATCHING slot index+1 (watch.go); while non-zero the entry stays latched and live
	enGen     = 68 // uint32: bumped (atomically, under the latch) on every change of a watched entry's holders or queue
	enStamp   = 72 // uint64: counter<<32 | coarse time of the fast grant with that counter (fast.go, stamp.go)
	enName    = 80 // [MaxNameLen]byte
)

// Slot field offsets (stride SlotSize). The slot array has MaxRequests
// request slots, claimed by agents, then one reserved slot per entry
// (MaxResources of them): slot MaxRequests+e is where a latch holder moves
// the fast holder of entry e when it needs the entry's lists (fast.go).
const (
	slWord    = 0  // uint64: serial<<32 | agent<<8 | state
	slEntry   = 8  // uint32: entry index+1 (WAITING, HELD; informational when STOLEN)
	slMode    = 12 // uint32: ModeExclusive or ModeShared
	slPrev    = 16 // uint32: previous slot index+1 in the entry's queue or held list
	slNext    = 20 // uint32: next slot index+1
	slSeq     = 24 // uint32: enqueue sequence number
	slFlags   = 28 // uint32: flagSteal; WATCHING: flagFired
	slToken   = 32 // uint64: fencing token, written at grant
	slEnqueue = 40 // int64: unix nanoseconds when enqueued
	slGrant   = 48 // int64: unix nanoseconds when granted (a grant made at once: from the coarse clock, stamp.go)
	slPark    = 56 // uint32: not 0 while the WAITING request's goroutine is asleep (its grant must ring its agent): 1, or markRung after a bounded table rang it to take its turn (fairness.go); advisory
)

// Agent field offsets (stride AgentSize).
const (
	agWord      = 0  // uint64: pid<<32 | start24<<8 | state
	agStart     = 8  // uint64: process start time (clock ticks since boot)
	agBoot      = 16 // uint64: hash of the boot id of the agent's kernel
	agNonce     = 24 // uint64: random per Manager; client id and doorbell name
	agBell      = 32 // uint32: doorbell sequence, bumped by whoever grants to or steals from this agent
	agParked    = 36 // uint32: number of the agent's goroutines asleep on the doorbell
	agStealSeq  = 40 // uint32: bumped when a lock of this agent is stolen or reaped
	agSince     = 48 // int64: unix nanoseconds of registration
	agSlotMask  = 56 // uint64: bit r set once the agent owned a slot in range r (of 64 equal ranges of all slots); reapers scan only those
	agEntryMask = 64 // uint64: bit r set once the agent took an entry of range r (e>>entryShift: at most 64 ranges) by the fast path
	agCoOwner   = 72 // uint64: pgid<<32 | low 32 bits of its leader's start time: a process group that keeps the agent alive (coowner.go); 0 none
	agDeath     = 80 // uint32: the death word: TID of the agent's sentinel thread (in its own PID namespace) on the kernel's robust list; the kernel sets bit 30 and wakes a waiter when that thread dies (bit 31: a watcher waits)
	agXBell     = 84 // uint32: the cross-namespace bell: bumped and futex-woken by a ringer in another network namespace, where this agent's abstract doorbell does not exist
	agPidNS     = 88 // uint64: the agent's PID namespace (inode number; 0 unknown): its PID means something only there
	agNetNS     = 96 // uint64: the agent's network namespace (inode number; 0 unknown): its abstract doorbell exists only there
	// 104..128 reserved (0)
)

// Slot states (low 8 bits of the slot word).
const (
	SlotFree     = 0
	SlotClaimed  = 1 // owned by an agent, in no list; only the owner (or its reaper) changes it
	SlotWaiting  = 2 // in its entry's queue
	SlotHeld     = 3 // in its entry's held list
	SlotStolen   = 4 // taken away by a steal; in no list; the owner frees it
	SlotWatching = 5 // WATCHING: in its entry's watch list (watch.go); never in the queue or the held list
)

// Agent states (low 8 bits of the agent word).
const (
	AgentFree        = 0
	AgentRegistering = 1
	AgentAlive       = 2
)

// Modes as stored in slots and entries.
const (
	ModeExclusive = 0
	ModeShared    = 1
)

// ModeAny is the mode of a watch slot that waits for any change of its
// name (Watch), rather than for the name to become grantable in a mode.
const ModeAny = 2

const (
	flagSteal = 1
	flagFired = 2 // a WATCHING slot whose mode became grantable at a change (watch.go)

	latchWaiters = 1 << 31
	latchOwner   = 1<<24 - 1
)

// Geometry is the shape of a table, fixed at creation.
type Geometry struct {
	MaxResources int
	MaxRequests  int
	MaxAgents    int
	MaxNameLen   int
}

// DefaultGeometry serves a typical application: thousands of names, tens of
// thousands of requests and hundreds of agents, in about 4 MiB.
var DefaultGeometry = Geometry{MaxResources: 4096, MaxRequests: 32768, MaxAgents: 256, MaxNameLen: 256}

// layout is the derived placement of the regions for a geometry.
type layout struct {
	Geometry
	buckets     uint32
	slots       uint32 // MaxRequests request slots + MaxResources reserved ones
	entryShift  uint32 // entry e is in agEntryMask range e>>entryShift (at most 64 ranges)
	entryStride uint32
	bucketsOff  uint64
	entriesOff  uint64
	slotsOff    uint64
	agentsOff   uint64
	size        uint64
	bound       int64 // the fairness bound, ns (0: FIFO); fairness.go
}

func (g Geometry) validate() error {
	check := func(field string, v, lo, hi int) error {
		if v < lo || v > hi {
			return fmt.Errorf("%w: %s %d out of range [%d, %d]", ErrGeometry, field, v, lo, hi)
		}
		return nil
	}
	if err := check("MaxResources", g.MaxResources, 1, MaxResourcesLimit); err != nil {
		return err
	}
	if err := check("MaxRequests", g.MaxRequests, 1, MaxRequestsLimit); err != nil {
		return err
	}
	if err := check("MaxAgents", g.MaxAgents, 1, MaxAgentsLimit); err != nil {
		return err
	}
	return check("MaxNameLen", g.MaxNameLen, 1, MaxNameLenLimit)
}

func align8(v uint64) uint64 { return (v + 7) &^ 7 }

func (g Geometry) layout() layout {
	l := layout{Geometry: g}
	l.buckets = 1 << bits.Len32(uint32(2*g.MaxResources-1))
	l.slots = uint32(g.MaxRequests + g.MaxResources)
	l.entryShift = uint32(max(0, bits.Len32(uint32(g.MaxResources-1))-6))
	l.entryStride = uint32(entryFixed + align8(uint64(g.MaxNameLen)))
	l.bucketsOff = HeaderSize
	l.entriesOff = l.bucketsOff + uint64(l.buckets)*BucketSize
	l.slotsOff = l.entriesOff + uint64(g.MaxResources)*uint64(l.entryStride)
	l.agentsOff = l.slotsOff + uint64(l.slots)*SlotSize
	l.size = l.agentsOff + uint64(g.MaxAgents)*AgentSize
	return l
}

// writeHeader fills the immutable header of a new table and its checksum.
func (l layout) writeHeader(b []byte, nonce uint64, created int64) {
	copy(b[hdrMagic:], Magic)
	ne := binary.NativeEndian
	ne.PutUint32(b[hdrVersion:], FormatVersion)
	ne.PutUint32(b[hdrHeaderSize:], HeaderSize)
	ne.PutUint32(b[hdrMaxResources:], uint32(l.MaxResources))
	ne.PutUint32(b[hdrMaxRequests:], uint32(l.MaxRequests))
	ne.PutUint32(b[hdrMaxAgents:], uint32(l.MaxAgents))
	ne.PutUint32(b[hdrMaxNameLen:], uint32(l.MaxNameLen))
	ne.PutUint32(b[hdrBuckets:], l.buckets)
	ne.PutUint32(b[hdrEntryStride:], l.entryStride)
	ne.PutUint64(b[hdrFileSize:], l.size)
	ne.PutUint64(b[hdrBucketsOff:], l.bucketsOff)
	ne.PutUint64(b[hdrEntriesOff:], l.entriesOff)
	ne.PutUint64(b[hdrSlotsOff:], l.slotsOff)
	ne.PutUint64(b[hdrAgentsOff:], l.agentsOff)
	ne.PutUint64(b[hdrNonce:], nonce)
	ne.PutUint64(b[hdrCreated:], uint64(created))
	if l.bound > 0 {
		ne.PutUint32(b[hdrFairness:], fairBounded)
		ne.PutUint64(b[hdrFairBound:], uint64(l.bound))
	}
	ne.PutUint32(b[hdrChecksum:], headerChecksum(b))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func headerChecksum(b []byte) uint32 { return crc32.Checksum(b[:hdrChecksum], castagnoli) }

// parseHeader runs the validation ladder on the bytes of an existing file:
// size, magic, version, checksum, then geometry and every derived offset.
// It never reads past len(b).
func parseHeader(b []byte) (layout, error) {
	var l layout
	if len(b) < HeaderSize {
		return l, corruptf("file size", len(b), "smaller than the %d-byte header", HeaderSize)
	}
	if string(b[hdrMagic:hdrMagic+8]) != Magic {
		return l, corruptf("magic", fmt.Sprintf("%q", b[hdrMagic:hdrMagic+8]), "want %q", Magic)
	}
	ne := binary.NativeEndian
	if v := ne.Uint32(b[hdrVersion:]); v != FormatVersion {
		return l, &FormatError{Found: v}
	}
	if sum, want := ne.Uint32(b[hdrChecksum:]), headerChecksum(b); sum != want {
		return l, corruptf("header checksum", fmt.Sprintf("%#08x", sum), "computed %#08x", want)
	}
	if v := ne.Uint32(b[hdrHeaderSize:]); v != HeaderSize {
		return l, corruptf("header size", v, "want %d", HeaderSize)
	}
	g := Geometry{
		MaxResources: int(ne.Uint32(b[hdrMaxResources:])),
		MaxRequests:  int(ne.Uint32(b[hdrMaxRequests:])),
		MaxAgents:    int(ne.Uint32(b[hdrMaxAgents:])),
		MaxNameLen:   int(ne.Uint32(b[hdrMaxNameLen:])),
	}
	if err := g.validate(); err != nil {
		return l, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	l = g.layout()
	fields := []struct {
		name      string
		got, want uint64
	}{
		{"buckets", uint64(ne.Uint32(b[hdrBuckets:])), uint64(l.buckets)},
		{"entry stride", uint64(ne.Uint32(b[hdrEntryStride:])), uint64(l.entryStride)},
		{"buckets offset", ne.Uint64(b[hdrBucketsOff:]), l.bucketsOff},
		{"entries offset", ne.Uint64(b[hdrEntriesOff:]), l.entriesOff},
		{"slots offset", ne.Uint64(b[hdrSlotsOff:]), l.slotsOff},
		{"agents offset", ne.Uint64(b[hdrAgentsOff:]), l.agentsOff},
		{"recorded file size", ne.Uint64(b[hdrFileSize:]), l.size},
		{"file size", uint64(len(b)), l.size},
	}
	for _, f := range fields {
		if f.got != f.want {
			return l, corruptf(f.name, f.got, "geometry implies %d", f.want)
		}
	}
	bound, err := parseFairness(ne.Uint32(b[hdrFairness:]), ne.Uint32(b[hdrFairSpare:]), ne.Uint64(b[hdrFairBound:]))
	if err != nil {
		return l, err
	}
	l.bound = bound
	return l, nil
}

// Pointer helpers. Callers pass offsets they have bounds-checked (indices are
// validated against the geometry before any offset is formed).
func (t *Table) u32(off uint64) *uint32 { return (*uint32)(unsafe.Add(t.base, off)) }
func (t *Table) u64(off uint64) *uint64 { return (*uint64)(unsafe.Add(t.base, off)) }

// Plain accessors, for the words that only holders of the bucket latch read
// and write (links, counts, modes, tokens, sequence numbers, names): the
// latch's own atomic CAS and Swap order them, so they need no atomic stores
// of their own (an atomic store is a full-barrier XCHG on amd64). Words that
// anyone reads without the latch (slot and agent words, entry state, bucket
// latch and chain head) always use sync/atomic. See docs/design.md.
func (t *Table) ld32(off uint64) uint32    { return *t.u32(off) }
func (t *Table) st32(off uint64, v uint32) { *t.u32(off) = v }
func (t *Table) ld64(off uint64) uint64    { return *t.u64(off) }
func (t *Table) st64(off uint64, v uint64) { *t.u64(off) = v }

func (t *Table) bucketOff(b uint32) uint64 { return t.l.bucketsOff + uint64(b)*BucketSize }
func (t *Table) entryOff(e uint32) uint64  { return t.l.entriesOff + uint64(e)*uint64(t.l.entryStride) }
func (t *Table) slotOff(s uint32) uint64   { return t.l.slotsOff + uint64(s)*SlotSize }
func (t *Table) agentOff(a uint32) uint64  { return t.l.agentsOff + uint64(a)*AgentSize }

// fastSlot is entry e's reserved slot (see fast.go).
func (t *Table) fastSlot(e uint32) uint32 { return uint32(t.l.MaxRequests) + e }

// Slot word packing.
func slotWord(serial, agent uint32, state uint8) uint64 {
	return uint64(serial)<<32 | uint64(agent&0xFFFFFF)<<8 | uint64(state)
}
func wordState(w uint64) uint8   { return uint8(w) }
func wordAgent(w uint64) uint32  { return uint32(w>>8) & 0xFFFFFF }
func wordSerial(w uint64) uint32 { return uint32(w >> 32) }

// Agent word packing.
func agentWord(pid int, start uint64, state uint8) uint64 {
	return uint64(uint32(pid))<<32 | (start&0xFFFFFF)<<8 | uint64(state)
}
func agentWordPID(w uint64) int        { return int(uint32(w >> 32)) }
func agentWordStart24(w uint64) uint64 { return (w >> 8) & 0xFFFFFF }

// Hash is the name hash: it places a name in a bucket and is stored in the
// name's entry, so every process that shares a table must compute the same
// value (it is part of the file format: changing it bumps FormatVersion).
//
// It reads the name 8 bytes at a time, little-endian whatever the machine,
// and folds each word in with a 64x64→128-bit multiply (the mixing step of
// wyhash), then mixes once more. FNV-1a (format 2), one multiply per byte,
// cost about 1 ns per byte here: 32-36 ns for a 33-byte path-like name,
// against 8-12 ns now (docs/benchmarks.md, RequestLongName).
func Hash(name string) uint64 {
	h := uint64(len(name)) ^ hashK1
	for ; len(name) >= 8; name = name[8:] {
		h = hashMix(h^binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(name), 8)), hashK2)
	}
	if n := len(name); n > 0 {
		// The last 1-7 bytes as one little-endian word (byte i at bit 8i),
		// read as two overlapping loads instead of byte by byte.
		p := unsafe.Pointer(unsafe.StringData(name))
		var tail uint64
		switch {
		case n >= 4:
			lo := binary.LittleEndian.Uint32(unsafe.Slice((*byte)(p), 4))
			hi := binary.LittleEndian.Uint32(unsafe.Slice((*byte)(unsafe.Add(p, n-4)), 4))
			tail = uint64(lo) | uint64(hi)<<(8*(n-4))
		case n >= 2:
			lo := binary.LittleEndian.Uint16(unsafe.Slice((*byte)(p), 2))
			hi := binary.LittleEndian.Uint16(unsafe.Slice((*byte)(unsafe.Add(p, n-2)), 2))
			tail = uint64(lo) | uint64(hi)<<(8*(n-2))
		default:
			tail = uint64(*(*byte)(p))
		}
		h = hashMix(h^tail, hashK2)
	}
	return hashMix(h, hashK1)
}

const (
	hashK1 = 0xa0761d6478bd642f
	hashK2 = 0xe7037ed1a0b428db
)

// hashMix folds the 128-bit product of a and b into 64 bits.
func hashMix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}
