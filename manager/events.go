package manager

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/shmlocks/shmlocks/table"
)

// Events an operator cares about go to OpenOptions.Logger (default: a
// discarding logger) and to the statistics (OpenOptions.Stats):
//
//	event            level  message                    attributes
//	dead agent reaped  WARN  "shmlocks: reaped a dead agent"        table, agent, pid
//	latch taken over   WARN  "shmlocks: took over a bucket latch from a dead owner; bucket rebuilt"  table, bucket
//	corrupt table      ERROR "shmlocks: corrupt lock table"          table, op, err
//	steal (stealer)    INFO  "shmlocks: lock stolen from its holders" table, lock, token
//	steal (victim)     WARN  "shmlocks: held lock taken away"         table, lock, token
//
// None of them is on the uncontended path. The table package does not log:
// it reports reaps and repairs through its event hook (table.SetEventHook),
// called on its cold paths. Corrupt-table records are limited to one per
// corruptLogEvery per Manager (a corrupt file fails every request), each
// saying how many were left out before it.

const corruptLogEvery = time.Second

// eventLog is a Manager's logger and its corrupt-table rate limit.
type eventLog struct {
	l          *slog.Logger
	path       string
	lastCorr   atomic.Int64 // unix ns of the last corrupt-table record
	suppressed atomic.Int64 // corrupt-table records left out since then
}

var discard = slog.New(slog.DiscardHandler)

// tableEvent is the table's event hook (see table.SetEventHook). It may be
// called with a bucket latch held: it counts and logs, nothing more.
func (m *Manager) tableEvent(e table.Event) {
	switch e.Kind {
	case table.EventReap:
		if s := m.stats; s != nil {
			s.reaps.Add(1)
		}
		m.log.l.LogAttrs(context.Background(), slog.LevelWarn, "shmlocks: reaped a dead agent",
			slog.String("table", m.log.path), slog.Uint64("agent", uint64(e.Agent)), slog.Int("pid", e.PID))
	case table.EventRepair:
		if s := m.stats; s != nil {
			s.repairs.Add(1)
		}
		m.log.l.LogAttrs(context.Background(), slog.LevelWarn, "shmlocks: took over a bucket latch from a dead owner; bucket rebuilt",
			slog.String("table", m.log.path), slog.Uint64("bucket", uint64(e.Bucket)))
	}
}

// noteErr counts and logs err if it says the table is corrupt (or was
// truncated under us). op names the operation that met it.
func (m *Manager) noteErr(op string, err error) { m.log.corrupt(m.stats, op, err) }

// corrupt counts (in s, if not nil) and logs err if it is ErrCorrupt.
func (e *eventLog) corrupt(s *stats, op string, err error) {
	if err == nil || !errors.Is(err, ErrCorrupt) {
		return
	}
	if s != nil {
		s.corrupt.Add(1)
	}
	if e.l == nil || !e.l.Enabled(context.Background(), slog.LevelError) {
		return
	}
	now := time.Now().UnixNano()
	last := e.lastCorr.Load()
	if now-last < int64(corruptLogEvery) || !e.lastCorr.CompareAndSwap(last, now) {
		e.suppressed.Add(1)
		return
	}
	e.l.LogAttrs(context.Background(), slog.LevelError, "shmlocks: corrupt lock table",
		slog.String("table", e.path), slog.String("op", op), slog.String("err", err.Error()),
		slog.Int64("suppressed", e.suppressed.Swap(0)))
}

// noteSteal records a granted Steal request (the stealer's side).
func (m *Manager) noteSteal(name string, token uint64) {
	if s := m.stats; s != nil {
		s.steals.Add(1)
	}
	m.log.l.LogAttrs(context.Background(), slog.LevelInfo, "shmlocks: lock stolen from its holders",
		slog.String("table", m.log.path), slog.String("lock", name), slog.Uint64("token", token))
}

// noteLost records a lock of ours taken away by a steal or a reap (the
// victim's side).
func (m *Manager) noteLost(l *Lock) {
	if s := m.stats; s != nil {
		s.lost.Add(1)
	}
	m.log.l.LogAttrs(context.Background(), slog.LevelWarn, "shmlocks: held lock taken away",
		slog.String("table", m.log.path), slog.String("lock", l.name), slog.Uint64("token", l.token))
}
