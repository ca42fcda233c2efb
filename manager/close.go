package manager

import (
	"fmt"
	"time"

	"github.com/shmlocks/shmlocks/table"
)

// Close releases every lock the Manager holds (their Lost channels close and
// a later Release returns an error), aborts its pending requests with
// ErrClosed, deregisters the agent and unmaps the table. A second Close
// returns nil. Close of a zero Manager (never opened) returns an error
// matching ErrClosed.
func (m *Manager) Close() error {
	if m.unopened() {
		return errNeverOpened
	}
	if m.life.closed.Swap(true) {
		return nil
	}
	if m.life.be != nil {
		return m.closeBackend()
	}
	close(m.life.closing)
	// Wake every parked request: it sees closed at its next look and
	// returns ErrClosed. (A parked request does not wait on closing: a
	// channel every parked goroutine selects on is a lock they all take
	// at every park and wake-up.)
	m.pokeAll()
	m.waits.mu.Lock()
	m.stopDones() // a park after this one sees closed and does not register
	m.waits.mu.Unlock()
	// A fault on the mapping (the file truncated under us) may have
	// unwound an operation between enter and leave: the count is then not
	// to be trusted, so the wait is bounded like the one below.
	for start := time.Now(); m.life.inflight.Load() != 0; {
		if m.life.faulted.Load() && time.Since(start) > time.Second {
			break
		}
		time.Sleep(10 * time.Microsecond)
	}
	// Parked requests were poked: each sees closed, takes itself off the
	// agent's parked count and leaves. Wait for them (bounded) before the
	// record is freed: a decrement after that would land in the record of
	// the next Manager to register there, whose count would read one low
	// (a grant to its parked request would then skip the doorbell).
	pollUntil(time.Second, func() bool { return m.parkedWaiters() == 0 })
	// The uncontended path of acquire is not counted in flight: wait until
	// no request of ours is between claiming its slot and its outcome (a
	// few hundred nanoseconds; bounded in case the slot words are garbage).
	// A fast acquire claims nothing: it looks at closed after its CAS and
	// gives the lock back itself if it finds it set, while Deregister
	// releases every fast hold it finds (see acquire).
	pollUntil(time.Second, func() bool { return m.life.t.ClaimsSettled(m.life.a) })
	m.reaper.Stop()
	m.bell.Close()
	m.life.bg.Wait()
	// The watched locks are lost before the table lets anyone else have
	// their names: their Lost channels close, fn's ctxs are cancelled and
	// their child grants end first.
	m.held.takeAll(func(l *Lock) { l.markLost(l.state.Load(), lockClosed) })
	var w table.Wakes
	err := table.Guard(func() error {
		err := m.life.t.Deregister(m.life.a, &w)
		m.deliver(&w)
		return err
	})
	// The descriptor is closed now; the mapping stays until the Manager is
	// garbage (a cleanup registered by Open unmaps it), so that a Release
	// racing with this Close reads valid memory: it finds its slot freed by
	// the deregistration and does nothing.
	if cerr := m.life.t.CloseFile(); err == nil {
		err = cerr
	}
	return err
}

// noteFault records that a read of the mapping faulted (the file was
// truncated under us): the in-flight count may be off (Close stops trusting
// it), and every parked request is poked, to meet the fault in its own
// guarded goroutine and return ErrCorrupt.
func (m *Manager) noteFault() {
	m.life.faulted.Store(true)
	m.noteErr("read", fmt.Errorf("%w: a read of the mapping faulted (file truncated under us?)", ErrCorrupt))
	m.pokeAll()
}
