package main

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"math"
	"time"
	"unicode/utf8"

	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/table"
)

// The schema of `shmlocks dump --json` (docs/cli.md). "held" and "pending"
// keep the fields of manager.Snapshot (name, mode, clientId, pid) and add
// to them; everything the plain view shows is there. Names are exact: a
// name that is not valid UTF-8 (which JSON strings cannot carry) has its
// bytes in nameBase64 beside name (name then has U+FFFD for each invalid
// byte).

type jsonDump struct {
	Time      time.Time     `json:"time"` // when the table was read
	Table     string        `json:"table"`
	Fairness  string        `json:"fairness"` // "fifo" or "bounded:DURATION"
	Held      []jsonHeld    `json:"held"`     // by name, then token
	Pending   []jsonPending `json:"pending"`  // by name, in queue (grant) order
	Watching  []jsonPending `json:"watching"`
	Agents    []jsonAgent   `json:"agents"`
	Usage     jsonUsage     `json:"usage"`
	WaitsFor  []jsonWait    `json:"waitsFor"`  // one per pending request, in "pending" order
	Deadlocks [][]jsonNode  `json:"deadlocks"` // wait-for cycles in this read (may be phantoms; --check confirms)
}

// jsonName is a lock name, lossless.
type jsonName struct {
	Name       string `json:"name"`
	NameBase64 string `json:"nameBase64,omitempty"` // the exact bytes, when the name is not valid UTF-8
}

func newJSONName(n string) jsonName {
	j := jsonName{Name: n}
	if !utf8.ValidString(n) {
		j.NameBase64 = base64.StdEncoding.EncodeToString([]byte(n))
	}
	return j
}

// jsonHolder says who holds a request as it is (dumpstate.go's holder):
// "pid" (the Query field) is the process that made the request; for
// shmlocks exec that is the wrapper, and the lock is held by its command's
// process group.
type jsonHolder struct {
	Process   string `json:"process"`           // "alive" or "gone": pid's process runs or not
	HolderPID int    `json:"holderPid"`         // the process holding it: exec's command, else pid; 0 when none runs
	Command   string `json:"command"`           // holderPid's command line; "" when unknown
	Group     int    `json:"group,omitempty"`   // exec: the command's process group, which co-owns the request
	Wrapper   string `json:"wrapper,omitempty"` // exec: "alive" or "gone" (the wrapper, pid, died; the command holds on)
}

func newJSONHolder(h *holder) jsonHolder {
	p := "gone"
	if h.ProcessAlive {
		p = "alive"
	}
	return jsonHolder{Process: p, HolderPID: h.HolderPID, Command: h.HolderCommand, Group: h.Group, Wrapper: h.Wrapper()}
}

type jsonHeld struct {
	jsonName
	Mode        string  `json:"mode"`
	ClientID    string  `json:"clientId"`
	PID         int     `json:"pid"`
	Token       uint64  `json:"token"`
	HeldSeconds float64 `json:"heldSeconds"` // 0 for a fast grant a moment old (its time not yet written)
	Steal       bool    `json:"steal"`       // granted by a steal
	Dead        bool    `json:"dead"`        // its agent is gone: its process (and exec group) gone, not yet reaped
	jsonHolder
}

type jsonPending struct {
	jsonName
	Mode           string  `json:"mode"` // watching: also "any"
	ClientID       string  `json:"clientId"`
	PID            int     `json:"pid"`
	WaitingSeconds float64 `json:"waitingSeconds"`
	Dead           bool    `json:"dead"`
	jsonHolder
}

type jsonAgent struct {
	Index             uint32    `json:"index"`
	PID               int       `json:"pid"`
	ClientID          string    `json:"clientId"`
	State             string    `json:"state"`   // alive, wrapper-gone (exec's group holds on), dead, registering, invalid(N)
	Command           string    `json:"command"` // pid's command line, "" when it is gone
	Held              int       `json:"held"`
	Waiting           int       `json:"waiting"`
	Registered        time.Time `json:"registered"`
	RegisteredSeconds float64   `json:"registeredSeconds"`
	Group             int       `json:"group,omitempty"`         // exec: the command's process group (co-owner)
	HolderPID         int       `json:"holderPid"`               // the process holding its locks (exec: the command's), 0 none
	HolderCommand     string    `json:"holderCommand,omitempty"` // its command line
}

type jsonUsage struct {
	Names         int    `json:"names"` // held or waited for
	NamesIdle     int    `json:"namesIdle"`
	NamesLimit    int    `json:"namesLimit"`
	Requests      int    `json:"requests"` // request slots in use
	RequestsLimit int    `json:"requestsLimit"`
	Held          int    `json:"held"`
	Waiting       int    `json:"waiting"`
	Watching      int    `json:"watching"`
	Claimed       int    `json:"claimed"` // claimed or stolen slots, in no list
	Agents        int    `json:"agents"`
	AgentsDead    int    `json:"agentsDead"`
	AgentsLimit   int    `json:"agentsLimit"`
	Reaps         uint64 `json:"reaps"`
	Repairs       uint64 `json:"repairs"`
}

// jsonNode names one request of the wait-for graph.
type jsonNode struct {
	jsonName
	Mode     string `json:"mode"`
	ClientID string `json:"clientId"`
	PID      int    `json:"pid"`
	Held     bool   `json:"held"` // a held lock (else a pending request)
}

type jsonWait struct {
	jsonNode
	// WaitsFor is every request holding its name or queued ahead of it on
	// its name whose mode conflicts with its own, as pg_blocking_pids
	// (blockers; empty: about to be granted).
	WaitsFor []jsonNode `json:"waitsFor"`
}

// seconds rounds a duration to milliseconds.
func seconds(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }

// dumpJSON converts st to the --json schema.
func dumpJSON(st *dumpState) *jsonDump {
	d := &jsonDump{Time: st.Time.UTC(), Table: st.Path, Fairness: fairnessText(st.Bound), Held: []jsonHeld{}, Pending: []jsonPending{},
		Watching: []jsonPending{}, Agents: []jsonAgent{}, WaitsFor: []jsonWait{}, Deadlocks: [][]jsonNode{}}
	node := func(l *table.LockInfo, held bool) jsonNode {
		return jsonNode{jsonName: newJSONName(l.Name), Mode: modeName(l.Mode), ClientID: inspect.ClientID(l.Nonce), PID: l.PID, Held: held}
	}
	for _, i := range sortedHeld(st) {
		l := &st.Held[i]
		if !validMode(l.Mode) {
			continue // torn read of a slot being reused
		}
		age, _ := l.age(st.Time)
		d.Held = append(d.Held, jsonHeld{jsonName: newJSONName(l.Name), Mode: modeName(l.Mode), ClientID: l.ClientID,
			PID: l.PID, Token: l.Token, HeldSeconds: seconds(age), Steal: l.Steal, Dead: l.Dead(), jsonHolder: newJSONHolder(&l.holder)})
	}
	pend := func(l *dumpLock) jsonPending {
		age, _ := l.age(st.Time)
		return jsonPending{jsonName: newJSONName(l.Name), Mode: modeName(l.Mode), ClientID: l.ClientID, PID: l.PID,
			WaitingSeconds: seconds(age), Dead: l.Dead(), jsonHolder: newJSONHolder(&l.holder)}
	}
	g := st.Waits
	blocking := blockers(g)
	for _, i := range sortedPending(st) {
		if !validMode(st.Pending[i].Mode) {
			continue
		}
		d.Pending = append(d.Pending, pend(&st.Pending[i]))
		n := g.NHeld + i
		w := jsonWait{jsonNode: node(&g.Nodes[n], false), WaitsFor: []jsonNode{}}
		for _, j := range blocking[i] {
			w.WaitsFor = append(w.WaitsFor, node(&g.Nodes[j], g.Held(j)))
		}
		d.WaitsFor = append(d.WaitsFor, w)
	}
	for i := range st.Watching {
		d.Watching = append(d.Watching, pend(&st.Watching[i]))
	}
	dead := 0
	for _, a := range st.Agents {
		if a.State == agentDead {
			dead++
		}
		d.Agents = append(d.Agents, jsonAgent{Index: a.Index, PID: a.PID, ClientID: a.ClientID, State: a.State,
			Command: a.Command, Held: a.Held, Waiting: a.Waiting, Registered: a.Since.UTC(),
			RegisteredSeconds: seconds(st.Time.Sub(a.Since)), Group: a.Group, HolderPID: a.HolderPID, HolderCommand: a.HolderCommand})
	}
	for _, c := range st.Cycles {
		cyc := []jsonNode{}
		for _, i := range c {
			cyc = append(cyc, node(&g.Nodes[i], g.Held(i)))
		}
		d.Deadlocks = append(d.Deadlocks, cyc)
	}
	u, geo := st.Usage, st.Geometry
	d.Usage = jsonUsage{Names: u.Entries, NamesIdle: u.Idle, NamesLimit: geo.MaxResources, Requests: u.Slots,
		RequestsLimit: geo.MaxRequests, Held: u.Held, Waiting: u.Waiting, Watching: u.Watching, Claimed: u.Claimed,
		Agents: u.Agents, AgentsDead: dead, AgentsLimit: geo.MaxAgents, Reaps: u.Reaps, Repairs: u.Repairs}
	return d
}

// writeDumpJSON writes st as one JSON document: indented, or on one line
// (--watch --json: one line per refresh).
func writeDumpJSON(w io.Writer, st *dumpState, oneLine bool) error {
	var b []byte
	var err error
	if oneLine {
		b, err = json.Marshal(dumpJSON(st))
	} else {
		b, err = json.MarshalIndent(dumpJSON(st), "", "  ")
	}
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
