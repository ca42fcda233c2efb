package stress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// The check region is a small shared memory area, independent of the lock
// table, that every worker process maps (a second file next to the table).
// The checkers keep their evidence there, so that it survives the SIGKILL of
// any worker and the supervisor can read it.
//
// Every field is a 32- or 64-bit word at an offset that is a multiple of its
// size (the mapping is page aligned), accessed only with sync/atomic, so the
// layout also works with GOARCH=386. The one deliberately non-atomic datum,
// the per-name counter, is read and written with separate atomic loads and
// stores: the read-modify-write as a whole is not atomic, which is the point.

const (
	regionMagic   = "SHMLSTR2"
	maxMessages   = 24  // violation messages kept (the counts are exact)
	perKindKept   = 4   // of which at most this many per kind (the first ones)
	messageSize   = 256 // bytes per message, including its 4-byte length
	stealRingSize = 8   // recent steal tokens kept per name
	maxKinds      = 16  // violation kinds counted (kindNames)
	maxFeatures   = 8   // features whose kills are counted (featureNames)
	maxPositions  = 256 // process positions (Config.Procs at most)

	// header fields
	rhMagic      = 0                           // [8]byte
	rhNames      = 8                           // uint32: name entries (lock names, then as many flight keys)
	rhSlots      = 12                          // uint32
	rhGoroutines = 16                          // uint32
	rhStop       = 20                          // uint32: 1 = workers stop after their current request
	rhViolations = 24                          // uint64: number of violations reported
	rhTicket     = 32                          // uint64: FIFO sampling tickets
	rhKills      = 40                          // uint64: processes killed so far (every feature; written by whoever sends the SIGKILL)
	rhRecords    = 48                          // uint32: hold records per goroutine
	rhPositions  = 52                          // uint32: process positions
	rhLockNames  = 56                          // uint32: lock names (the first entries)
	rhKept       = 60                          // uint32: violation messages kept
	rhKinds      = 64                          // [maxKinds]uint64: violations per kind
	rhFeatKills  = rhKinds + 8*maxKinds        // [maxFeatures]uint64: kills per feature
	rhExecKills  = rhFeatKills + 8*maxFeatures // [4]uint64: exec kills per target (execKill*)
	rhPosSlots   = rhExecKills + 32            // [maxPositions]uint32: slot+1 of the worker filling each position (supervisor writes)
	rhMessages   = rhPosSlots + 4*maxPositions // [maxMessages][messageSize]byte

	hdrSize = rhMessages + maxMessages*messageSize

	// per-name fields (stride nameSize)
	nameSize      = 256
	nmCounter     = 0   // uint64: exec<<63 | token(31 bits)<<32 | count: the non-atomic exclusive-section counter and its last writer
	nmGrantsX     = 8   // uint64: exclusive grants (atomic)
	nmFenced      = 16  // uint64: exclusive sections that skipped their write because they were stolen
	nmMaxAny      = 24  // uint64: highest token recorded by any grant
	nmMaxExcl     = 32  // uint64: highest token recorded by an exclusive grant
	nmStealIdx    = 40  // uint64: steals recorded (index into the ring)
	nmStealRing   = 48  // [stealRingSize]uint64: tokens of the latest steal grants
	nmWaiters     = 112 // int64: goroutines blocked in a request for this name
	nmRelease     = 120 // int64: monotonic ns of the last release that left waiters (0: consumed)
	nmLastChange  = 128 // int64: monotonic ns of the last grant or release
	nmReapState   = 136 // uint32: reap watch: 0 idle, 1 armed, 2 sampled, 3 discarded
	nmReapG       = 140 // uint32: the victim's record
	nmReapSlot    = 144 // uint32: the victim's slot
	nmReapKill    = 152 // int64: monotonic ns of the SIGKILL
	nmReapToken   = 160 // uint64: the victim's token
	nmReapGrant   = 168 // int64: monotonic ns of the first grant after the kill
	nmSeq         = 176 // uint64: token source for backends without tokens (flock)
	nmSteals      = 184 // uint64: steal grants
	nmSharedGrant = 192 // uint64: shared grants
	nmLastSteal   = 200 // int64: monotonic ns of the latest steal grant (written before the stealer publishes its hold)
	nmTokenless   = 208 // int64: when the wrapper of the last tokenless exec command to write the counter was started

	// per-slot fields (a slot is one worker process; stride slotSize(g))
	slotHdr     = 256
	slPID       = 0   // int64
	slState     = 8   // uint32: slotUnused, slotRunning, slotKilled, slotExited, slotFailed
	slPosition  = 12  // uint32: which of the --procs positions the worker fills
	slOps       = 16  // uint64: requests made
	_           = 24  // uint64: unused (was grants; now slExclusive + slShared)
	slNotAvail  = 32  // uint64
	slTimedOut  = 40  // uint64
	slStolen    = 48  // uint64: requests whose grant a steal took away (before or at release)
	slErrors    = 56  // uint64
	slSteals    = 64  // uint64: grants obtained by stealing
	slExclusive = 72  // uint64: exclusive grants (Region.countGrant: stolen ones included)
	slShared    = 80  // uint64: shared grants
	slFIFOSamp  = 88  // uint64: FIFO samples taken
	slFIFOOver  = 96  // uint64: apparent overtakes
	slStarted   = 104 // int64: monotonic ns when the worker was ready to make requests (0: not yet)
	slAborted   = 112 // uint64: requests cancelled because the run ended
	slLostRel   = 120 // uint64: grants found stolen at their release (also in slStolen)
	slRelErrors = 128 // uint64: grants whose release failed (also in slErrors)
	slChild     = 136 // uint64: child grants (nested and fanned-out requests made with a grant's ctx)
	slLed       = 144 // uint64: Coalesce flights led (fn run)
	slFollowed  = 152 // uint64: Coalesce results received from another caller's fn
	slSets      = 160 // uint64: AcquireAll / RequestAll grants (sets of names)
	slExecRuns  = 168 // uint64: exec commands that checked in holding their lock
	slStale     = 176 // uint64: requests made with the ctx of a grant that had ended
	slRole      = 184 // uint32: the worker's feature (featurePlain, ...)

	// per-record fields (stride recSize, after the slot header; a goroutine
	// owns Records consecutive records, its first carries its wait and its
	// grant count)
	recSize    = 128
	rcHoldName = 0   // uint32: name index+1 of the held lock, 0 none (published last, cleared first)
	rcHoldMode = 4   // uint32: modeExclusive or modeShared, | recSteal, recChild, recExec, recStale
	rcToken    = 8   // uint64: token of the held lock (0: unknown, an exec command without SHMLOCKS_TOKEN)
	rcWaitName = 16  // uint32: name index+1 of the request in progress, 0 none
	rcWaitMode = 20  // uint32: mode | waitMulti, waitExec
	rcTicket   = 24  // uint64: FIFO ticket taken before the request
	rcWaitFrom = 32  // int64: monotonic ns when the request started
	rcDeadline = 40  // int64: monotonic ns deadline of the request, 0 none
	rcGrantAt  = 48  // int64: monotonic ns of the grant of the held lock
	rcGrants   = 56  // uint64: grants this goroutine obtained (per-goroutine fairness; first record only)
	rcID       = 64  // uint64: the hold's id (child holds name their ancestors by it)
	rcParent   = 72  // uint64: id of the grant this child hold is a child of, 0 none
	rcRoot     = 80  // uint64: id of that grant's own parent, 0 none
	rcPID      = 88  // int64: process holding (an exec command), 0: the slot's worker
	rcPStart   = 96  // uint64: that process's start time (a reused pid is not it)
	rcCtl      = 104 // uint64: exec: seq<<8 | kill target the supervisor asks for (execKill*)
	rcAsked    = 112 // int64: exec: monotonic ns when the wrapper was started (a tokenless hold is excused by a later steal)
	rcSeq      = 120 // uint64: exec: the seq of the command that holds (written before its hold)

	recSteal = 1 << 8  // granted by a steal
	recChild = 1 << 9  // a child grant (rcParent names its parent)
	recExec  = 1 << 10 // held by an exec command (rcPID)
	recStale = 1 << 11 // granted to a request made with the ctx of an ended grant

	waitMulti = 1 << 8 // one of the names of an AcquireAll
	waitExec  = 1 << 9 // an exec wrapper's request (its ticket predates the wrapper's start)
)

// Slot states.
const (
	slotUnused  = 0
	slotRunning = 1
	slotKilled  = 2 // marked by the supervisor just before it sends SIGKILL
	slotExited  = 3 // exited normally
	slotFailed  = 4 // exited abnormally or died unexpectedly (marked after Wait)
)

// Modes as recorded in the region.
const (
	modeExclusive = 0
	modeShared    = 1
)

// Region is a mapped check region.
type Region struct {
	buf        []byte
	base       unsafe.Pointer
	names      int // name entries: lock names, then flight keys
	lockNames  int
	slots      int
	goroutines int
	perG       int // records per goroutine
	records    int // records per slot (goroutines * perG)
	positions  int
	slotStride int
}

// RegionShape is the shape of a check region.
type RegionShape struct {
	Names      int // lock names (the region also keeps as many Coalesce keys)
	Slots      int // worker processes over the whole run
	Goroutines int // requesting goroutines per worker
	Records    int // hold records per goroutine (0: 1)
	Positions  int // process positions (0: Slots, at most maxPositions)
}

func (sh RegionShape) norm() RegionShape {
	if sh.Records < 1 {
		sh.Records = 1
	}
	if sh.Positions == 0 {
		sh.Positions = sh.Slots
	}
	sh.Positions = min(sh.Positions, maxPositions)
	return sh
}

// RegionSize is the byte size of a region of that shape.
func RegionSize(sh RegionShape) int {
	sh = sh.norm()
	return hdrSize + 2*sh.Names*nameSize + sh.Slots*(slotHdr+sh.Goroutines*sh.Records*recSize)
}

// InitRegion formats buf (zeroed, 8-byte aligned, RegionSize bytes) as a region.
func InitRegion(buf []byte, sh RegionShape) (*Region, error) {
	sh = sh.norm()
	if len(buf) < RegionSize(sh) {
		return nil, fmt.Errorf("stress: region of %d bytes, need %d", len(buf), RegionSize(sh))
	}
	ne := binary.NativeEndian
	ne.PutUint32(buf[rhNames:], uint32(2*sh.Names))
	ne.PutUint32(buf[rhLockNames:], uint32(sh.Names))
	ne.PutUint32(buf[rhSlots:], uint32(sh.Slots))
	ne.PutUint32(buf[rhGoroutines:], uint32(sh.Goroutines))
	ne.PutUint32(buf[rhRecords:], uint32(sh.Records))
	ne.PutUint32(buf[rhPositions:], uint32(sh.Positions))
	copy(buf[rhMagic:], regionMagic)
	return OpenRegion(buf)
}

// OpenRegion validates and wraps an initialised region.
func OpenRegion(buf []byte) (*Region, error) {
	if len(buf) < hdrSize || string(buf[:8]) != regionMagic {
		return nil, errors.New("stress: not a check region")
	}
	if uintptr(unsafe.Pointer(&buf[0]))%8 != 0 {
		return nil, errors.New("stress: check region is not 8-byte aligned")
	}
	ne := binary.NativeEndian
	r := &Region{
		buf:        buf,
		base:       unsafe.Pointer(&buf[0]),
		names:      int(ne.Uint32(buf[rhNames:])),
		lockNames:  int(ne.Uint32(buf[rhLockNames:])),
		slots:      int(ne.Uint32(buf[rhSlots:])),
		goroutines: int(ne.Uint32(buf[rhGoroutines:])),
		perG:       int(ne.Uint32(buf[rhRecords:])),
		positions:  int(ne.Uint32(buf[rhPositions:])),
	}
	if r.perG < 1 || r.positions > maxPositions || r.names != 2*r.lockNames {
		return nil, errors.New("stress: check region header is inconsistent")
	}
	r.records = r.goroutines * r.perG
	r.slotStride = slotHdr + r.records*recSize
	sh := RegionShape{Names: r.lockNames, Slots: r.slots, Goroutines: r.goroutines, Records: r.perG, Positions: r.positions}
	if RegionSize(sh) > len(buf) {
		return nil, fmt.Errorf("stress: check region truncated (%d bytes)", len(buf))
	}
	return r, nil
}

// Names, Slots and Goroutines return the region's shape (Names: the lock names).
func (r *Region) Names() int      { return r.lockNames }
func (r *Region) Slots() int      { return r.slots }
func (r *Region) Goroutines() int { return r.goroutines }

// Records returns the hold records of a slot; PerGoroutine those of one goroutine.
func (r *Region) Records() int      { return r.records }
func (r *Region) PerGoroutine() int { return r.perG }

// flight returns the name entry of Coalesce key k (a lock name's index).
func (r *Region) flight(k int) int { return r.lockNames + k }

// isFlight reports whether name entry n is a Coalesce key.
func (r *Region) isFlight(n int) bool { return n >= r.lockNames }

// label names name entry n in messages.
func (r *Region) label(n int) string {
	if r.isFlight(n) {
		return "flight " + nameOf(n-r.lockNames)
	}
	return nameOf(n)
}

func (r *Region) u32(off int) *uint32 { return (*uint32)(unsafe.Add(r.base, off)) }
func (r *Region) u64(off int) *uint64 { return (*uint64)(unsafe.Add(r.base, off)) }
func (r *Region) i64(off int) *int64  { return (*int64)(unsafe.Add(r.base, off)) }

func (r *Region) nameOff(n int) int { return hdrSize + n*nameSize }
func (r *Region) slotOff(s int) int { return hdrSize + r.names*nameSize + s*r.slotStride }

// recOff is the offset of record rec (goroutine rec/perG) of slot s.
func (r *Region) recOff(s, rec int) int {
	return r.slotOff(s) + slotHdr + rec*recSize
}

// Stop asks every worker to stop after its current request.
func (r *Region) Stop()          { atomic.StoreUint32(r.u32(rhStop), 1) }
func (r *Region) Stopped() bool  { return atomic.LoadUint32(r.u32(rhStop)) != 0 }
func (r *Region) ticket() uint64 { return atomic.AddUint64(r.u64(rhTicket), 1) }

// AddKill counts a process killed (for feature f) and returns nothing; kills
// is the total the checkers' tolerances use.
func (r *Region) AddKill() { r.addKill(featurePlain) }
func (r *Region) addKill(f int) {
	atomic.AddUint64(r.u64(rhFeatKills+8*f), 1)
	atomic.AddUint64(r.u64(rhKills), 1)
}
func (r *Region) kills() uint64          { return atomic.LoadUint64(r.u64(rhKills)) }
func (r *Region) featureKills(f int) int { return int(atomic.LoadUint64(r.u64(rhFeatKills + 8*f))) }
func (r *Region) addExecKill(target int) { atomic.AddUint64(r.u64(rhExecKills+8*target), 1) }
func (r *Region) execKills(target int) int {
	return int(atomic.LoadUint64(r.u64(rhExecKills + 8*target)))
}

// setPosition records that slot s now fills position pos (the supervisor
// writes it before the worker starts): the occupancy scans visit the
// current worker of every position, not every slot ever used.
func (r *Region) setPosition(pos, s int) {
	if pos < r.positions {
		atomic.StoreUint32(r.u32(rhPosSlots+4*pos), uint32(s)+1)
	}
}

// positionSlot returns the slot filling position pos, or -1.
func (r *Region) positionSlot(pos int) int {
	return int(atomic.LoadUint32(r.u32(rhPosSlots+4*pos))) - 1
}

// Violation records a violation message of kind "other".
func (r *Region) Violation(msg string) { r.violation(kindOther, msg) }

// violation records a violation message of a kind. The counts are exact;
// the first perKindKept messages of each kind are kept, maxMessages in all,
// so that a flood of one kind does not hide the first of another.
func (r *Region) violation(kind int, msg string) {
	atomic.AddUint64(r.u64(rhViolations), 1)
	if atomic.AddUint64(r.u64(rhKinds+8*kind), 1) > perKindKept {
		return
	}
	n := atomic.AddUint32(r.u32(rhKept), 1)
	if n > maxMessages {
		return
	}
	off := rhMessages + int(n-1)*messageSize
	msg = kindNames[kind] + ": " + msg
	if len(msg) > messageSize-4 {
		msg = msg[:messageSize-4]
	}
	for i := 0; i < len(msg); i++ {
		r.buf[off+4+i] = msg[i]
	}
	atomic.StoreUint32(r.u32(off), uint32(len(msg))|1<<31) // published
}

// Violations returns the number of violations and the messages kept.
func (r *Region) Violations() (int, []string) {
	n := int(atomic.LoadUint64(r.u64(rhViolations)))
	kept := min(int(atomic.LoadUint32(r.u32(rhKept))), maxMessages)
	var msgs []string
	for i := 0; i < kept; i++ {
		off := rhMessages + i*messageSize
		l := atomic.LoadUint32(r.u32(off))
		if l&(1<<31) == 0 {
			msgs = append(msgs, "(violation message not written: its reporter died)")
			continue
		}
		l &^= 1 << 31
		msgs = append(msgs, string(r.buf[off+4:off+4+int(l)]))
	}
	return n, msgs
}

// kindCount returns the violations of a kind.
func (r *Region) kindCount(kind int) int { return int(atomic.LoadUint64(r.u64(rhKinds + 8*kind))) }

// slot accessors

func (r *Region) slotState(s int) uint32 { return atomic.LoadUint32(r.u32(r.slotOff(s) + slState)) }
func (r *Region) setSlotState(s int, st uint32) {
	atomic.StoreUint32(r.u32(r.slotOff(s)+slState), st)
}
func (r *Region) slotPID(s int) int { return int(atomic.LoadInt64(r.i64(r.slotOff(s) + slPID))) }

func (r *Region) addStat(s, field int, d uint64) { atomic.AddUint64(r.u64(r.slotOff(s)+field), d) }
func (r *Region) stat(s, field int) uint64       { return atomic.LoadUint64(r.u64(r.slotOff(s) + field)) }

// ClaimSlot prepares slot s for a new worker at position pos.
func (r *Region) ClaimSlot(s, pos int) {
	off := r.slotOff(s)
	for i := 0; i < r.slotStride; i += 8 {
		atomic.StoreUint64(r.u64(off+i), 0)
	}
	atomic.StoreUint32(r.u32(off+slPosition), uint32(pos))
	r.setPosition(pos, s)
}

// setRole records the feature of the worker of slot s (messages).
func (r *Region) setRole(s, f int) { atomic.StoreUint32(r.u32(r.slotOff(s)+slRole), uint32(f)) }

// role returns the feature of the worker of slot s.
func (r *Region) role(s int) string {
	if f := int(atomic.LoadUint32(r.u32(r.slotOff(s) + slRole))); f < len(featureNames) {
		return featureNames[f]
	}
	return "?"
}

// SetPID records the worker's process id in its slot and marks it running.
func (r *Region) SetPID(s, pid int) {
	atomic.StoreInt64(r.i64(r.slotOff(s)+slPID), int64(pid))
	r.setSlotState(s, slotRunning)
}

// started reports whether the worker of slot s is ready to make requests.
func (r *Region) started(s int) bool { return atomic.LoadInt64(r.i64(r.slotOff(s)+slStarted)) != 0 }

// name accessors

func (r *Region) nu64(n, field int) *uint64 { return r.u64(r.nameOff(n) + field) }
func (r *Region) ni64(n, field int) *int64  { return r.i64(r.nameOff(n) + field) }
func (r *Region) nu32(n, field int) *uint32 { return r.u32(r.nameOff(n) + field) }

// raise sets *p to v if v is larger, and returns the previous value.
func raise(p *uint64, v uint64) uint64 {
	for {
		old := atomic.LoadUint64(p)
		if v <= old || atomic.CompareAndSwapUint64(p, old, v) {
			return old
		}
	}
}

// stolenBetween reports whether a steal grant with a token in (lo, hi] is
// recorded for name n: a holder with token lo was then stolen from before a
// holder with token hi was granted (or by it).
func (r *Region) stolenBetween(n int, lo, hi uint64) bool {
	for i := 0; i < stealRingSize; i++ {
		s := atomic.LoadUint64(r.nu64(n, nmStealRing+8*i))
		if s > lo && s <= hi {
			return true
		}
	}
	return false
}

// recordSteal records a steal grant on name n (before the stealer
// publishes its hold, so that whoever sees the hold sees the steal).
func (r *Region) recordSteal(n int, token uint64, now int64) {
	raiseI64(r.ni64(n, nmLastSteal), now)
	i := atomic.AddUint64(r.nu64(n, nmStealIdx), 1) - 1
	atomic.StoreUint64(r.nu64(n, nmStealRing+8*int(i%stealRingSize)), token)
	atomic.AddUint64(r.nu64(n, nmSteals), 1)
}

// raiseI64 sets *p to v if v is larger.
func raiseI64(p *int64, v int64) {
	for {
		old := atomic.LoadInt64(p)
		if v <= old || atomic.CompareAndSwapInt64(p, old, v) {
			return
		}
	}
}

// stolenSince reports whether a steal of name n was granted after the
// monotonic time t (what excuses a holder whose token is unknown).
func (r *Region) stolenSince(n int, t int64) bool {
	return atomic.LoadInt64(r.ni64(n, nmLastSteal)) > t
}

func atomic32(p *uint32) uint32    { return atomic.LoadUint32(p) }
func storeU32(p *uint32, v uint32) { atomic.StoreUint32(p, v) }
func storeU64(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
func storeI64(p *int64, v int64)   { atomic.StoreInt64(p, v) }
func loadU64(p *uint64) uint64     { return atomic.LoadUint64(p) }
func loadI64(p *int64) int64       { return atomic.LoadInt64(p) }
