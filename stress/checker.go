package stress

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Checker is one worker process's view of the check region: the independent
// checks it runs around every request of its goroutines. It shares nothing
// with the lock implementation but the tokens the lock hands out.
type Checker struct {
	r    *Region
	slot int
	pid  int
	now  func() int64 // monotonic nanoseconds, the same clock in every process

	// Tokens says whether the backend hands out fencing tokens (flock does not:
	// the checker then numbers grants itself and skips the token checks).
	Tokens bool
	// StealWait bounds how long a holder that learnt it was stolen from waits
	// for the stealer to record its steal (the stealer records it right after
	// its request returns, which may be after the victim learns of it).
	StealWait time.Duration
	// FIFOSlack: a waiter that took its ticket more than this before a grant
	// and still waits counts as overtaken (a statistic, not a violation).
	FIFOSlack time.Duration
	// FIFOEvery: one grant in FIFOEvery is sampled for overtakes.
	FIFOEvery uint64

	ids atomic.Uint32
}

// NewChecker returns the checker of slot's worker.
func NewChecker(r *Region, slot, pid int, now func() int64) *Checker {
	return &Checker{r: r, slot: slot, pid: pid, now: now, Tokens: true, StealWait: time.Second,
		FIFOSlack: 5 * time.Millisecond, FIFOEvery: 8}
}

func (c *Checker) violation(kind int, format string, args ...any) {
	c.r.violation(kind, fmt.Sprintf("pid %d: ", c.pid)+fmt.Sprintf(format, args...))
}

// nextID returns a hold id unique in the run (child holds name their
// ancestors by it).
func (c *Checker) nextID() uint64 { return uint64(c.slot+1)<<32 | uint64(c.ids.Add(1)) }

// Request describes one request of a goroutine, from before it is made until
// its lock is released.
type Request struct {
	c        *Checker
	g        int // the goroutine (messages)
	rec      int // its record
	name     int
	mode     uint32
	steal    bool
	blocking bool // counted in the name's waiters
	multi    bool // one of the names of an AcquireAll
	ticket   uint64
	from     int64 // monotonic ns when the request started
	maxAny0  uint64

	token   uint64
	grantAt int64
	counter uint64 // value read at the start of an exclusive section
	id      uint64 // the hold's id
	flags   uint32 // recChild, recExec, recStale
	parent  *Request
	pid     int64 // exec: the command's pid and start time
	pstart  uint64
	asked   int64 // exec without a token: when the wrapper was started
	noToken bool  // the holder does not know its token (skip the token checks)
}

// want is a request about to be made.
type want struct {
	rec      int
	name     int
	mode     uint32
	steal    bool
	blocking bool  // the request may wait (not if-available, not a steal)
	deadline int64 // monotonic ns, 0 none
	flags    uint32
}

// Begin publishes that goroutine g is about to request name. blocking: the
// request may wait (not if-available, not a steal). deadline: monotonic ns, 0
// for none.
func (c *Checker) Begin(g, name int, mode uint32, steal, blocking bool, deadline int64) *Request {
	return c.begin(want{rec: c.r.rec(g, 0), name: name, mode: mode, steal: steal, blocking: blocking, deadline: deadline})
}

// begin publishes a request in record w.rec.
func (c *Checker) begin(w want) *Request {
	r := c.r
	q := &Request{c: c, g: w.rec / r.perG, rec: w.rec, name: w.name, mode: w.mode, steal: w.steal, blocking: w.blocking,
		multi: w.flags&waitMulti != 0}
	name, mode, deadline, blocking := w.name, w.mode, w.deadline, w.blocking
	q.ticket = r.ticket()
	q.maxAny0 = atomic.LoadUint64(r.nu64(name, nmMaxAny))
	off := r.recOff(c.slot, w.rec)
	atomic.StoreUint32(r.u32(off+rcWaitMode), mode|w.flags)
	atomic.StoreUint64(r.u64(off+rcTicket), q.ticket)
	atomic.StoreInt64(r.i64(off+rcDeadline), deadline)
	q.from = c.now()
	atomic.StoreInt64(r.i64(off+rcWaitFrom), q.from)
	atomic.StoreUint32(r.u32(off+rcWaitName), uint32(name)+1)
	if blocking {
		atomic.AddInt64(r.ni64(name, nmWaiters), 1)
	}
	return q
}

// From returns the monotonic time at which the request started.
func (q *Request) From() int64 { return q.from }

// End withdraws the request record (the lock call returned). Only the
// first End of a record's request counts (an exec command and its worker may
// both end it).
func (q *Request) End() {
	r := q.c.r
	if atomic.CompareAndSwapUint32(r.u32(r.recOff(q.c.slot, q.rec)+rcWaitName), uint32(q.name)+1, 0) && q.blocking {
		atomic.AddInt64(r.ni64(q.name, nmWaiters), -1)
	}
}

// StolenBeforeSeen checks a request whose grant was stolen before its
// goroutine saw it: some steal on the name must have happened since the
// request began.
func (q *Request) StolenBeforeSeen() {
	q.c.expectSteal(q.name, q.maxAny0, "request for %s was reported stolen before its grant was seen", nameOf(q.name))
}

// expectSteal checks that a steal with a token above after is recorded for
// name n. The stealer records its steal right after its request returns, so
// a victim may learn of the steal first: it waits up to StealWait. A stealer
// killed before it recorded leaves no trace: with kills in the run a missing
// record is not reported.
func (c *Checker) expectSteal(n int, after uint64, format string, args ...any) {
	if !c.Tokens {
		return
	}
	deadline := time.Now().Add(c.StealWait)
	for !c.r.stolenBetween(n, after, ^uint64(0)) {
		if time.Now().After(deadline) {
			if c.r.kills() == 0 {
				c.violation(kindLost, format+", but no steal of it was recorded", args...)
			}
			return
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// Grant result.
type Grant struct {
	// Handoff is the latency from the release that let this request in to
	// this grant, in ns, or -1 when the grant was not a handoff to a waiter.
	Handoff int64
}

// Granted runs the checks of a grant with the given token (ignored without
// Tokens). It must be called right after the lock call returned the lock and
// before the critical section.
func (q *Request) Granted(token uint64) Grant {
	c, r, n := q.c, q.c.r, q.name
	now := c.now()
	q.grantAt = now
	res := Grant{Handoff: -1}
	tokens := c.Tokens && !q.noToken && !r.isFlight(n) && q.flags&recStale == 0
	if !c.Tokens && !r.isFlight(n) {
		token = atomic.AddUint64(r.nu64(n, nmSeq), 1)
	}
	q.token = token

	if q.steal {
		r.recordSteal(n, token, now) // before anything that could conflict with the victims
	}
	// Fencing tokens: strictly increasing per name. An exclusive grant must be
	// above every token recorded before it; a shared one above every exclusive
	// token (concurrent shared grants may record out of order). A holder that
	// was stolen from before it looked is excused.
	if tokens {
		if token == 0 {
			c.violation(kindToken, "%s granted with token 0", nameOf(n))
		}
		if q.mode == modeExclusive {
			if prev := raise(r.nu64(n, nmMaxAny), token); token <= prev && !r.stolenBetween(n, token, prev) {
				c.violation(kindToken, "token regression on %s: exclusive grant with token %d after token %d was recorded", nameOf(n), token, prev)
			}
			raise(r.nu64(n, nmMaxExcl), token)
		} else {
			if prev := atomic.LoadUint64(r.nu64(n, nmMaxExcl)); token <= prev && !r.stolenBetween(n, token, prev) {
				c.violation(kindToken, "token regression on %s: shared grant with token %d after exclusive token %d was recorded", nameOf(n), token, prev)
			}
			raise(r.nu64(n, nmMaxAny), token)
		}
	}

	q.publish(now)
	c.checkOccupancy(q)

	// The per-name counts of the checkers; the report's counts are the
	// workers' (Region.countGrant).
	switch {
	case q.flags&recStale != 0: // not counted: it makes no section
	case q.mode == modeExclusive:
		atomic.AddUint64(r.nu64(n, nmGrantsX), 1)
	default:
		atomic.AddUint64(r.nu64(n, nmSharedGrant), 1)
	}
	if r.isFlight(n) || q.flags&(recExec|recStale) != 0 {
		return res
	}

	// Reap watch armed by the supervisor when it killed a holder of this name:
	// this is the first grant since. It measures a reap only if the victim's
	// record still shows the hold (a victim that released normally first
	// cleared it) and this is not a steal.
	if atomic.LoadUint32(r.nu32(n, nmReapState)) == 1 {
		vs, vg := int(atomic.LoadUint32(r.nu32(n, nmReapSlot))), int(atomic.LoadUint32(r.nu32(n, nmReapG)))
		vt := atomic.LoadUint64(r.nu64(n, nmReapToken))
		v := r.readRecord(vs, vg)
		if !q.steal && v.holdName == n && v.token == vt {
			atomic.StoreInt64(r.ni64(n, nmReapGrant), now)
			atomic.CompareAndSwapUint32(r.nu32(n, nmReapState), 1, 2)
		} else {
			atomic.CompareAndSwapUint32(r.nu32(n, nmReapState), 1, 3)
		}
	}

	// Handoff: the releaser stamped its release because waiters existed; the
	// first grantee that was already waiting then takes the sample.
	if q.blocking {
		if s := atomic.LoadInt64(r.ni64(n, nmRelease)); s != 0 && s >= q.from &&
			atomic.CompareAndSwapInt64(r.ni64(n, nmRelease), s, 0) {
			res.Handoff = now - s
		}
	}

	if q.mode == modeExclusive && q.blocking && !q.multi && c.FIFOEvery > 0 && q.ticket%c.FIFOEvery == 0 {
		c.sampleFIFO(q, now)
	}
	return res
}

// publish writes q's hold into its record, name last. Two overlapping
// holders both publish before they look, so (all accesses being
// sequentially consistent atomics) at least one of them sees the other.
func (q *Request) publish(now int64) {
	c, r := q.c, q.c.r
	q.id = c.nextID()
	off := r.recOff(c.slot, q.rec)
	mode := q.mode | q.flags
	if q.steal {
		mode |= recSteal
	}
	var parent, root uint64
	if q.parent != nil {
		parent = q.parent.id
		if q.parent.parent != nil {
			root = q.parent.parent.id
		}
	}
	atomic.StoreUint32(r.u32(off+rcHoldMode), mode)
	atomic.StoreUint64(r.u64(off+rcToken), q.token)
	atomic.StoreInt64(r.i64(off+rcGrantAt), now)
	atomic.StoreUint64(r.u64(off+rcID), q.id)
	atomic.StoreUint64(r.u64(off+rcParent), parent)
	atomic.StoreUint64(r.u64(off+rcRoot), root)
	atomic.StoreInt64(r.i64(off+rcPID), q.pid)
	atomic.StoreUint64(r.u64(off+rcPStart), q.pstart)
	atomic.StoreInt64(r.i64(off+rcAsked), q.asked)
	atomic.StoreUint32(r.u32(off+rcHoldName), uint32(q.name)+1)
	atomic.StoreInt64(r.ni64(q.name, nmLastChange), now)
}

// sampleFIFO counts waiters for the same name that took their ticket well
// before q and still wait. The ticket is taken before the request enters the
// lock (and a process may be descheduled in between), so this is reported as
// a statistic, never as a violation. Waits for several names (AcquireAll) and
// exec wrappers (whose ticket predates the wrapper's start) are left out.
func (c *Checker) sampleFIFO(q *Request, now int64) {
	r := c.r
	r.addStat(c.slot, slFIFOSamp, 1)
	slack := int64(c.FIFOSlack)
	r.liveSlots(func(s int) {
		if r.slotState(s) != slotRunning {
			return
		}
		for i := 0; i < r.records; i++ {
			o := r.readRecord(s, i)
			if o.waitName != q.name || o.waitFlags != 0 || o.ticket >= q.ticket || o.waitFrom > q.from-slack {
				continue
			}
			if o.deadline != 0 && o.deadline < now {
				continue // timing out
			}
			r.addStat(c.slot, slFIFOOver, 1)
		}
	})
}

// Enter starts the critical section of an exclusive grant: it reads the
// name's counter.
func (q *Request) Enter() {
	if q.mode != modeExclusive || q.parent != nil {
		return
	}
	q.counter = atomic.LoadUint64(q.c.r.nu64(q.name, nmCounter))
}

// stolen reports whether q's grant was stolen since it was granted.
func (q *Request) stolen() bool {
	c, r := q.c, q.c.r
	if !c.Tokens || r.isFlight(q.name) {
		return false
	}
	if q.noToken {
		return r.stolenSince(q.name, q.asked)
	}
	return r.stolenBetween(q.name, q.token, ^uint64(0))
}

// Exit ends the critical section of an exclusive grant: the counter must not
// have changed since Enter (nobody else was inside), then it is incremented
// with a plain store. A holder that learns it was stolen from skips the store
// (it is fenced off) and counts that instead.
func (q *Request) Exit() {
	if q.mode != modeExclusive || q.parent != nil {
		return
	}
	c, r, n := q.c, q.c.r, q.name
	p := r.nu64(n, nmCounter)
	v := atomic.LoadUint64(p)
	stolen := q.stolen()
	if v != q.counter {
		other := v >> 32 & 0x7fffffff
		lo, hi := q.token&0x7fffffff, other
		if lo > hi {
			lo, hi = hi, lo
		}
		excused := c.Tokens && !r.isFlight(n) && (r.stolenBetween(n, lo, hi) ||
			other == 0 && r.stolenSince(n, atomic.LoadInt64(r.ni64(n, nmTokenless))))
		if !excused && !stolen {
			kind := kindCounter
			switch {
			case r.isFlight(n):
				kind = kindFlight
			case q.flags&recExec != 0 || v>>63 != 0: // an exec command held it, or wrote it
				kind = kindExec
			}
			c.violation(kind, "exclusion broken on %s: its counter changed from %d to %d (written by token %d) during an exclusive hold with token %d",
				r.label(n), q.counter&0xffffffff, v&0xffffffff, other, q.token)
		}
	}
	if stolen {
		atomic.AddUint64(r.nu64(n, nmFenced), 1)
		return
	}
	if q.noToken {
		atomic.StoreInt64(r.ni64(n, nmTokenless), q.asked)
	}
	w := (q.token&0x7fffffff)<<32 | (v+1)&0xffffffff
	if q.flags&recExec != 0 {
		w |= 1 << 63 // the writer was an exec command (the kind of a violation it causes)
	}
	atomic.StoreUint64(p, w)
}

// Release withdraws the hold record; call it before releasing the lock.
// It stamps the release for the handoff measurement when waiters exist.
func (q *Request) Release() {
	c, r, n := q.c, q.c.r, q.name
	off := r.recOff(c.slot, q.rec)
	atomic.StoreUint32(r.u32(off+rcHoldName), 0)
	now := c.now()
	atomic.StoreInt64(r.ni64(n, nmLastChange), now)
	if q.parent == nil && atomic.LoadInt64(r.ni64(n, nmWaiters)) > 0 {
		atomic.StoreInt64(r.ni64(n, nmRelease), now)
	}
}

// LostAtRelease checks a lock whose release reported it stolen: a steal on
// the name with a larger token must have been recorded.
func (q *Request) LostAtRelease() {
	q.c.expectSteal(q.name, q.token, "%s lock with token %d was lost (release said stolen)", nameOf(q.name), q.token)
}

func nameOf(n int) string { return fmt.Sprintf("stress-%d", n) }

func modeName(m uint32) string {
	if m&0xff == modeShared {
		return "shared"
	}
	return "exclusive"
}
