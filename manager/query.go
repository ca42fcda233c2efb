package manager

import (
	"context"
	"fmt"

	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/table"
)

// Snapshot is the state of the bucket at one moment: every agent's held
// locks and pending requests, pending in queue (grant) order per name.
type Snapshot struct {
	Held    []LockInfo `json:"held"`
	Pending []LockInfo `json:"pending"` // per name, in queue (grant) order
}

// LockInfo describes one held lock or pending request.
type LockInfo struct {
	Name     string `json:"name"`
	Mode     Mode   `json:"mode"` // marshals as "exclusive" / "shared"
	ClientID string `json:"clientId"`
	PID      int    `json:"pid"`
}

// Query returns a snapshot of every agent's held and pending requests in the
// bucket. Dead agents are reaped first, so the snapshot shows none of them.
func (m *Manager) Query(ctx context.Context) (Snapshot, error) {
	snap := Snapshot{Held: []LockInfo{}, Pending: []LockInfo{}}
	if m.unopened() {
		return snap, errNeverOpened
	}
	if m.life.closed.Load() {
		return snap, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return snap, fmt.Errorf("%w: query: %w", ErrAborted, err)
	}
	if m.life.be != nil {
		return m.queryBackend(ctx)
	}
	if err := m.reap(); err != nil {
		return snap, fmt.Errorf("query: %w", err)
	}
	if !m.enter() {
		return snap, ErrClosed
	}
	held, pending, err := m.life.t.Snapshot(m.life.a)
	m.leave()
	if err != nil {
		m.noteErr("query", err)
		return snap, fmt.Errorf("query: %w", err)
	}
	snap.Held = convertInfos(held)
	snap.Pending = convertInfos(pending)
	return snap, nil
}

func convertInfos(in []table.LockInfo) []LockInfo {
	out := make([]LockInfo, len(in))
	for i, li := range in {
		out[i] = LockInfo{Name: li.Name, Mode: Mode(li.Mode), ClientID: inspect.ClientID(li.Nonce), PID: li.PID}
	}
	return out
}
