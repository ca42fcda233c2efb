package manager

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"runtime"

	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/manager/internal/wake"
	"github.com/shmlocks/shmlocks/table"
)

// Open maps the lock table at path, creating it with the geometry in opts
// when it does not exist, and registers the calling process as a new agent.
// opts may be nil (defaults). Open also reaps agents whose process is gone,
// and resets the agents of a table that outlived a reboot.
func Open(path string, opts *OpenOptions) (*Manager, error) {
	var o OpenOptions
	if opts != nil {
		o = *opts
	}
	g := table.Geometry{
		MaxResources: orDefault(o.MaxResources, DefaultMaxResources),
		MaxRequests:  orDefault(o.MaxRequests, DefaultMaxRequests),
		MaxAgents:    orDefault(o.MaxAgents, DefaultMaxAgents),
		MaxNameLen:   orDefault(o.MaxNameLen, DefaultMaxNameLen),
	}
	spin := o.SpinLimit
	if spin == 0 {
		spin = defaultSpin
	}
	deadlock := o.DeadlockDelay
	if deadlock == 0 {
		deadlock = DefaultDeadlockDelay
	}
	if err := checkTablePath(path); err != nil { // path.go
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := o.Fairness.validate(); err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	t, _, err := table.OpenFair(path, g, o.FileMode, o.Fairness.tableBound())
	if err != nil {
		(&eventLog{l: o.Logger, path: path}).corrupt(nil, "open", err)
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := checkOpenedTable(path, t); err != nil {
		t.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	var nb [8]byte
	if _, err := rand.Read(nb[:]); err != nil {
		t.Close()
		return nil, err
	}
	nonce := binary.NativeEndian.Uint64(nb[:]) | 1
	m := &Manager{
		life: lifecycle{
			t:        t,
			maxName:  t.Geometry().MaxNameLen,
			path:     path,
			clientID: inspect.ClientID(nonce),
			closing:  make(chan struct{}),
		},
		cfg:  settings{spin: spin, handOver: (o.HandOver || t.Bound() > 0) && spin > 0, bounded: t.Bound() > 0, deadlock: deadlock},
		held: newRegistry(t.Slots()),
	}
	m.waits.bySlot = newSlotIndex[waiter](t.Slots())
	m.waits.queues = map[string]*waitList{}
	m.dw.dones = map[<-chan struct{}]*doneWatch{}
	m.log.l, m.log.path = o.Logger, path
	if m.log.l == nil {
		m.log.l = discard
	}
	if o.Stats {
		m.stats = new(stats)
	}
	t.SetEventHook(m.tableEvent)
	m.bell, err = wake.NewBell(t.Nonce(), nonce)
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("open %s: doorbell: %w", path, err)
	}
	m.wk.ringFn = m.ring
	m.wk.pokeFn = m.pokeSlot
	m.wk.faultFn = m.noteFault
	t.SetRinger(m.wk.ringFn)
	err = table.Guard(func() error {
		m.life.a, err = t.Register(table.Self(), nonce)
		if err != nil {
			return err
		}
		m.life.a.InFlight = &m.life.inflight
		var w table.Wakes
		_, err = t.ReapDead(m.life.a, &w)
		t.Deliver(&w, m.wk.ringFn)
		m.refreshView(m.mono()) // the waiting policy's first view of the machine (waitpolicy.go)
		if err == nil && t.StaleBoot() {
			t.MarkBoot()
		}
		return err
	})
	if err != nil {
		m.noteErr("open", err)
		m.bell.Close()
		t.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	m.reaper = wake.NewReaper(t, m.life.a, m.bell, wakeHost{m})
	m.life.bg.Add(1)
	go func() {
		defer m.life.bg.Done()
		m.bell.Run(wakeHost{m}, m.life.a)
	}()
	runtime.AddCleanup(m, func(t *table.Table) { t.Close() }, t)
	return m, nil
}
