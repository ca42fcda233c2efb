package table

import (
	"fmt"
	"sync/atomic"
)

// A co-owner is a process group that keeps an agent alive after the
// agent's own process is gone. shmlocks exec names the command's group, so
// that the lock it holds lives exactly as long as the command and the
// processes of its group, whatever kills the wrapper (SIGKILL included).
//
// The record keeps the group's id and the low 32 bits of its leader's start
// time (clock ticks since boot, Linux), in one word written with one atomic
// store: there is no intermediate state to crash in. The group is alive
// while its leader runs (the process whose pid is pgid, with that start
// time), or, once the leader is gone, while any other process of the group
// runs: Linux never hands out a pid that is still the pgid of a live
// process, so a process with pid pgid and another start time proves the old
// group empty. A zombie is not running. The check costs one read of
// /proc/PGID/stat while the leader runs; after it, a kill(-pgid, 0) and, if
// that finds members, a scan of /proc for one that is not a zombie.
//
// Only an agent whose own process is dead looks at its co-owner; a bucket
// latch left by a dead process is taken over whatever its co-owner does
// (latchOwnerDead), since only the process itself could release it.

// maxCoPGID bounds a co-owner group id: PID_MAX_LIMIT of 64-bit Linux (the
// BSDs and macOS stay below 100000).
const maxCoPGID = 1 << 22

func coOwnerWord(pgid int, start uint64) uint64 {
	return uint64(uint32(pgid))<<32 | uint64(uint32(start))
}

// SetCoOwner makes process group pgid, whose leader started at start
// (ProcessStart; 0 if unknown), a co-owner of the agent: while a process of
// the group runs, the agent is alive even if its own process is gone.
// pgid 0 removes the co-owner.
func (a *Agent) SetCoOwner(pgid int, start uint64) error {
	var v uint64
	if pgid != 0 {
		if pgid < 2 || pgid > maxCoPGID {
			return fmt.Errorf("table: co-owner process group %d out of range [2, %d]", pgid, maxCoPGID)
		}
		v = coOwnerWord(pgid, start)
	}
	if !a.Valid() {
		return ErrAgentGone
	}
	atomic.StoreUint64(a.t.u64(a.t.agentOff(a.Idx)+agCoOwner), v)
	return nil
}

// coOwner decodes agent idx's co-owner (pgid 0: none). The word is
// untrusted: a group id out of range is ErrCorrupt naming the field, and
// such a record is judged on its own process alone.
func (t *Table) coOwner(idx uint32) (pgid int, start32 uint32, err error) {
	v := atomic.LoadUint64(t.u64(t.agentOff(idx) + agCoOwner))
	if v == 0 {
		return 0, 0, nil
	}
	pgid = int(v >> 32)
	if pgid < 2 || pgid > maxCoPGID {
		return 0, 0, corruptf("agent co-owner", fmt.Sprintf("%#x", v), "agent %d: process group %d out of range [2, %d]", idx, pgid, maxCoPGID)
	}
	return pgid, uint32(v), nil
}

// coOwnerAlive reports whether agent idx has a co-owner group that still
// runs.
func (t *Table) coOwnerAlive(idx uint32) bool {
	pgid, start32, err := t.coOwner(idx)
	if err != nil || pgid == 0 {
		return false
	}
	return GroupAlive(pgid, start32)
}

// AgentCoOwner returns agent idx's co-owner group (0: none), or ErrCorrupt.
func (t *Table) AgentCoOwner(idx uint32) (pgid int, err error) {
	if idx >= uint32(t.l.MaxAgents) {
		return 0, nil
	}
	pgid, _, err = t.coOwner(idx)
	return pgid, err
}

// AgentProcessDead reports whether agent record idx is in use and names a
// process that is gone, whatever its co-owner does (for a watcher that
// pinned the process, and for latches).
func (t *Table) AgentProcessDead(idx uint32) bool {
	if idx >= uint32(t.l.MaxAgents) {
		return false
	}
	dead, _ := t.agentProcessDead(idx)
	return dead
}

// Live reports whether the agent ai describes is alive: registered, and its
// process running or, failing that, its co-owner group.
func (ai AgentInfo) Live() bool {
	if ai.State != AgentAlive {
		return false
	}
	if byLocks() {
		return !ai.Dead
	}
	if Alive(Identity{PID: ai.PID, Start: ai.Start, Boot: ai.Boot}) {
		return true
	}
	return ai.CoOwner != 0 && GroupAlive(ai.CoOwner, ai.CoOwnerStart)
}

// GroupAlive reports whether a process of group pgid, whose leader started
// at start32 (low 32 bits; 0 unknown), still runs.
func GroupAlive(pgid int, start32 uint32) bool {
	if pgid < 2 || pgid > maxCoPGID {
		return false
	}
	return groupAlive(pgid, start32)
}

// AgentWord returns agent record idx's word (0: free), to tell whether a
// record still belongs to the agent a verdict was about.
func (t *Table) AgentWord(idx uint32) uint64 {
	if idx >= uint32(t.l.MaxAgents) {
		return 0
	}
	return atomic.LoadUint64(t.u64(t.agentOff(idx) + agWord))
}
