package stress

import "sync/atomic"

// The hold records of the check region: what one goroutine of a worker
// (or a process acting for it: an exec command) holds and waits for. A
// goroutine owns PerGoroutine consecutive records: the first carries its
// single-name request and its grant count, the others the further holds of
// one operation (the names of an AcquireAll, the child grants of a Request).

// rec returns the record index of goroutine g's k-th record.
func (r *Region) rec(g, k int) int { return g*r.perG + k }

// addGrant counts a grant to goroutine g of slot s.
func (r *Region) addGrant(s, g int) { atomic.AddUint64(r.u64(r.recOff(s, r.rec(g, 0))+rcGrants), 1) }

// countGrant counts one grant to goroutine g of slot s, in mode (stolen
// before it was seen or not): the one place where a grant is counted, so
// that the report's grants are exclusive + shared (results_unix.go). One
// atomic add per count: a worker killed between two of them leaves the
// sums of the report exact (the per-goroutine count is then one short).
func (r *Region) countGrant(s, g int, mode uint32) {
	if mode == modeShared {
		r.addStat(s, slShared, 1)
	} else {
		r.addStat(s, slExclusive, 1)
	}
	r.addGrant(s, g)
}

// granted returns the grants counted in slot s (countGrant).
func (r *Region) granted(s int) uint64 { return r.stat(s, slExclusive) + r.stat(s, slShared) }

// grants returns the grants goroutine g of slot s obtained.
func (r *Region) grants(s, g int) uint64 {
	return atomic.LoadUint64(r.u64(r.recOff(s, r.rec(g, 0)) + rcGrants))
}

// record is a snapshot of one record.
type record struct {
	slot, rec int
	holdName  int // -1 none
	holdMode  uint32
	flags     uint32 // recSteal, recChild, recExec, recStale
	steal     bool
	token     uint64
	grantAt   int64
	id        uint64
	parent    uint64
	root      uint64
	pid       int64 // the holding process when it is not the slot's worker (an exec command)
	pstart    uint64
	asked     int64
	waitName  int // -1 none
	waitMode  uint32
	waitFlags uint32 // waitMulti, waitExec
	ticket    uint64
	waitFrom  int64
	deadline  int64
}

// g is the goroutine that owns the record.
func (o record) g(r *Region) int { return o.rec / r.perG }

// readRecord reads record rec of slot s. Held fields are re-read until the
// name and token are stable around them, so a record being published or
// cleared never pairs one grant's name with another's fields.
func (r *Region) readRecord(s, rec int) record {
	off := r.recOff(s, rec)
	o := record{slot: s, rec: rec, holdName: -1, waitName: -1}
	for tries := 0; tries < 4; tries++ {
		n := atomic.LoadUint32(r.u32(off + rcHoldName))
		if n == 0 {
			break
		}
		m := atomic.LoadUint32(r.u32(off + rcHoldMode))
		tok := atomic.LoadUint64(r.u64(off + rcToken))
		at := atomic.LoadInt64(r.i64(off + rcGrantAt))
		id := atomic.LoadUint64(r.u64(off + rcID))
		parent := atomic.LoadUint64(r.u64(off + rcParent))
		root := atomic.LoadUint64(r.u64(off + rcRoot))
		pid := atomic.LoadInt64(r.i64(off + rcPID))
		pstart := atomic.LoadUint64(r.u64(off + rcPStart))
		asked := atomic.LoadInt64(r.i64(off + rcAsked))
		if atomic.LoadUint32(r.u32(off+rcHoldName)) == n && atomic.LoadUint64(r.u64(off+rcToken)) == tok &&
			atomic.LoadUint64(r.u64(off+rcID)) == id {
			o.holdName, o.holdMode, o.flags, o.steal, o.token, o.grantAt = int(n)-1, m&0xff, m&^0xff, m&recSteal != 0, tok, at
			o.id, o.parent, o.root, o.pid, o.pstart, o.asked = id, parent, root, pid, pstart, asked
			break
		}
	}
	if n := atomic.LoadUint32(r.u32(off + rcWaitName)); n != 0 {
		o.waitName = int(n) - 1
		m := atomic.LoadUint32(r.u32(off + rcWaitMode))
		o.waitMode, o.waitFlags = m&0xff, m&^0xff
		o.ticket = atomic.LoadUint64(r.u64(off + rcTicket))
		o.waitFrom = atomic.LoadInt64(r.i64(off + rcWaitFrom))
		o.deadline = atomic.LoadInt64(r.i64(off + rcDeadline))
	}
	return o
}

// related reports whether one of two holds is an ancestor of the other (a
// child grant is inside its parent's section by design).
func related(a, b record) bool {
	anc := func(x, y record) bool { return x.id != 0 && (y.parent == x.id || y.root == x.id) }
	return anc(a, b) || anc(b, a)
}

// liveSlots calls f for the slot filling each process position (the
// workers that may hold something now; every other slot's worker has
// exited or was killed).
func (r *Region) liveSlots(f func(s int)) {
	for p := 0; p < r.positions; p++ {
		if s := r.positionSlot(p); s >= 0 && s < r.slots {
			f(s)
		}
	}
}
