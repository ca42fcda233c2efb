package table

import (
	"slices"
	"sync/atomic"
)

// LockInfo describes one held or pending request.
type LockInfo struct {
	Name  string
	Mode  uint32
	Agent uint32 // agent record index
	PID   int
	Nonce uint64 // the agent's nonce (its client id)
	Token uint64 // held requests: the fencing token
	// Since is unix nanoseconds: when enqueued (pending) or granted (held).
	// A grant made at once is stamped from the coarse clock (stamp.go):
	// at most about 0.1 s early. 0: not known (a fast holder a moment
	// after its grant, before it wrote its stamp).
	Since int64
	Slot  uint32
	Steal bool // granted by a steal
	// Serial is the request's slot serial (a fast hold: its entry's fast
	// counter): with Slot it names one request for its whole life, so two
	// snapshots can tell "the same request" from "a later one in the slot".
	Serial uint32
	// Tag (holds only) is the task tag (TaskTag) of the waiting request of
	// the same agent whose task holds this lock, or 0.
	Tag uint32
}

// Snapshot returns every held and pending request, pending in queue order
// per name. With a non-nil agent each bucket is read under its latch (a
// consistent view per name); with nil it reads without latching and
// tolerates torn reads (read-only inspection), skipping what it cannot parse.
func (t *Table) Snapshot(a *Agent) (held, pending []LockInfo, err error) {
	held, pending = []LockInfo{}, []LockInfo{}
	err = Guard(func() error {
		var w Wakes
		defer t.Deliver(&w, nil)
		for b := uint32(0); b < t.l.buckets; b++ {
			if atomic.LoadUint32(t.u32(t.bucketOff(b)+bkHead)) == 0 {
				continue
			}
			if a != nil {
				if err := t.latch(a, b, &w); err != nil {
					return err
				}
			}
			var err error
			held, pending, err = t.snapBucket(b, held, pending, a != nil)
			if a != nil {
				t.unlatch(a, b)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	return held, pending, err
}

func (t *Table) snapBucket(b uint32, held, pending []LockInfo, strict bool) ([]LockInfo, []LockInfo, error) {
	nRes := uint32(t.l.MaxResources)
	next := atomic.LoadUint32(t.u32(t.bucketOff(b) + bkHead))
	for steps := uint32(0); next != 0; steps++ {
		e := next - 1
		if e >= nRes || steps > nRes {
			if strict {
				return held, pending, corruptf("bucket chain", next, "bucket %d", b)
			}
			break
		}
		eo := t.entryOff(e)
		n := atomic.LoadUint32(t.u32(eo + enNameLen))
		if n > uint32(t.l.MaxNameLen) {
			if strict {
				return held, pending, corruptf("entry name length", n, "entry %d, MaxNameLen %d", e, t.l.MaxNameLen)
			}
			n = 0
		}
		name := string(t.buf[eo+enName : eo+enName+uint64(n)])
		var err error
		if held, pending, err = t.snapEntry(e, name, held, pending, strict); err != nil {
			return held, pending, err
		}
		next = atomic.LoadUint32(t.u32(eo + enNext))
	}
	return held, pending, nil
}

// snapEntry appends entry e's holders (a fast holder included) and its
// queue, in order, to held and pending.
func (t *Table) snapEntry(e uint32, name string, held, pending []LockInfo, strict bool) ([]LockInfo, []LockInfo, error) {
	nSlots := t.l.slots
	eo := t.entryOff(e)
	tok, fw := t.fastView(eo)
	if fw != fastLatched {
		// Held by the fast path (its held list is empty; a bounded table's
		// queue may not be: fairness.go).
		if ag, ok := fastHolder(uint32(fw)); ok {
			li := LockInfo{
				Name:   name,
				Mode:   ModeExclusive,
				Agent:  ag,
				Slot:   t.fastSlot(e),
				Serial: uint32(fw >> 32),
				Token:  tok&^lo32 | fw>>32,
				Since:  stampTime(atomic.LoadUint64(t.u64(eo+enStamp)), uint32(fw>>32), nowNano()),
			}
			t.agentOf(&li)
			held = append(held, li)
		}
		if t.l.bound == 0 {
			return held, pending, nil
		}
	}
	for _, list := range [2]uint64{enHHead, enQHead} {
		s := atomic.LoadUint32(t.u32(eo + list))
		for steps := uint32(0); s != 0; steps++ {
			if s-1 >= nSlots || steps > nSlots {
				if strict {
					return held, pending, corruptf("list index", s, "entry %d", e)
				}
				break
			}
			so := t.slotOff(s - 1)
			sw := atomic.LoadUint64(t.u64(so + slWord))
			flags := atomic.LoadUint32(t.u32(so + slFlags))
			li := LockInfo{
				Name:   name,
				Mode:   atomic.LoadUint32(t.u32(so + slMode)),
				Agent:  wordAgent(sw),
				Slot:   s - 1,
				Serial: wordSerial(sw),
				Steal:  flags&flagSteal != 0,
			}
			t.agentOf(&li)
			if list == enHHead {
				li.Token = atomic.LoadUint64(t.u64(so + slToken))
				li.Since = int64(atomic.LoadUint64(t.u64(so + slGrant)))
				li.Tag = flags &^ flagSteal
				held = append(held, li)
			} else {
				li.Since = int64(atomic.LoadUint64(t.u64(so + slEnqueue)))
				pending = append(pending, li)
			}
			s = atomic.LoadUint32(t.u32(so + slNext))
		}
	}
	return held, pending, nil
}

// agentOf fills in the PID and nonce of li's agent.
func (t *Table) agentOf(li *LockInfo) {
	if li.Agent < uint32(t.l.MaxAgents) {
		ao := t.agentOff(li.Agent)
		li.PID = agentWordPID(atomic.LoadUint64(t.u64(ao + agWord)))
		li.Nonce = atomic.LoadUint64(t.u64(ao + agNonce))
	}
}

// Usage counts what is in use against the limits.
type Usage struct {
	Entries        int // names held or waited for
	Idle           int // entries of names nobody holds or waits for, kept for reuse
	Slots, Agents  int // request slots in use (of MaxRequests), agent records in use
	Held, Waiting  int // held locks (by the fast path or a slot), waiting requests
	Watching       int // watches (WATCHING slots: WaitUnlocked, Watch); each uses a request slot
	Claimed        int // slots claimed or stolen: in no list
	Reaps, Repairs uint64
}

// Usage reads counts without latching (advisory).
func (t *Table) Usage() Usage {
	var u Usage
	for e := uint32(0); e < uint32(t.l.MaxResources); e++ {
		eo := t.entryOff(e)
		if atomic.LoadUint32(t.u32(eo+enState)) == 0 {
			continue
		}
		if t.entryEmpty(eo) {
			u.Idle++
		} else {
			u.Entries++
		}
		if _, ok := fastHolder(uint32(atomic.LoadUint64(t.u64(eo + enFast)))); ok {
			u.Held++ // no slot says so yet
		}
	}
	for s := uint32(0); s < t.l.slots; s++ {
		switch wordState(atomic.LoadUint64(t.u64(t.slotOff(s) + slWord))) {
		case SlotFree:
			continue
		case SlotHeld:
			u.Held++
		case SlotWaiting:
			u.Waiting++
		case SlotWatching:
			u.Watching++
		default:
			u.Claimed++
		}
		if s < uint32(t.l.MaxRequests) {
			u.Slots++ // the reserved slots of entries count against MaxResources
		}
	}
	for idx := uint32(0); idx < uint32(t.l.MaxAgents); idx++ {
		if wordState(atomic.LoadUint64(t.u64(t.agentOff(idx)+agWord))) != AgentFree {
			u.Agents++
		}
	}
	u.Reaps = atomic.LoadUint64(t.u64(hdrReaps))
	u.Repairs = atomic.LoadUint64(t.u64(hdrRepairs))
	return u
}

// AgentsInWay lists the distinct agents (other than a) holding or queued on
// name, at most 8 of them.
func (t *Table) AgentsInWay(a *Agent, name string, h uint64) []uint32 {
	var out []uint32
	var w Wakes
	b := t.BucketOf(h)
	if t.latch(a, b, &w) != nil {
		return nil
	}
	e, err := t.findEntry(b, name, h)
	if err == nil && e != noEntry {
		eo := t.entryOff(e)
		if ag, ok := fastHolder(uint32(atomic.LoadUint64(t.u64(eo + enFast)))); ok && ag != a.Idx {
			out = append(out, ag)
		}
		for _, list := range [2]uint64{enHHead, enQHead} {
			s := atomic.LoadUint32(t.u32(eo + list))
			for steps := uint32(0); s != 0 && s-1 < t.l.slots && steps < t.l.slots && len(out) < 8; steps++ {
				so := t.slotOff(s - 1)
				ag := wordAgent(atomic.LoadUint64(t.u64(so + slWord)))
				if ag != a.Idx && !slices.Contains(out, ag) {
					out = append(out, ag)
				}
				s = atomic.LoadUint32(t.u32(so + slNext))
			}
		}
	}
	t.unlatch(a, b)
	t.Deliver(&w, nil)
	return out
}

// Watches lists every watch (WATCHING slot: WaitUnlocked, Watch) with its
// name, in slot order, reading without the latch (torn reads tolerated: a watch on an
// entry that is not live is skipped).
func (t *Table) Watches() []LockInfo {
	var out []LockInfo
	for s := uint32(0); s < uint32(t.l.MaxRequests); s++ {
		so := t.slotOff(s)
		sw := atomic.LoadUint64(t.u64(so + slWord))
		if wordState(sw) != SlotWatching {
			continue
		}
		e := atomic.LoadUint32(t.u32(so+slEntry)) - 1
		if e >= uint32(t.l.MaxResources) {
			continue
		}
		eo := t.entryOff(e)
		n := atomic.LoadUint32(t.u32(eo + enNameLen))
		if atomic.LoadUint32(t.u32(eo+enState)) == 0 || n > uint32(t.l.MaxNameLen) {
			continue
		}
		li := LockInfo{
			Name:  string(t.buf[eo+enName : eo+enName+uint64(n)]),
			Mode:  atomic.LoadUint32(t.u32(so + slMode)),
			Agent: wordAgent(sw),
			Slot:  s,
			Since: int64(atomic.LoadUint64(t.u64(so + slEnqueue))),
		}
		t.agentOf(&li)
		out = append(out, li)
	}
	return out
}
