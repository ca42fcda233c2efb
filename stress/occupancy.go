package stress

import (
	"fmt"
	"sync/atomic"
)

// The occupancy check: after a grant, a look at every live hold of the
// name for one that conflicts with it (see the package documentation).

// GrantedChild runs the checks of a child grant of parent (a request made
// with the ctx of parent's grant) in record rec: it publishes the hold and
// looks for holders it conflicts with. Its parent and grandparent are inside
// by design; anyone else is checked as for any grant, so siblings (children
// of one grant) must exclude each other as requests of the name would.
func (c *Checker) GrantedChild(parent *Request, rec int, mode uint32, token uint64) *Request {
	q := &Request{c: c, g: rec / c.r.perG, rec: rec, name: parent.name, mode: mode, parent: parent, flags: recChild, token: token}
	now := c.now()
	q.grantAt = now
	q.publish(now)
	c.checkOccupancy(q)
	c.r.addStat(c.slot, slChild, 1)
	return q
}

// holderAlive reports whether the process of record o still runs: an exec
// command (killed, or killed with its wrapper), or a worker that died on
// its own and that the supervisor has not yet marked failed (its death is
// a violation of its own).
func (c *Checker) holderAlive(o record) bool {
	if o.flags&recExec != 0 {
		return processAlive(int(o.pid), o.pstart)
	}
	return o.slot == c.slot || processAlive(c.r.slotPID(o.slot), 0)
}

// holder describes a hold for messages.
func (c *Checker) holder(o record) string {
	switch {
	case o.flags&recExec != 0:
		off := c.r.recOff(o.slot, o.rec)
		ctl, seq := atomic.LoadUint64(c.r.u64(off+rcCtl)), atomic.LoadUint64(c.r.u64(off+rcSeq))
		if t := ctl & 0xff; ctl>>8 == seq && t != execKillNone && t < uint64(len(execKillNames)) {
			return fmt.Sprintf("exec command pid %d, after a SIGKILL of its %s", o.pid, execKillNames[t])
		}
		return fmt.Sprintf("exec command pid %d", o.pid)
	case o.flags&recChild != 0:
		return fmt.Sprintf("child grant (pid %d %s goroutine %d)", c.r.slotPID(o.slot), c.r.role(o.slot), o.g(c.r))
	case o.flags&recStale != 0:
		return fmt.Sprintf("grant through an ended grant's ctx (pid %d %s goroutine %d)", c.r.slotPID(o.slot), c.r.role(o.slot), o.g(c.r))
	}
	return fmt.Sprintf("pid %d %s goroutine %d", c.r.slotPID(o.slot), c.r.role(o.slot), o.g(c.r))
}

// checkOccupancy looks for holders of q's name whose mode conflicts with
// q's. Records of processes the supervisor killed (it marks them before the
// SIGKILL, so before any reap) or that failed are ignored, and so are those
// of processes no longer alive; a hold and its own ancestors are inside
// together by design; a conflict is excused when the older of the two
// holders was stolen from (a steal grant lies between their tokens, or, for
// an exec command that does not know its token, a steal since its wrapper
// started); anything else is a violation.
func (c *Checker) checkOccupancy(q *Request) {
	r := c.r
	me := r.readRecord(c.slot, q.rec)
	r.liveSlots(func(s int) {
		st := r.slotState(s)
		if st == slotUnused || st == slotKilled || st == slotFailed {
			return
		}
		for i := 0; i < r.records; i++ {
			if s == c.slot && i == q.rec {
				continue
			}
			o := r.readRecord(s, i)
			if o.holdName != q.name || (q.mode == modeShared && o.holdMode == modeShared) || related(me, o) {
				continue
			}
			if c.excused(q, o) {
				continue
			}
			if !c.holderAlive(o) {
				continue // it died after its last write: the table may have reaped it
			}
			kind := kindExclusion
			switch {
			case r.isFlight(q.name):
				c.violation(kindFlight, "two leaders of %s at once: fn of pid %d goroutine %d ran while that of %s did",
					r.label(q.name), c.pid, q.g, c.holder(o))
				continue
			case q.flags&recExec != 0 || o.flags&recExec != 0:
				kind = kindExec
			case q.flags&(recChild|recStale) != 0 || o.flags&(recChild|recStale) != 0:
				kind = kindChild
			}
			me := "grant"
			switch {
			case q.flags&recExec != 0:
				me = "grant to exec command"
			case q.flags&recChild != 0:
				me = "child grant"
			case q.flags&recStale != 0:
				me = "grant through an ended grant's ctx"
			}
			c.violation(kind, "exclusion broken on %s: %s %s token %d (goroutine %d) overlapped %s holder token %d (%s)",
				nameOf(q.name), modeName(q.mode), me, q.token, q.g, modeName(o.holdMode), o.token, c.holder(o))
		}
	})
}

func (c *Checker) excused(q *Request, o record) bool {
	if !c.Tokens || c.r.isFlight(q.name) {
		return false
	}
	n := q.name
	if q.noToken && c.r.stolenSince(n, q.asked) || o.flags&recExec != 0 && o.token == 0 && c.r.stolenSince(n, o.asked) {
		return true
	}
	lo, hi := q.token, o.token
	if lo > hi {
		lo, hi = hi, lo
	}
	return c.r.stolenBetween(n, lo, hi)
}
