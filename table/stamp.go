package table

import (
	"sync/atomic"
	"time"
)

// Grant times of grants made at once. A grant from the queue reads the
// table's clock (nowNano); a grant made at once must not: the uncontended
// fast path is a few tens of nanoseconds and a clock read (RDTSC and the
// scaling, about 10 ns) would be a large share of it. It takes the time
// from the coarse clock instead: a process-wide reading of the unix time
// that every nowNano refreshes and that every Manager refreshes every
// 100 ms (RefreshClock, from its watcher). One load of a word that rarely
// changes costs about a nanosecond; the time it gives is never later than
// the grant and at most about one refresh period earlier, so a hold time
// shown for such a grant may read that much long.
//
// A fast holder writes its stamp in its entry (enStamp) right after the CAS
// that granted it, with the fast counter of that grant in the high word:
//
//	counter<<32 | unix time in stampUnit, modulo 2^32
//
// A reader trusts the stamp only when its counter is the fast word's: a
// holder between its CAS and its store (nanoseconds), or one preempted
// there while its hold was stolen and the entry granted again by the fast
// path (its late store then names the old counter), leaves a stamp of
// another grant, and the reader reports the time as unknown (0). The low
// word wraps every 2^32 units (497 days); a reader takes the latest time
// with those low bits that is not after its own now, so holds shorter than
// 248 days read right. The bytes are untrusted like any other: any value
// decodes to a time no later than the reader's now.

// stampUnit is the resolution of a fast grant's stamp.
const stampUnit = int64(10 * time.Millisecond)

// coarse is the coarse clock (unix nanoseconds; 0 before the first
// refresh), and coarseUnits the same reading in stampUnits, modulo 2^32:
// written by refreshCoarse, read by grants made at once.
var (
	coarse      atomic.Int64
	coarseUnits atomic.Uint32
)

// RefreshClock refreshes the coarse clock of grants made at once. Every
// Manager calls it periodically; Register calls it too, so that an agent's
// first grant is stamped with a fresh time.
func RefreshClock() { refreshCoarse(nowNano()) }

// refreshCoarse stores unix time now (nanoseconds) as the coarse clock if
// it moved on by a stampUnit or more (callers that refresh often do not
// keep writing a shared word), or back by more than a second (the wall
// clock was stepped back).
func refreshCoarse(now int64) {
	if c := coarse.Load(); now-c >= stampUnit || c-now > int64(time.Second) {
		coarse.Store(now)
		coarseUnits.Store(uint32(now / stampUnit))
	}
}

// coarseNano is the coarse clock as unix nanoseconds (the grant time of a
// grant made at once under the latch).
func coarseNano() int64 {
	if c := coarse.Load(); c != 0 {
		return c
	}
	return nowNano() // no refresh yet (a table used without Register)
}

// fastStamp is the stamp of the fast grant with counter ctr.
func fastStamp(ctr uint32) uint64 { return uint64(ctr)<<32 | uint64(coarseUnits.Load()) }

// stampTime decodes stamp for the fast grant with counter ctr: unix
// nanoseconds no later than now, or 0 when the stamp is not that grant's.
func stampTime(stamp uint64, ctr uint32, now int64) int64 {
	if uint32(stamp>>32) != ctr || now <= 0 {
		return 0
	}
	nowU := now / stampUnit
	age := int64(int32(uint32(nowU) - uint32(stamp)))
	if age < 0 {
		age = 0 // a stamp a little ahead of our clock (another process's base), or garbage
	}
	return max((nowU-age)*stampUnit, 1)
}
