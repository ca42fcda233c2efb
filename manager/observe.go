package manager

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/table"
)

// Observing a name without requesting it: State reads it, WaitUnlocked waits
// until a request would be granted, Watch follows every change. None of them
// takes part in grants: no request is granted sooner or later, and no token
// is consumed, because of them (docs/watch.md).
//
// WaitUnlocked and Watch register a watch in the table: a request slot of
// this agent in state WATCHING, linked into the name's watch list. Whoever
// changes a watched name's holders or queue (under its bucket latch) bumps
// the entry's gen word and rings the watching agents like a grant rings a
// waiter; the bell loop (scanObservers) compares each watch's gen with the
// last one its goroutine saw and pokes it only when it moved. A watcher
// counts as parked while it waits, so that the ring sends a doorbell byte.

// NameState is the state of one name at one instant: who holds it and who
// waits for it.
type NameState struct {
	Name     string         `json:"name"`
	Held     []RequestState `json:"held"`     // the holders (never nil)
	Pending  []RequestState `json:"pending"`  // the waiting requests, in queue (grant) order (never nil)
	Watchers int            `json:"watchers"` // WaitUnlocked and Watch calls on the name, all agents together
}

// RequestState describes one holder or waiting request of a name.
type RequestState struct {
	Mode     Mode   `json:"mode"`
	ClientID string `json:"clientId"`
	PID      int    `json:"pid"`
	// Token is a holder's fencing token (0 for a pending request).
	Token uint64 `json:"token,omitempty"`
	// Since: when a pending request was enqueued, or when a holder was
	// granted. A lock granted at once is stamped from a coarse clock (no
	// clock read on the uncontended path): up to about 0.1 s early. Zero
	// only for a fast grant caught before it wrote its stamp.
	Since time.Time `json:"since"`
}

// Locked reports whether anyone holds the name.
func (s NameState) Locked() bool { return len(s.Held) > 0 }

// Grantable reports whether a request in mode would have been granted at
// once in this state: nothing queued, and nothing held (or, for a shared
// request, only shared holders). On a table of bounded fairness
// (Manager.Fairness) a request may also be granted ahead of a queue, while
// its head has waited less than the bound, which a state does not show;
// WaitUnlocked does see it.
func (s NameState) Grantable(mode Mode) bool {
	if len(s.Pending) > 0 {
		return false
	}
	for _, h := range s.Held {
		if mode != Shared || h.Mode != Shared {
			return false
		}
	}
	return true
}

// State returns the state of name: its holders and its queue. It changes
// nothing: it takes no lock, allocates no table entry for a name that has
// none, and leaves a lock taken by the uncontended path as it is (it reads
// under the name's bucket latch, for a few hundred nanoseconds). Validation
// is Request's (closed, name, ctx). A dead holder is shown until it is reaped.
func (m *Manager) State(ctx context.Context, name string) (NameState, error) {
	st := NameState{Name: name, Held: []RequestState{}, Pending: []RequestState{}}
	if m.life.be != nil {
		return m.stateBackend(ctx, name)
	}
	if err := m.validate(ctx, name, RequestOptions{}); err != nil {
		return st, err
	}
	if !m.enter() {
		return st, ErrClosed
	}
	ni, err := m.life.t.Name(m.life.a, name, table.Hash(name))
	m.leave()
	if err != nil {
		return st, fmt.Errorf("state of lock %q: %w", name, err)
	}
	return nameState(name, &ni), nil
}

func nameState(name string, ni *table.NameInfo) NameState {
	st := NameState{Name: name, Held: requestStates(ni.Held), Pending: requestStates(ni.Pending), Watchers: len(ni.Watchers)}
	return st
}

func requestStates(in []table.LockInfo) []RequestState {
	out := make([]RequestState, len(in))
	for i, li := range in {
		out[i] = RequestState{Mode: Mode(li.Mode), ClientID: inspect.ClientID(li.Nonce), PID: li.PID, Token: li.Token}
		if li.Since > 0 {
			out[i].Since = time.Unix(0, li.Since)
		}
	}
	return out
}

// WaitUnlocked returns nil as soon as a request in mode on name would have
// been granted at that instant (nothing held that is incompatible with
// mode, nothing queued), without requesting anything: the name's queue,
// its tokens and other agents' IfAvailable requests are untouched, and
// nothing is held when it returns (so the name may be taken again at once;
// this is the waitForUnlock of Web Locks users, not a lock). It is woken by
// the release, abort or reap that makes the condition true, never by polling
// (on Linux; with shmlocks_poll the doorbell itself is polled). ctx ends it
// with an error matching ErrAborted and ctx.Err(), leaving the table as if
// it had never come. Validation is Request's: closed, then name and mode,
// then ctx. While it waits it uses one request slot (ErrTableFull when none
// is free).
func (m *Manager) WaitUnlocked(ctx context.Context, name string, mode Mode) error {
	if m.life.be != nil {
		return m.waitUnlockedBackend(ctx, name, mode)
	}
	if err := m.validate(ctx, name, RequestOptions{Mode: mode}); err != nil {
		return err
	}
	h := table.Hash(name)
	// The first look needs no slot.
	if !m.enter() {
		return ErrClosed
	}
	ready, err := m.life.t.Ready(m.life.a, name, h, uint32(mode))
	m.leave()
	if err != nil || ready {
		return wrapName("wait for lock", name, err)
	}
	o, err := m.observe(name, h, uint32(mode))
	if err != nil || o == nil {
		return wrapName("wait for lock", name, err)
	}
	defer m.unobserve(o)
	for {
		out, err := o.check(m)
		if err != nil || out == table.WatchRemoved {
			return wrapName("wait for lock", name, err)
		}
		select {
		case <-o.ch:
		case <-ctx.Done():
			return fmt.Errorf("%w: wait for lock %q: %w", ErrAborted, name, ctx.Err())
		case <-m.life.closing:
			return fmt.Errorf("wait for lock %q: %w", name, ErrClosed)
		}
	}
}

// Watch follows name: the returned channel first receives the name's
// current state, then every change of its holders or queue (a grant, an
// enqueue, a release, an abort, a steal, a reap). The channel holds one
// state: a reader that falls behind misses intermediate states but always
// receives the latest one (a pending state is replaced by a newer one). It
// is closed when ctx ends, when the Manager closes, or when the watch is
// lost (the table is corrupt, or this agent was reaped). Changes are pushed
// by whoever makes them, never polled for (on Linux; see WaitUnlocked).
// The watch uses one request slot and keeps the name's table entry while
// it lasts (ErrTableFull when none is free); it never affects grants or
// tokens, but a watched name's locks take the latched path instead of the
// uncontended one.
func (m *Manager) Watch(ctx context.Context, name string) (<-chan NameState, error) {
	if m.life.be != nil {
		return m.watchBackend(ctx, name)
	}
	if err := m.validate(ctx, name, RequestOptions{}); err != nil {
		return nil, err
	}
	o, err := m.observe(name, table.Hash(name), table.ModeAny)
	if err != nil {
		return nil, wrapName("watch lock", name, err)
	}
	out := make(chan NameState, 1)
	go m.follow(ctx, o, out)
	return out, nil
}

// follow is Watch's goroutine: it reads the name's state each time its gen
// moved and publishes it in out, replacing a state the reader has not taken.
func (m *Manager) follow(ctx context.Context, o *observer, out chan NameState) {
	defer close(out)
	defer m.unobserve(o)
	first := true
	var last uint32
	for {
		if !m.enter() {
			return
		}
		var ni table.NameInfo
		ok, read := false, false
		err := table.Guard(func() error {
			var err error
			gen, found := m.life.t.WatchGen(m.life.a, o.ref)
			if ok = found; !ok {
				return nil
			}
			if read = first || gen != last; read {
				ni, err = m.life.t.Name(m.life.a, o.name, table.Hash(o.name))
				o.looks.Add(1)
				m.obs.looks.Add(1)
			}
			return err
		})
		m.leave()
		if !ok {
			o.linked = false // reaped (this agent was taken for dead)
			return
		}
		if err != nil {
			return
		}
		if read {
			// ni.Gen, read under the latch with the state, is what this
			// state is for; a change after it moves gen and pokes us.
			first, last = false, ni.Gen
			o.gen.Store(last)
			select {
			case <-out: // the reader has not taken the previous state: replace it
			default:
			}
			out <- nameState(o.name, &ni) // never blocks: we are the only sender
			continue                      // gen may have moved before we stored it
		}
		select {
		case <-o.ch:
		case <-ctx.Done():
			return
		case <-m.life.closing:
			return
		}
	}
}

// observer is one registered watch of this Manager.
type observer struct {
	ref    table.Ref
	name   string
	gen    atomic.Uint32 // the entry's gen its goroutine last acted on
	ch     chan struct{} // buffered(1): "gen moved, look again"
	looks  atomic.Int64  // latched looks at the table (tests)
	linked bool          // still linked in the table (the goroutine's own)
}

// observers is the Manager's registry of watches, by slot.
type observers struct {
	n     atomic.Int32 // registered watches: scanObservers costs one load when none
	looks atomic.Int64 // latched looks by all observers (tests: no polling)
	mu    sync.Mutex
	m     map[uint32]*observer
}

// observe registers a watch of name in mode (ModeAny: every change). It
// returns nil, nil when mode is not ModeAny and a request in it would be
// granted at once (nothing is left in the table).
func (m *Manager) observe(name string, h uint64, mode uint32) (o *observer, err error) {
	defer table.EndGuard(table.BeginGuard(), &err, m.wk.faultFn)
	ref, err := m.life.t.Claim(m.life.a, h)
	if err != nil {
		return nil, err
	}
	if m.life.closed.Load() || !m.enter() {
		m.life.t.FreeClaimed(m.life.a, ref)
		return nil, ErrClosed
	}
	defer m.leave()
	o = &observer{ref: ref, name: name, ch: make(chan struct{}, 1), linked: true}
	// Counted as parked before it is linked: whoever changes the name after
	// the link reads parked after its change, and sends the doorbell byte.
	atomic.AddUint32(m.life.a.Parked(), 1)
	m.obs.mu.Lock()
	if m.obs.m == nil {
		m.obs.m = map[uint32]*observer{}
	}
	m.obs.m[ref.Slot] = o
	m.obs.n.Add(1)
	m.obs.mu.Unlock()
	var w table.Wakes
	out, err := m.life.t.Watch(m.life.a, ref, name, h, mode, time.Now().UnixNano(), &w)
	m.deliver(&w)
	if err != nil || out != table.WatchLinked {
		o.linked = false
		m.drop(o)
		return nil, err
	}
	m.reaper.Kick() // watch the other agents' processes: a dead holder is reaped
	return o, nil
}

// check looks at o's watch under the latch: WatchRemoved when its condition
// holds (the watch was removed). It records the gen it acted on, and looks
// again if gen moved meanwhile, so that a change is never missed between
// the look and the wait.
func (o *observer) check(m *Manager) (out table.WatchOutcome, err error) {
	defer table.EndGuard(table.BeginGuard(), &err, m.wk.faultFn)
	for {
		if !m.enter() {
			return table.WatchRemoved, ErrClosed
		}
		var w table.Wakes
		out, gen, err := m.life.t.WatchCheck(m.life.a, o.ref, &w)
		m.deliver(&w)
		o.looks.Add(1)
		m.obs.looks.Add(1)
		if err != nil || out == table.WatchRemoved {
			m.leave()
			if err == nil || err == table.ErrNotHeld {
				o.linked = false // removed because its condition held, or by a reaper of ours
			}
			if err == table.ErrNotHeld {
				err = fmt.Errorf("watch removed from the table (agent reaped?): %w", ErrStolen)
			}
			return table.WatchRemoved, err
		}
		o.gen.Store(gen)
		now, ok := m.life.t.WatchGen(m.life.a, o.ref)
		m.leave()
		if ok && now == gen {
			return table.WatchLinked, nil
		}
	}
}

// unobserve removes o's watch from the table if it is still linked (ctx
// ended, or the Manager closes: then Close's deregistration removes it) and
// from the registry.
func (m *Manager) unobserve(o *observer) {
	if o.linked && m.enter() {
		table.Guard(func() error {
			var w table.Wakes
			m.life.t.Unwatch(m.life.a, o.ref, &w)
			m.deliver(&w)
			return nil
		})
		m.leave()
	}
	o.linked = false
	m.drop(o)
}

// drop unregisters o and stops counting it as parked.
func (m *Manager) drop(o *observer) {
	m.obs.mu.Lock()
	if m.obs.m[o.ref.Slot] == o {
		delete(m.obs.m, o.ref.Slot)
		m.obs.n.Add(-1)
		if !m.life.closed.Load() { // after Close the record may be another agent's
			// Guarded: the file may have been truncated under us.
			table.Guard(func() error { atomic.AddUint32(m.life.a.Parked(), ^uint32(0)); return nil })
		}
	}
	m.obs.mu.Unlock()
}

// scanObservers pokes every watch whose entry's gen moved since its
// goroutine last looked (or whose watch is gone). Called by the bell loop
// with the waiters' scan; one atomic load when nothing is watched.
func (m *Manager) scanObservers() {
	if m.obs.n.Load() == 0 {
		return
	}
	m.obs.mu.Lock()
	defer m.obs.mu.Unlock() // also when a read of a truncated file faults (Guard)
	for _, o := range m.obs.m {
		if gen, ok := m.life.t.WatchGen(m.life.a, o.ref); !ok || gen != o.gen.Load() {
			o.poke()
		}
	}
}

// pokeObservers asks every watch's goroutine to look again (a fault).
func (m *Manager) pokeObservers() {
	m.obs.mu.Lock()
	for _, o := range m.obs.m {
		o.poke()
	}
	m.obs.mu.Unlock()
}

func (o *observer) poke() {
	select {
	case o.ch <- struct{}{}:
	default:
	}
}

// watching reports whether this Manager has registered watches (the
// reaper then watches the other agents, as for waiting requests).
func (m *Manager) watching() bool { return m.obs.n.Load() > 0 }

// wrapName wraps a non-nil err with what was done and the name.
func wrapName(what, name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s %q: %w", what, name, err)
}
