package table

import (
	"os"
	"sync/atomic"
	"time"

	"github.com/shmlocks/shmlocks/shm"
)

// Agent is this process's handle on one registered agent record. One
// Manager is one agent; a process may have several.
type Agent struct {
	t     *Table
	Idx   uint32
	word  uint64 // our ALIVE agent word
	Nonce uint64

	// InFlight, when set, counts this agent's table operations in progress
	// (the Manager's own counter). A latch word naming this agent while only
	// the asking operation is in flight is garbage and may be taken over.
	InFlight  *atomic.Int64
	slotHint  atomic.Uint32 // where to look for a free slot first
	slotMask  *uint64       // our record's agSlotMask
	entryMask *uint64       // our record's agEntryMask
	entryHint atomic.Uint32 // where to look for a free entry first

	lockF *os.File // the open file holding the agent's lock byte (live.go); nil once abandoned
}

// Register claims a free agent record for identity id. The record is claimed
// with one CAS whose value already carries the PID and the low 24 bits of the
// start time, so a crash right after the claim leaves a record that anyone can
// recognise as dead.
func (t *Table) Register(id Identity, nonce uint64) (*Agent, error) {
	lockF, err := t.openLockFile()
	if err != nil {
		return nil, err
	}
	n := uint32(t.l.MaxAgents)
	start := uint32(id.PID) % n
	claimed := agentWord(id.PID, id.Start, AgentRegistering)
	for i := uint32(0); i < n; i++ {
		idx := (start + i) % n
		wp := t.u64(t.agentOff(idx) + agWord)
		if atomic.LoadUint64(wp) != 0 || !claimBytes(lockF, idx) {
			continue
		}
		if !atomic.CompareAndSwapUint64(wp, 0, claimed) {
			if lockF != nil {
				shm.UnlockRange(lockF, lifeByte(idx), 2)
			}
			continue
		}
		if lockF != nil {
			shm.UnlockRange(lockF, keepByte(idx), 1) // for KeepAliveFile
		}
		crash("agent.claimed")
		off := t.agentOff(idx)
		atomic.StoreUint32(t.u32(off+agDeath), 0)
		atomic.StoreUint32(t.u32(off+agXBell), 0)
		atomic.StoreUint64(t.u64(off+agPidNS), selfNS.pid)
		atomic.StoreUint64(t.u64(off+agNetNS), selfNS.net)
		atomic.StoreUint64(t.u64(off+agStart), id.Start)
		atomic.StoreUint64(t.u64(off+agBoot), id.Boot)
		atomic.StoreUint64(t.u64(off+agNonce), nonce)
		atomic.StoreUint32(t.u32(off+agParked), 0)
		atomic.StoreUint64(t.u64(off+agSlotMask), 0)
		atomic.StoreUint64(t.u64(off+agEntryMask), 0)
		atomic.StoreUint64(t.u64(off+agCoOwner), 0)
		atomic.StoreUint64(t.u64(off+agSince), uint64(time.Now().UnixNano()))
		alive := agentWord(id.PID, id.Start, AgentAlive)
		if !atomic.CompareAndSwapUint64(wp, claimed, alive) {
			if lockF != nil {
				lockF.Close()
			}
			return nil, ErrAgentGone
		}
		crash("agent.alive")
		t.bumpAgentsGen()
		RefreshClock() // the agent's grants made at once are stamped from it
		a := &Agent{t: t, Idx: idx, word: alive, Nonce: nonce, slotMask: t.u64(off + agSlotMask), entryMask: t.u64(off + agEntryMask), lockF: lockF}
		a.slotHint.Store(uint32(uint64(idx) * uint64(t.l.MaxRequests) / uint64(n)))
		a.entryHint.Store(uint32(uint64(idx) * uint64(t.l.MaxResources) / uint64(n)))
		return a, nil
	}
	if lockF != nil {
		lockF.Close()
	}
	return nil, fullf("agents", int(n))
}

// Valid reports whether a's record still belongs to a (it was not reaped by
// someone who believed this process dead).
func (a *Agent) Valid() bool {
	return atomic.LoadUint64(a.t.u64(a.t.agentOff(a.Idx)+agWord)) == a.word
}

// Bell, Parked and StealSeq are the agent's doorbell words (see docs/design.md).
func (a *Agent) Bell() *uint32     { return a.t.u32(a.t.agentOff(a.Idx) + agBell) }
func (a *Agent) Parked() *uint32   { return a.t.u32(a.t.agentOff(a.Idx) + agParked) }
func (a *Agent) StealSeq() *uint32 { return a.t.u32(a.t.agentOff(a.Idx) + agStealSeq) }

// Deregister releases everything the agent holds, removes everything it
// waits for (granting whoever can now go) and frees its record. Wakes for
// other agents are collected in w.
func (t *Table) Deregister(a *Agent, w *Wakes) error {
	if !a.Valid() {
		a.Abandon()
		return ErrAgentGone
	}
	if err := t.removeAgentSlots(a, a.Idx, a.word, w); err != nil {
		a.Abandon() // the record names a dead agent now: others reap what is left
		return err
	}
	crash("deregister.released")
	ok := atomic.CompareAndSwapUint64(t.u64(t.agentOff(a.Idx)+agWord), a.word, 0)
	a.Abandon() // after the record is free: a record is never unlocked while it names us
	if !ok {
		return ErrAgentGone
	}
	return nil
}

// agentDead reads agent record idx and reports whether it names a process
// that is gone (exited, zombie, PID recycled, other boot) and has no
// co-owner group that still runs (coowner.go). A free record is not dead
// (there is nothing to reap). word is the value the verdict is for.
func (t *Table) agentDead(idx uint32) (dead bool, word uint64) {
	if byLocks() {
		word = atomic.LoadUint64(t.u64(t.agentOff(idx) + agWord))
		if wordState(word) == AgentFree {
			return false, word
		}
		if locked, known := t.lockedBy(idx, 2); locked || !known {
			return false, word
		}
		// Both bytes free: dead, unless its co-owner group visibly runs in
		// this PID namespace (a process of it that closed the keep-alive
		// descriptor). Never the other way round: /proc proves no death.
		if wordState(word) == AgentAlive && t.samePidNS(idx) && t.coOwnerAlive(idx) {
			return false, word
		}
		return true, word
	}
	dead, word = t.agentProcessDead(idx)
	if dead && wordState(word) == AgentAlive && t.coOwnerAlive(idx) {
		return false, word
	}
	return dead, word
}

// agentProcessDead is agentDead without the co-owner: whether the record's
// own process is gone.
func (t *Table) agentProcessDead(idx uint32) (dead bool, word uint64) {
	off := t.agentOff(idx)
	word = atomic.LoadUint64(t.u64(off + agWord))
	if wordState(word) != AgentFree && byLocks() {
		locked, known := t.lockedBy(idx, 1)
		return known && !locked, word
	}
	switch wordState(word) {
	case AgentFree:
		return false, word
	case AgentRegistering:
		pid := agentWordPID(word)
		if !Alive(Identity{PID: pid, Boot: selfIdentity.Boot}) {
			return true, word
		}
		if s := ProcessStart(pid); s != 0 && s&0xFFFFFF != agentWordStart24(word) {
			return true, word
		}
		return false, word
	case AgentAlive:
		id := Identity{
			PID:   agentWordPID(word),
			Start: atomic.LoadUint64(t.u64(off + agStart)),
			Boot:  atomic.LoadUint64(t.u64(off + agBoot)),
		}
		return !Alive(id), word
	default:
		return true, word // garbage state: reap it
	}
}

// ReapDead checks every agent record and reaps those whose process is gone.
// It returns how many it reaped.
func (t *Table) ReapDead(a *Agent, w *Wakes) (int, error) {
	n := 0
	for idx := uint32(0); idx < uint32(t.l.MaxAgents); idx++ {
		if idx == a.Idx {
			continue
		}
		if dead, word := t.agentDead(idx); dead {
			if err := t.Reap(a, idx, word, w); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// AgentDeadWord reports whether agent record idx names a dead process, and
// the record's word the verdict is for (pass it to Reap).
func (t *Table) AgentDeadWord(idx uint32) (bool, uint64) {
	if idx >= uint32(t.l.MaxAgents) {
		return false, 0
	}
	return t.agentDead(idx)
}

// AgentDead reports whether agent record idx names a dead process.
func (t *Table) AgentDead(idx uint32) bool {
	if idx >= uint32(t.l.MaxAgents) {
		return false
	}
	dead, _ := t.agentDead(idx)
	return dead
}

// Reap removes everything of the dead agent idx whose record held word:
// first the latches it held (taken over and repaired), then every slot it
// owned (held ones released, granting the next waiters; waiting ones and
// watches removed), then its record. Every step is idempotent, so a reaper that dies
// halfway is simply followed by another.
func (t *Table) Reap(a *Agent, idx uint32, word uint64, w *Wakes) error {
	if idx >= uint32(t.l.MaxAgents) || idx == a.Idx {
		return nil
	}
	wp := t.u64(t.agentOff(idx) + agWord)
	for b := uint32(0); b < t.l.buckets; b++ {
		lw := t.latchWord(b)
		v := atomic.LoadUint32(lw)
		if v&latchOwner != idx+1 || atomic.LoadUint64(wp) != word {
			continue
		}
		if atomic.CompareAndSwapUint32(lw, v, a.Idx+1|v&latchWaiters) {
			t.repair(a, b, w)
			t.unlatch(a, b)
		}
	}
	crash("reap.latches")
	if err := t.removeAgentSlots(a, idx, word, w); err != nil {
		return err
	}
	crash("reap.slots")
	if atomic.CompareAndSwapUint64(wp, word, 0) {
		atomic.AddUint64(t.u64(hdrReaps), 1)
		t.emit(Event{Kind: EventReap, Agent: idx, PID: agentWordPID(word)})
	}
	return nil
}

// removeAgentSlots frees every slot owned by agent idx while its record still
// holds word. Its fast holds are moved into their held lists first (own),
// then every slot is handled: waiting, held and watching slots are removed
// under their bucket's latch (re-processing the queue); claimed and stolen
// slots are in no list and are freed by CAS.
func (t *Table) removeAgentSlots(a *Agent, idx uint32, word uint64, w *Wakes) error {
	wp := t.u64(t.agentOff(idx) + agWord)
	if err := t.inflateAgentFastHolds(a, idx, word, w); err != nil {
		return err
	}
	// Read after the fast holds were moved: their slots are marked by now.
	mask := atomic.LoadUint64(t.u64(t.agentOff(idx) + agSlotMask))
	n := t.l.slots
	for s := uint32(0); s < n; s++ {
		if r := slotRange(s, n); mask&(1<<r) == 0 {
			s = rangeEnd(r, n) - 1 // the agent never owned a slot in this range
			continue
		}
		sp := t.u64(t.slotOff(s) + slWord)
		for tries := 0; ; tries++ {
			sw := atomic.LoadUint64(sp)
			if wordAgent(sw) != idx || wordState(sw) == SlotFree || atomic.LoadUint64(wp) != word {
				break
			}
			if tries > 1000 {
				return corruptf("slot state", sw, "slot %d of agent %d keeps changing", s, idx)
			}
			switch wordState(sw) {
			case SlotClaimed:
				atomic.CompareAndSwapUint64(sp, sw, slotWord(wordSerial(sw), idx, SlotFree))
				continue
			case SlotStolen:
				atomic.CompareAndSwapUint64(sp, sw, slotWord(wordSerial(sw), idx, SlotFree))
				continue
			case SlotWaiting, SlotHeld, SlotWatching:
				e := atomic.LoadUint32(t.u32(t.slotOff(s)+slEntry)) - 1
				if e >= uint32(t.l.MaxResources) {
					// Not attached to a valid entry: in no list we can reach. Free it.
					atomic.CompareAndSwapUint64(sp, sw, slotWord(wordSerial(sw), idx, SlotFree))
					continue
				}
				b := atomic.LoadUint32(t.u32(t.entryOff(e)+enState)) - 1
				if b >= t.l.buckets {
					atomic.CompareAndSwapUint64(sp, sw, slotWord(wordSerial(sw), idx, SlotFree))
					continue
				}
				if err := t.latch(a, b, w); err != nil {
					return err
				}
				if atomic.LoadUint64(sp) == sw && atomic.LoadUint32(t.u32(t.entryOff(e)+enState)) == b+1 &&
					atomic.LoadUint64(wp) == word {
					if wordState(sw) == SlotWatching {
						t.removeWatch(s, sw, e, b)
					} else {
						t.removeSlot(s, sw, e, b, w, false)
					}
				}
				t.unlatch(a, b)
				crash("reap.slot")
			default:
				atomic.CompareAndSwapUint64(sp, sw, slotWord(wordSerial(sw), idx, SlotFree))
			}
		}
	}
	return nil
}

// inflateAgentFastHolds moves every fast hold of agent idx (record word
// word) into its entry's held list, under the bucket latch: the entries are
// found through the ranges the agent marked in agEntryMask before taking
// them.
func (t *Table) inflateAgentFastHolds(a *Agent, idx uint32, word uint64, w *Wakes) error {
	wp := t.u64(t.agentOff(idx) + agWord)
	mask := atomic.LoadUint64(t.u64(t.agentOff(idx) + agEntryMask))
	nRes := uint32(t.l.MaxResources)
	for e := uint32(0); e < nRes; e++ {
		if r := t.entryRange(e); mask&(1<<r) == 0 {
			e = (r+1)<<t.l.entryShift - 1 // the agent never took an entry of this range
			continue
		}
		eo := t.entryOff(e)
		if ag, ok := fastHolder(uint32(atomic.LoadUint64(t.u64(eo + enFast)))); !ok || ag != idx {
			continue
		}
		b := atomic.LoadUint32(t.u32(eo+enState)) - 1
		if b >= t.l.buckets {
			return corruptf("entry state", b+1, "entry %d is held by the fast path of agent %d", e, idx)
		}
		if err := t.latch(a, b, w); err != nil {
			return err
		}
		if atomic.LoadUint32(t.u32(eo+enState)) == b+1 && atomic.LoadUint64(wp) == word {
			t.own(e)
		}
		t.unlatch(a, b)
	}
	return nil
}

// AgentInfo describes one agent record (for Query, dump and tests).
type AgentInfo struct {
	Index    uint32
	State    uint8
	PID      int
	Start    uint64
	Boot     uint64
	Nonce    uint64
	Since    time.Time
	Parked   uint32
	Bell     uint32
	XBell    uint32 // the cross-namespace bell (rings from another network namespace)
	StealSeq uint32

	// CoOwner is the process group that keeps the agent alive after its
	// process (0: none, or an invalid record: coowner.go); CoOwnerStart the
	// low 32 bits of its leader's start time.
	CoOwner      int
	CoOwnerStart uint32

	// PidNS and NetNS are the agent's PID and network namespaces (inode
	// numbers; 0 unknown); OtherPidNS is true when the agent's PID names
	// a process of another PID namespace than this process's (or cannot
	// be told): /proc here says nothing about it.
	PidNS, NetNS uint64
	OtherPidNS   bool

	// Dead is the kernel's verdict when the record was read: its lock and
	// keep-alive bytes are free (and no co-owner group runs here).
	Dead bool
}

// LiveAgents counts the agent records registered and alive (as far as the
// table knows: a dead process's record counts until it is reaped), up to
// atMost (it stops there; atMost <= 0: no bound), without allocating. A
// hint for the waiting policy: how many processes may want the CPUs to run
// their lock operations. It reads every agent record in the worst case.
func (t *Table) LiveAgents(atMost int) int {
	n := 0
	for idx := uint32(0); idx < uint32(t.l.MaxAgents) && (atMost <= 0 || n < atMost); idx++ {
		if wordState(atomic.LoadUint64(t.u64(t.agentOff(idx)+agWord))) == AgentAlive {
			n++
		}
	}
	return n
}

// Agents lists the non-free agent records.
func (t *Table) Agents() []AgentInfo {
	var out []AgentInfo
	for idx := uint32(0); idx < uint32(t.l.MaxAgents); idx++ {
		off := t.agentOff(idx)
		word := atomic.LoadUint64(t.u64(off + agWord))
		if wordState(word) == AgentFree {
			continue
		}
		out = append(out, t.agentInfo(idx, word))
	}
	return out
}

func (t *Table) agentInfo(idx uint32, word uint64) AgentInfo {
	off := t.agentOff(idx)
	ai := AgentInfo{
		Index:    idx,
		State:    wordState(word),
		PID:      agentWordPID(word),
		Start:    atomic.LoadUint64(t.u64(off + agStart)),
		Boot:     atomic.LoadUint64(t.u64(off + agBoot)),
		Nonce:    atomic.LoadUint64(t.u64(off + agNonce)),
		Since:    time.Unix(0, int64(atomic.LoadUint64(t.u64(off+agSince)))),
		Parked:   atomic.LoadUint32(t.u32(off + agParked)),
		Bell:     atomic.LoadUint32(t.u32(off + agBell)),
		XBell:    atomic.LoadUint32(t.u32(off + agXBell)),
		StealSeq: atomic.LoadUint32(t.u32(off + agStealSeq)),
	}
	ai.CoOwner, ai.CoOwnerStart, _ = t.coOwner(idx)
	ai.PidNS = atomic.LoadUint64(t.u64(off + agPidNS))
	ai.NetNS = atomic.LoadUint64(t.u64(off + agNetNS))
	ai.OtherPidNS = ai.PidNS == 0 || selfNS.pid == 0 || ai.PidNS != selfNS.pid
	ai.Dead, _ = t.agentDead(idx)
	return ai
}

// Word returns the agent word that AgentInfo describes (for change detection).
func (ai AgentInfo) Word() uint64 { return agentWord(ai.PID, ai.Start, ai.State) }

// Slot ranges for agSlotMask: 64 equal ranges of the n slots (entry ranges,
// for agEntryMask, are powers of two: see entryRange).
func slotRange(s, n uint32) uint32 { return uint32(uint64(s) * 64 / uint64(n)) }

// rangeEnd is the first slot after range r.
func rangeEnd(r, n uint32) uint32 { return uint32((uint64(r+1)*uint64(n) + 63) / 64) }
