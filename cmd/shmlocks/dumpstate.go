package main

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/internal/waitgraph"
	"github.com/shmlocks/shmlocks/table"
)

// dumpState is what `shmlocks dump` shows, read once from a table mapped
// read-only: the header, usage, agents, held locks, pending requests and
// watches, and the wait-for graph. The plain view (render.go) and --json
// (dumpjson.go) are two renderings of it.
type dumpState struct {
	Time     time.Time
	Path     string
	Size     int
	Geometry table.Geometry
	Buckets  int
	Bound    time.Duration // the table's fairness: 0 FIFO, else Bounded(Bound)
	Created  time.Time
	BootID   [16]byte
	ThisBoot bool
	Nonce    uint64
	Usage    table.Usage
	Agents   []dumpAgent
	// Held, Pending (per name in queue order) and Watching in the order
	// the table gave them (Snapshot, Watches): node i of Waits is Held[i],
	// node len(Held)+j is Pending[j]. The renderings sort them.
	Held, Pending, Watching []dumpLock
	// Waits is the wait-for graph of Held and Pending (in Snapshot's
	// order); Cycles its cycles in this one read (which may be phantoms
	// of a table that changed while it was read; --check reads twice).
	Waits  *waitgraph.Graph
	Cycles [][]int
}

// Agent states as dump shows them. An agent of shmlocks exec is co-owned
// by its command's process group (exec_unix.go): it lives while its own
// process (the wrapper) or that group runs.
const (
	agentAlive       = "alive"        // its process runs
	agentWrapperGone = "wrapper-gone" // its process is gone; its exec command's group runs and holds its locks
	agentDead        = "dead"         // its process (and group) are gone; not yet reaped
)

// dumpAgent is one agent record.
type dumpAgent struct {
	Index    uint32
	PID      int    // the process that registered it (shmlocks exec: the wrapper)
	State    string // agentAlive, agentWrapperGone, agentDead, "registering" or "invalid(N)"
	ClientID string
	Command  string // PID's command line; "" unless it runs and /proc tells
	Held     int
	Waiting  int
	Since    time.Time
	holder
}

// holder is the process that holds an agent's locks as it is: its own,
// or for shmlocks exec the command's (a process of the group co-owning
// the agent), whether or not the wrapper still runs.
type holder struct {
	ProcessAlive  bool   // PID's process runs (a dead PID is never shown as alive)
	Group         int    // the co-owner process group (exec's command), 0 none
	GroupAlive    bool   // a process of Group runs
	HolderPID     int    // the process holding the locks: Group's running member if any, else PID if it runs, else 0
	HolderCommand string // HolderPID's command line ("" unknown)
}

// dumpLock is one held lock, pending request or watch.
type dumpLock struct {
	table.LockInfo
	ClientID string
	// Agent is the state of the request's agent: agentAlive,
	// agentWrapperGone, agentDead (its process is gone, not yet reaped) or
	// "no agent" (a torn read).
	Agent string
	holder
}

// Dead reports whether the request's agent is gone (not yet reaped).
func (l *dumpLock) Dead() bool { return l.Agent != agentAlive && l.Agent != agentWrapperGone }

// Wrapper is the state of exec's wrapper for a request of a co-owned
// agent ("alive" or "gone"), "" for any other request.
func (h *holder) Wrapper() string {
	switch {
	case h.Group == 0:
		return ""
	case h.ProcessAlive:
		return "alive"
	}
	return "gone"
}

// agentHolder resolves who holds the locks of agent a. Of an agent in
// another PID namespace nothing can be told here (its PID is not ours).
func agentHolder(a *table.AgentInfo) holder {
	if a.OtherPidNS {
		return holder{}
	}
	h := holder{ProcessAlive: table.Alive(table.Identity{PID: a.PID, Start: a.Start, Boot: a.Boot})}
	if a.CoOwner != 0 {
		h.Group = a.CoOwner
		h.GroupAlive = table.GroupAlive(a.CoOwner, a.CoOwnerStart)
	}
	switch {
	case h.GroupAlive:
		h.HolderPID = groupMember(h.Group)
	case h.ProcessAlive:
		h.HolderPID = a.PID
	}
	if h.HolderPID != 0 {
		h.HolderCommand = procCmdline(h.HolderPID)
	}
	return h
}

// age is how long l has been held or waiting at now; ok false when the
// table has no time for it.
func (l *dumpLock) age(now time.Time) (time.Duration, bool) {
	if l.Since <= 0 {
		return 0, false
	}
	return max(0, now.Sub(time.Unix(0, l.Since))), true
}

// gatherDump reads t (mapped read-only, never latched) at now. A file
// truncated under us gives ErrCorrupt (table.Guard), never a fault.
func gatherDump(t *table.Table, path string, now time.Time) (*dumpState, error) {
	st := &dumpState{Time: now, Path: path, Size: t.Size(), Geometry: t.Geometry(), Buckets: t.Buckets(), Bound: t.Bound(), Nonce: t.Nonce()}
	err := table.Guard(func() error {
		st.Created, st.BootID = t.Created(), t.BootID() // read from the mapping
		st.ThisBoot = st.BootID == table.BootID()
		st.Usage = t.Usage()
		held, pending, err := t.Snapshot(nil)
		if err != nil {
			return err
		}
		watching := t.Watches()
		agents := t.Agents()
		byIdx := map[uint32]int{}
		for i, a := range agents {
			h := agentHolder(&a)
			state := agentDead
			switch {
			case a.State == table.AgentRegistering:
				state = "registering"
			case a.State != table.AgentAlive:
				state = fmt.Sprintf("invalid(%d)", a.State)
			case !a.Live(): // the kernel's word: its lock and keep-alive bytes are free
			case h.ProcessAlive || a.OtherPidNS:
				state = agentAlive
			default: // exec's wrapper died; its command (keep-alive descriptor, group) holds on
				state = agentWrapperGone
			}
			command := ""
			switch {
			case state != agentAlive:
			case a.OtherPidNS && a.PidNS != 0:
				// Its PID names a process of its own PID namespace (a
				// container): this process cannot see it.
				command = "(other pid ns)"
			case h.ProcessAlive: // else the PID may be another process's now
				command = procCmdline(a.PID)
			}
			byIdx[a.Index] = i
			st.Agents = append(st.Agents, dumpAgent{Index: a.Index, PID: a.PID, State: state,
				ClientID: inspect.ClientID(a.Nonce), Command: command, Since: a.Since, holder: h})
		}
		conv := func(in []table.LockInfo, count func(*dumpAgent)) []dumpLock {
			out := make([]dumpLock, 0, len(in))
			for _, li := range in {
				l := dumpLock{LockInfo: li, ClientID: inspect.ClientID(li.Nonce), Agent: "no agent"}
				if i, ok := byIdx[li.Agent]; ok {
					a := &st.Agents[i]
					l.Agent, l.holder = a.State, a.holder
					if l.Agent != agentAlive && l.Agent != agentWrapperGone {
						l.Agent = agentDead
					}
					if count != nil {
						count(a)
					}
				}
				out = append(out, l)
			}
			return out
		}
		st.Held = conv(held, func(a *dumpAgent) { a.Held++ })
		st.Pending = conv(pending, func(a *dumpAgent) { a.Waiting++ })
		st.Watching = conv(watching, nil)
		st.Waits = waitgraph.New(held, pending)
		st.Cycles = st.Waits.Cycles()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// modeName names a mode as the table stores it ("any": a watch for any
// change); a torn read of a slot being reused shows its number.
func modeName(m uint32) string {
	switch m {
	case table.ModeExclusive:
		return "exclusive"
	case table.ModeShared:
		return "shared"
	case table.ModeAny:
		return "any"
	}
	return fmt.Sprintf("mode(%d)", m)
}

// sortedHeld returns the indices of st.Held by name, then token.
func sortedHeld(st *dumpState) []int {
	idx := make([]int, len(st.Held))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		if c := cmp.Compare(st.Held[a].Name, st.Held[b].Name); c != 0 {
			return c
		}
		return cmp.Compare(st.Held[a].Token, st.Held[b].Token)
	})
	return idx
}

// sortedPending returns the indices of st.Pending by name, in queue order
// per name (Snapshot's order, kept by a stable sort).
func sortedPending(st *dumpState) []int {
	idx := make([]int, len(st.Pending))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(st.Pending[a].Name, st.Pending[b].Name) })
	return idx
}

// validMode reports whether m is a request's mode (not a torn read of a
// slot being reused).
func validMode(m uint32) bool { return m == table.ModeExclusive || m == table.ModeShared }

// fairnessText spells a table's fairness as Fairness.String and stress
// --fairness do ("fifo", "bounded:1ms").
func fairnessText(bound time.Duration) string {
	if bound == 0 {
		return "fifo"
	}
	return fmt.Sprintf("bounded:%v", bound)
}
