package table

import (
	"math/rand/v2"
	"slices"
	"sort"
)

// The reference of TestModel*: Web Locks' semantics for one table, kept
// apart from the table's code (model_test.go runs both side by side).

// model is the reference semantics of Web Locks for one table.
type model struct {
	held  map[string][]mreq // name -> holders
	queue map[string][]mreq // name -> waiting, in order
	last  map[string]uint64 // name -> last token seen
}

type mreq struct {
	agent   int
	mode    uint32
	id      int  // test-wide request id
	starved bool // bounded: has waited the bound (aged by the test)
}

func newModel() *model {
	return &model{held: map[string][]mreq{}, queue: map[string][]mreq{}, last: map[string]uint64{}}
}

func (m *model) compatible(name string, mode uint32) bool {
	h := m.held[name]
	if len(h) == 0 {
		return true
	}
	return mode == ModeShared && h[0].mode == ModeShared
}

// process grants the head of the queue while compatible; returns the ids granted.
func (m *model) process(name string) []int {
	var granted []int
	for len(m.queue[name]) > 0 {
		r := m.queue[name][0]
		if !m.compatible(name, r.mode) {
			break
		}
		m.queue[name] = m.queue[name][1:]
		m.held[name] = append(m.held[name], r)
		granted = append(granted, r.id)
		if r.mode == ModeExclusive {
			break
		}
	}
	return granted
}

func (m *model) remove(name string, id int) {
	m.held[name] = slices.DeleteFunc(m.held[name], func(r mreq) bool { return r.id == id })
	m.queue[name] = slices.DeleteFunc(m.queue[name], func(r mreq) bool { return r.id == id })
}

// live is a request of the run: its agent, name and Ref in the table, and
// its id in the model.
type live struct {
	agent int
	name  string
	ref   Ref
	id    int
}

// pick chooses a random request of agent ai that is held (or waiting).
func pick(rng *rand.Rand, reqs map[int]*live, mdl *model, ai int, held bool) (int, *live) {
	var ids []int
	for id, r := range reqs {
		if r.agent != ai {
			continue
		}
		isHeld := slices.ContainsFunc(mdl.held[r.name], func(m mreq) bool { return m.id == id })
		if isHeld == held {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return 0, nil
	}
	sort.Ints(ids)
	id := ids[rng.IntN(len(ids))]
	return id, reqs[id]
}
