// Package coalesce runs a function once for all the callers of a key that
// overlap in time, in every process of a lock table (or on every client of
// a manager backend that keeps records): one caller, the leader, runs its
// fn; the others wait and get its result or error. It is
// golang.org/x/sync/singleflight across processes, built on package
// manager: a flight is an exclusive hold of the key's flight lock, and its
// outcome is published beside the table for the callers of other
// processes. See docs/coalesce.md.
//
//	g := coalesce.New(m)
//	profile, shared, err := g.Do(ctx, "profile:42", func(ctx context.Context) ([]byte, error) {
//		return fetchProfile(ctx, 42)
//	})
//
// Nothing is cached: a caller gets the outcome of a flight that ended after
// it arrived, never an older one (DoWithin accepts a recent one).
package coalesce

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/shmlocks/shmlocks/internal/seam"
	"github.com/shmlocks/shmlocks/manager"
)

// Group coalesces the calls made through a Manager. A Group is a handle:
// the flights in progress belong to the Manager, so the callers of one
// Manager share one flight per key whichever Group they call (New is
// cheap), and the callers of different Managers, in one process or in
// several, share it through the key's flight lock. The zero Group, or one
// of a nil Manager, returns ErrClosed.
type Group struct {
	m *manager.Manager
}

// New returns a Group that coalesces calls through m.
func New(m *manager.Manager) *Group { return &Group{m: m} }

// Do runs fn once for all the callers of key that overlap in time, in any
// process of m's table: one caller (the leader) runs fn, the others wait
// and get its result or error (shared == true). A flight ends when its
// outcome is published; a caller gets the outcome of a flight that ended
// after it arrived, never an older one: one arriving after a flight ended
// starts a new one.
//
// If the leader's process dies, or its ctx ends and fn fails, a waiting
// caller leads instead (in the same process, with its own fn and ctx; a
// successful result is kept even if its caller's ctx ended). A caller whose
// ctx ends returns manager.ErrAborted at once and leaves the flight intact.
//
// Followers that call through the leader's Manager get its error value;
// the others (other Managers, other processes) an error matching
// ErrLeaderFailed with its text. A
// result longer than MaxResultSize is ErrResultTooLarge for the leader and
// its followers. A follower's result is its own copy. fn's ctx is its
// caller's: Do on the same key from fn is manager.ErrWouldDeadlock. Keys
// follow the rules of lock names (manager.ErrNotSupported); the flight's
// lock shows in Query as "-c:" and the key (see docs/coalesce.md). On a
// backend without a record store, Do is manager.ErrNotSupported.
func (g *Group) Do(ctx context.Context, key string,
	fn func(ctx context.Context) ([]byte, error)) (result []byte, shared bool, err error) {
	return g.DoWithin(ctx, key, 0, fn)
}

// DoWithin is Do that first accepts a successful result published for key
// at most maxAge ago (by any process), returning it with shared == true
// without waiting; maxAge 0 is Do. Errors are never reused.
func (g *Group) DoWithin(ctx context.Context, key string, maxAge time.Duration,
	fn func(ctx context.Context) ([]byte, error)) (result []byte, shared bool, err error) {
	m := g.manager()
	b, err := seam.Open(m, feature)
	if err != nil {
		return nil, false, fmt.Errorf("coalesce %q: %w", key, err)
	}
	if err := b.Validate(ctx, key); err != nil {
		return nil, false, err
	}
	if fn == nil {
		return nil, false, fmt.Errorf("%w: coalesce %q: nil fn", manager.ErrNotSupported, key)
	}
	if maxAge < 0 {
		return nil, false, fmt.Errorf("%w: coalesce %q: negative maxAge %v", manager.ErrNotSupported, key, maxAge)
	}
	if _, err := flightName(key, b.MaxNameLen); err != nil {
		return nil, false, err
	}
	if inFlight(ctx, m, key) {
		// Called from fn of a flight on key: it would wait for itself.
		return nil, false, fmt.Errorf("%w: coalesce %q called from its own flight's fn", manager.ErrWouldDeadlock, key)
	}
	mb := &member{m: m, key: key, ctx: ctx, fn: fn, done: make(chan struct{})}
	var f *flight
	if maxAge == 0 {
		// A caller that starts its Manager's flight lets the pilot read
		// the outcome in place, in its first attempt at the flight lock
		// (a backend may read it in the same step): one read fewer.
		f = join(m, b, key, mb, true)
	}
	if f == nil {
		switch o, err := load(b, key); {
		case err == nil && o != nil:
			if maxAge > 0 && o.fresh(maxAge, time.Now()) {
				return o.data, true, nil
			}
			mb.gen0 = o.gen()
		case err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, manager.ErrCorrupt):
			return nil, false, readErr(key, err)
		}
		f = join(m, b, key, mb, false)
	}
	select {
	case <-mb.done:
		return mb.outcome()
	case <-ctx.Done():
	}
	if f.leave(mb) {
		return nil, false, fmt.Errorf("%w: coalesce %q: %w", manager.ErrAborted, key, ctx.Err())
	}
	<-mb.done // delivered while we left: the outcome wins
	return mb.outcome()
}

// Check validates the outcome records of the Group's bucket: every record
// parses and is filed under its key (shmlocks dump --check runs it beside
// Manager.Check). A record is manager.ErrCorrupt with its field and value.
func (g *Group) Check() error {
	b, err := seam.Open(g.manager(), feature)
	if err != nil {
		return fmt.Errorf("coalesce check: %w", err)
	}
	return b.Store.Range(maxRecord(b.MaxNameLen), func(rk string, rec []byte) error {
		o, err := parseRecord(rec, rk, b.MaxNameLen, "")
		if err != nil {
			return err
		}
		if recordKey(o.key) != rk {
			return corruptRecord(rk, "name", fmt.Sprintf("%q (filed under another key's record)", o.key))
		}
		return nil
	})
}

func (g *Group) manager() *manager.Manager {
	if g == nil {
		return nil
	}
	return g.m
}

// load returns key's published outcome: nil with no error when the record
// is another key's (a store-key collision), an error wrapping
// fs.ErrNotExist when there is none, manager.ErrCorrupt when it is not a
// valid record.
func load(b seam.Bucket, key string) (*outcome, error) {
	rk := recordKey(key)
	rec, err := b.Store.Load(rk, maxRecord(b.MaxNameLen))
	if err != nil {
		return nil, err
	}
	return parseRecord(rec, rk, b.MaxNameLen, key)
}

// readErr is the error of a caller whose read of the outcome in place
// failed (not "none", not corrupt: a backend's store got no answer):
// without knowing it, the caller could not tell a later outcome from it.
func readErr(key string, err error) error {
	return fmt.Errorf("coalesce %q: read the outcome: %w", key, err)
}

// publish writes the outcome of the flight on key whose lock is l; the
// store writes it only while l is held (seam.Store.Publish).
func publish(b seam.Bucket, l *manager.Lock, key string, res []byte, ferr error) error {
	o := &outcome{kind: kindResult, token: l.Token(), key: key, data: res}
	if ferr != nil {
		o.kind, o.data = kindError, []byte(ferr.Error())
		if errors.Is(ferr, ErrResultTooLarge) {
			o.kind = kindTooLarge
		}
		if len(o.data) > MaxResultSize {
			o.data = o.data[:MaxResultSize]
		}
	}
	o.at = time.Now().UnixNano()
	// A store that can release the lock in the same step (etcd: one
	// transaction) does: l's Release then costs nothing.
	put := b.Store.Publish
	if pr, ok := b.Store.(seam.PublishReleaser); ok {
		put = pr.PublishRelease
	}
	if err := put(l, recordKey(key), encodeRecord(o)); err != nil {
		return fmt.Errorf("coalesce %q: publish: %w", key, err)
	}
	seam.Crash("coalesce.renamed")
	return nil
}
