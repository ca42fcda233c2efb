package tablemetrics

import (
	"cmp"
	"slices"
	"time"

	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/table"
)

// State is a summary of a table at one moment.
type State struct {
	Time     time.Time
	Geometry table.Geometry
	Usage    table.Usage
	// Agents counts the agent records in use; Dead those whose process is
	// gone and that nobody has reaped yet.
	Agents, Dead int
	// Names are the names held or waited for, sorted by longest wait
	// (longest first), then longest hold, then name.
	Names []Name
}

// Name is the state of one lock name.
type Name struct {
	Name    string
	Holders []Holder // by fencing token
	Waiting int      // queued requests
	// Exclusive and Shared count the queued requests by mode.
	WaitingExclusive, WaitingShared int
	// LongestWait is the age of the oldest queued request (0: none).
	LongestWait time.Duration
	// LongestHold is the age of the oldest grant.
	LongestHold time.Duration
}

// Holder is one held lock.
type Holder struct {
	Mode     uint32 // table.ModeExclusive or table.ModeShared
	Token    uint64
	PID      int
	ClientID string
	// Held is how long it has been held (a lock granted at once is
	// stamped from a coarse clock: up to about 0.1 s long); 0 only for a
	// fast grant a moment old, whose time is not written yet.
	Held  time.Duration
	Steal bool // granted by a steal
	Dead  bool // its agent is gone: its process (and exec group) gone, not yet reaped
	// ProcessAlive: PID's process runs. Group is the process group that
	// co-owns the holder's agent (shmlocks exec's command; 0 none), and
	// GroupAlive whether a process of it runs: an exec grant whose wrapper
	// (PID) died is held by that group.
	ProcessAlive bool
	Group        int
	GroupAlive   bool
}

// Gather reads t's state at now. A table truncated under us gives
// ErrCorrupt (table.Guard), never a fault.
func Gather(t *table.Table, now time.Time) (State, error) {
	st := State{Time: now, Geometry: t.Geometry()}
	err := table.Guard(func() error {
		st.Usage = t.Usage()
		type liveness struct {
			live, process, group bool
			pgid                 int
		}
		alive := map[uint32]liveness{}
		for _, a := range t.Agents() {
			st.Agents++
			// Alive on the kernel's word (Live); the process and group are
			// for people: which process holds the agent's locks. An agent
			// of another PID namespace counts as its own process (its PID
			// says nothing here).
			l := liveness{live: a.Live(), pgid: a.CoOwner}
			l.process = a.OtherPidNS || a.State == table.AgentAlive && table.Alive(table.Identity{PID: a.PID, Start: a.Start, Boot: a.Boot})
			l.group = a.State == table.AgentAlive && a.CoOwner != 0 && table.GroupAlive(a.CoOwner, a.CoOwnerStart)
			alive[a.Index] = l
			if !l.live && a.State == table.AgentAlive {
				st.Dead++
			}
		}
		held, pending, err := t.Snapshot(nil)
		if err != nil {
			return err
		}
		byName := map[string]*Name{}
		get := func(n string) *Name {
			if p := byName[n]; p != nil {
				return p
			}
			p := &Name{Name: n}
			byName[n] = p
			return p
		}
		age := func(since int64) time.Duration {
			if since <= 0 {
				return 0
			}
			return max(0, now.Sub(time.Unix(0, since)))
		}
		for _, li := range held {
			if li.Mode != table.ModeExclusive && li.Mode != table.ModeShared {
				continue // torn read of a slot being reused
			}
			n := get(li.Name)
			a := alive[li.Agent]
			h := Holder{Mode: li.Mode, Token: li.Token, PID: li.PID, ClientID: inspect.ClientID(li.Nonce),
				Held: age(li.Since), Steal: li.Steal, Dead: !a.live, ProcessAlive: a.process, Group: a.pgid, GroupAlive: a.group}
			n.Holders = append(n.Holders, h)
			n.LongestHold = max(n.LongestHold, h.Held)
		}
		for _, li := range pending {
			if li.Mode != table.ModeExclusive && li.Mode != table.ModeShared {
				continue
			}
			n := get(li.Name)
			n.Waiting++
			if li.Mode == table.ModeShared {
				n.WaitingShared++
			} else {
				n.WaitingExclusive++
			}
			n.LongestWait = max(n.LongestWait, age(li.Since))
		}
		st.Names = make([]Name, 0, len(byName))
		for _, n := range byName {
			slices.SortFunc(n.Holders, func(a, b Holder) int { return cmp.Compare(a.Token, b.Token) })
			st.Names = append(st.Names, *n)
		}
		slices.SortFunc(st.Names, func(a, b Name) int {
			if c := cmp.Compare(b.LongestWait, a.LongestWait); c != 0 {
				return c
			}
			if c := cmp.Compare(b.LongestHold, a.LongestHold); c != 0 {
				return c
			}
			return cmp.Compare(a.Name, b.Name)
		})
		return nil
	})
	return st, err
}

// LongestWait is the longest wait of any name.
func (s *State) LongestWait() time.Duration {
	var d time.Duration
	for _, n := range s.Names {
		d = max(d, n.LongestWait)
	}
	return d
}
