package manager

import (
	"context"
	"fmt"

	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/internal/seam"
	"github.com/shmlocks/shmlocks/internal/waitgraph"
	"github.com/shmlocks/shmlocks/table"
)

// The seam to the packages built on the Manager (internal/seam): they get
// a Manager's name rules, a record store per feature in its bucket, and
// requests on reserved names (validate admits a name starting with '-'
// from a ctx marked by seam.Reserved). The Manager knows none of them.
func init() {
	seam.Register(bucketOf)
	inspect.Register(tableOf)
	waitgraph.RegisterPublic(func(g *waitgraph.Graph) any { return waitGraphOf(g) })
}

// tableOf is inspect.Table for m, which must be a *Manager: our own tools
// (shmlocks dump, the prom Collector) read the table behind it.
func tableOf(x any) (*table.Table, *table.Agent) {
	if m, _ := x.(*Manager); m != nil {
		return m.life.t, m.life.a
	}
	return nil, nil
}

// bucketOf is seam.Open for m, which must be a *Manager.
func bucketOf(x any, feature string) (seam.Bucket, error) {
	m, _ := x.(*Manager)
	if m == nil || m.life.t == nil && m.life.be == nil {
		return seam.Bucket{}, fmt.Errorf("%w: %s: not an opened Manager", ErrClosed, feature)
	}
	if m.life.closed.Load() {
		return seam.Bucket{}, ErrClosed
	}
	b := seam.Bucket{MaxNameLen: m.life.maxName, Validate: m.validateName}
	if m.life.be == nil {
		b.Store = seam.NewFileStore(m.life.path+"."+feature, feature, m.fence)
		return b, nil
	}
	p, ok := m.life.be.(seam.StoreProvider)
	if !ok {
		return seam.Bucket{}, m.tableOnly(feature)
	}
	st, err := p.Store(feature)
	if err != nil {
		return seam.Bucket{}, err
	}
	b.Store = st
	return b, nil
}

// validateName is validate for a request of the default options on name.
func (m *Manager) validateName(ctx context.Context, name string) error {
	return m.validate(ctx, name, RequestOptions{})
}

// fence runs write while g, a table lock of m, is held and cannot be
// released: Close releases m's locks only after the operations in flight
// (enter/leave) are done. It is how a record store writes only while its
// writer holds the guarding lock.
func (m *Manager) fence(g seam.Grant, write func() error) error {
	l, ok := g.(*Lock)
	if !ok || l == nil || l.m != m || l.state.Load()&(flagChild|flagBackend) != 0 {
		return fmt.Errorf("%w: fence: not a table grant of this Manager", ErrNotSupported)
	}
	if !m.enter() {
		return ErrClosed
	}
	defer m.leave()
	switch l.st() {
	case lockHeld:
	case lockReleased:
		return fmt.Errorf("fence %q: %w", l.name, ErrReleased)
	case lockClosed:
		return fmt.Errorf("fence %q: %w", l.name, ErrClosed)
	default:
		return fmt.Errorf("fence %q: %w", l.name, ErrStolen)
	}
	held := false
	if err := table.Guard(func() error { held = m.life.t.Holds(m.life.a, l.ref); return nil }); err != nil {
		return err
	}
	if !held {
		return fmt.Errorf("fence %q: %w", l.name, ErrStolen)
	}
	return write()
}

// internalCtx reports whether ctx may request reserved lock names (they
// start with '-', which user names may not): a feature package's ctx,
// marked by seam.Reserved.
func internalCtx(ctx context.Context) bool { return seam.IsReserved(ctx) }
