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
	regionMagic   = "SHMLSTR1"
	maxMessages   = 16  // violation messages kept (the count is exact)
	messageSize   = 256 // bytes per message, including its 4-byte length
	stealRingSize = 8   // recent steal tokens kept per name

	hdrSize = 64 + maxMessages*messageSize

	// header fields
	rhMagic      = 0  // [8]byte
	rhNames      = 8  // uint32
	rhSlots      = 12 // uint32
	rhGoroutines = 16 // uint32
	rhStop       = 20 // uint32: 1 = workers stop after their current request
	rhViolations = 24 // uint64: number of violations reported
	rhTicket     = 32 // uint64: FIFO sampling tickets
	rhKills      = 40 // uint64: workers killed by the supervisor so far
	rhMessages   = 64 // [maxMessages][messageSize]byte

	// per-name fields (stride nameSize)
	nameSize      = 256
	nmCounter     = 0   // uint64: token<<32 | count, the non-atomic exclusive-section counter
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
	nmReapG       = 140 // uint32: the victim's goroutine
	nmReapSlot    = 144 // uint32: the victim's slot
	nmReapKill    = 152 // int64: monotonic ns of the SIGKILL
	nmReapToken   = 160 // uint64: the victim's token
	nmReapGrant   = 168 // int64: monotonic ns of the first grant after the kill
	nmSeq         = 176 // uint64: token source for backends without tokens (flock)
	nmSteals      = 184 // uint64: steal grants
	nmSharedGrant = 192 // uint64: shared grants

	// per-slot fields (a slot is one worker process; stride slotSize(g))
	slotHdr     = 256
	slPID       = 0   // int64
	slState     = 8   // uint32: slotUnused, slotRunning, slotKilled, slotExited, slotFailed
	slPosition  = 12  // uint32: which of the --procs positions the worker fills
	slOps       = 16  // uint64: requests made
	slGranted   = 24  // uint64: grants, counted when granted
	slNotAvail  = 32  // uint64
	slTimedOut  = 40  // uint64
	slStolen    = 48  // uint64: requests whose grant a steal took away (before or at release)
	slErrors    = 56  // uint64
	slSteals    = 64  // uint64: grants obtained by stealing
	slExclusive = 72  // uint64: exclusive grants
	slShared    = 80  // uint64: shared grants
	slFIFOSamp  = 88  // uint64: FIFO samples taken
	slFIFOOver  = 96  // uint64: apparent overtakes
	slStarted   = 104 // int64: monotonic ns when the worker was ready to make requests (0: not yet)
	slAborted   = 112 // uint64: requests cancelled because the run ended
	slLostRel   = 120 // uint64: grants found stolen at their release (also in slStolen)
	slRelErrors = 128 // uint64: grants whose release failed (also in slErrors)

	// per-goroutine record (stride recSize, after the slot header)
	recSize    = 64
	rcHoldName = 0  // uint32: name index+1 of the held lock, 0 none (published last, cleared first)
	rcHoldMode = 4  // uint32: modeExclusive or modeShared, | recSteal if granted by a steal
	rcToken    = 8  // uint64: token of the held lock
	rcWaitName = 16 // uint32: name index+1 of the request in progress, 0 none
	rcWaitMode = 20 // uint32
	rcTicket   = 24 // uint64: FIFO ticket taken before the request
	rcWaitFrom = 32 // int64: monotonic ns when the request started
	rcDeadline = 40 // int64: monotonic ns deadline of the request, 0 none
	rcGrantAt  = 48 // int64: monotonic ns of the grant of the held lock
	rcGrants   = 56 // uint64: grants this goroutine obtained (per-goroutine fairness)

	recSteal = 1 << 8
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
	names      int
	slots      int
	goroutines int
	slotStride int
}

// RegionSize is the byte size of a region for the given shape.
func RegionSize(names, slots, goroutines int) int {
	return hdrSize + names*nameSize + slots*(slotHdr+goroutines*recSize)
}

// InitRegion formats buf (zeroed, 8-byte aligned, RegionSize bytes) as a region.
func InitRegion(buf []byte, names, slots, goroutines int) (*Region, error) {
	if len(buf) < RegionSize(names, slots, goroutines) {
		return nil, fmt.Errorf("stress: region of %d bytes, need %d", len(buf), RegionSize(names, slots, goroutines))
	}
	ne := binary.NativeEndian
	ne.PutUint32(buf[rhNames:], uint32(names))
	ne.PutUint32(buf[rhSlots:], uint32(slots))
	ne.PutUint32(buf[rhGoroutines:], uint32(goroutines))
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
		slots:      int(ne.Uint32(buf[rhSlots:])),
		goroutines: int(ne.Uint32(buf[rhGoroutines:])),
	}
	r.slotStride = slotHdr + r.goroutines*recSize
	if RegionSize(r.names, r.slots, r.goroutines) > len(buf) {
		return nil, fmt.Errorf("stress: check region truncated (%d bytes)", len(buf))
	}
	return r, nil
}

// Names, Slots and Goroutines return the region's shape.
func (r *Region) Names() int      { return r.names }
func (r *Region) Slots() int      { return r.slots }
func (r *Region) Goroutines() int { return r.goroutines }

func (r *Region) u32(off int) *uint32 { return (*uint32)(unsafe.Add(r.base, off)) }
func (r *Region) u64(off int) *uint64 { return (*uint64)(unsafe.Add(r.base, off)) }
func (r *Region) i64(off int) *int64  { return (*int64)(unsafe.Add(r.base, off)) }

func (r *Region) nameOff(n int) int { return hdrSize + n*nameSize }
func (r *Region) slotOff(s int) int { return hdrSize + r.names*nameSize + s*r.slotStride }
func (r *Region) recOff(s, g int) int {
	return r.slotOff(s) + slotHdr + g*recSize
}

// Stop asks every worker to stop after its current request.
func (r *Region) Stop()          { atomic.StoreUint32(r.u32(rhStop), 1) }
func (r *Region) Stopped() bool  { return atomic.LoadUint32(r.u32(rhStop)) != 0 }
func (r *Region) ticket() uint64 { return atomic.AddUint64(r.u64(rhTicket), 1) }

// AddKill counts a worker killed by the supervisor.
func (r *Region) AddKill()      { atomic.AddUint64(r.u64(rhKills), 1) }
func (r *Region) kills() uint64 { return atomic.LoadUint64(r.u64(rhKills)) }

// Violation records a violation message (the first maxMessages are kept).
func (r *Region) Violation(msg string) {
	n := atomic.AddUint64(r.u64(rhViolations), 1)
	if n > maxMessages {
		return
	}
	off := rhMessages + int(n-1)*messageSize
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
	var msgs []string
	for i := 0; i < n && i < maxMessages; i++ {
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
}

// SetPID records the worker's process id in its slot and marks it running.
func (r *Region) SetPID(s, pid int) {
	atomic.StoreInt64(r.i64(r.slotOff(s)+slPID), int64(pid))
	r.setSlotState(s, slotRunning)
}

// started reports whether the worker of slot s is ready to make requests.
func (r *Region) started(s int) bool { return atomic.LoadInt64(r.i64(r.slotOff(s)+slStarted)) != 0 }

// addGrant counts a grant to goroutine g of slot s.
func (r *Region) addGrant(s, g int) { atomic.AddUint64(r.u64(r.recOff(s, g)+rcGrants), 1) }

// grants returns the grants goroutine g of slot s obtained.
func (r *Region) grants(s, g int) uint64 { return atomic.LoadUint64(r.u64(r.recOff(s, g) + rcGrants)) }

// record is a snapshot of one goroutine's record.
type record struct {
	slot, g  int
	holdName int // -1 none
	holdMode uint32
	steal    bool
	token    uint64
	grantAt  int64
	waitName int // -1 none
	waitMode uint32
	ticket   uint64
	waitFrom int64
	deadline int64
}

// readRecord reads goroutine g of slot s. Held fields are re-read until the
// name is stable around them, so a record being published or cleared never
// pairs one grant's name with another's token.
func (r *Region) readRecord(s, g int) record {
	off := r.recOff(s, g)
	rec := record{slot: s, g: g, holdName: -1, waitName: -1}
	for tries := 0; tries < 4; tries++ {
		n := atomic.LoadUint32(r.u32(off + rcHoldName))
		if n == 0 {
			break
		}
		m := atomic.LoadUint32(r.u32(off + rcHoldMode))
		tok := atomic.LoadUint64(r.u64(off + rcToken))
		at := atomic.LoadInt64(r.i64(off + rcGrantAt))
		if atomic.LoadUint32(r.u32(off+rcHoldName)) == n && atomic.LoadUint64(r.u64(off+rcToken)) == tok {
			rec.holdName, rec.holdMode, rec.steal, rec.token, rec.grantAt = int(n)-1, m&0xff, m&recSteal != 0, tok, at
			break
		}
	}
	if n := atomic.LoadUint32(r.u32(off + rcWaitName)); n != 0 {
		rec.waitName = int(n) - 1
		rec.waitMode = atomic.LoadUint32(r.u32(off + rcWaitMode))
		rec.ticket = atomic.LoadUint64(r.u64(off + rcTicket))
		rec.waitFrom = atomic.LoadInt64(r.i64(off + rcWaitFrom))
		rec.deadline = atomic.LoadInt64(r.i64(off + rcDeadline))
	}
	return rec
}

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

func (r *Region) recordSteal(n int, token uint64) {
	i := atomic.AddUint64(r.nu64(n, nmStealIdx), 1) - 1
	atomic.StoreUint64(r.nu64(n, nmStealRing+8*int(i%stealRingSize)), token)
	atomic.AddUint64(r.nu64(n, nmSteals), 1)
}

func atomic32(p *uint32) uint32    { return atomic.LoadUint32(p) }
func storeU32(p *uint32, v uint32) { atomic.StoreUint32(p, v) }
func storeU64(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
func storeI64(p *int64, v int64)   { atomic.StoreInt64(p, v) }
func loadU64(p *uint64) uint64     { return atomic.LoadUint64(p) }
func loadI64(p *int64) int64       { return atomic.LoadInt64(p) }
