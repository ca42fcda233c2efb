package manager

import (
	"time"

	"github.com/shmlocks/shmlocks/table"
)

// reap reaps every dead agent, delivering the wakes.
func (m *Manager) reap() error {
	if !m.enter() {
		return ErrClosed
	}
	defer m.leave()
	err := table.Guard(func() error {
		var w table.Wakes
		n, err := m.life.t.ReapDead(m.life.a, &w)
		m.deliver(&w)
		if n > 0 {
			m.scanWaiters(true) // a dead agent may have granted to us and died before ringing
		}
		return err
	})
	m.noteErr("reap", err)
	return err
}

// reapOne reaps agent idx if it is dead.
func (m *Manager) reapOne(idx uint32) {
	m.reapAgent(idx, func() (bool, uint64) { return m.life.t.AgentDeadWord(idx) })
}

// reapAgent reaps agent idx if dead says it is dead, with the record's word.
func (m *Manager) reapAgent(idx uint32, dead func() (bool, uint64)) {
	if !m.enter() {
		return
	}
	defer m.leave()
	table.Guard(func() error {
		isDead, word := dead()
		if !isDead {
			return nil
		}
		var w table.Wakes
		err := m.life.t.Reap(m.life.a, idx, word, &w)
		m.deliver(&w)
		// The dead agent may have granted to us and died before ringing.
		m.scanWaiters(true)
		return err
	})
}

// reapHolders reaps the dead agents among name's holders and queue, so that
// an if-available request does not fail because of a process that is gone.
// It looks at most once a millisecond per Manager (a liveness check reads
// /proc) and reports whether it reaped anyone.
func (m *Manager) reapHolders(name string, h uint64) bool {
	now := time.Now().UnixNano()
	last := m.lastInWay.Load()
	if now-last < int64(time.Millisecond) || !m.lastInWay.CompareAndSwap(last, now) {
		return false
	}
	agents := m.life.t.AgentsInWay(m.life.a, name, h)
	reaped := false
	var w table.Wakes
	for _, idx := range agents {
		if dead, word := m.life.t.AgentDeadWord(idx); dead {
			if m.life.t.Reap(m.life.a, idx, word, &w) == nil {
				reaped = true
			}
		}
	}
	m.deliver(&w)
	return reaped
}
