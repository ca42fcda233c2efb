package etcd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/shmlocks/shmlocks/internal/seam"
	"github.com/shmlocks/shmlocks/manager"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The record stores of the packages built on the Manager (internal/seam;
// package coalesce keeps its flights' outcomes in one): a record is one key,
// P/!r/<feature>/<store key>, without a lease (it outlives its writer, as
// the table's record files do). No escaped name starts with '!', so these
// keys never meet a name's, and the reads of every name (Query, the
// wait-for graph) skip them (readNames).
//
// Publish is one transaction: it puts the record only if the guarding
// grant's request key still has the create revision it was granted with,
// so a record is written only while its writer holds the lock that guards
// it, whole (a put is atomic), and a follower reading it never sees a
// partial one. PublishRelease deletes the request key in the same
// transaction: a flight's publish and release are one round trip, and a
// follower watching the record (Follow) learns of it from the put's event.

// storeDir is the directory of the record stores under the prefix.
const storeDir = "!r/"

// store is the record store of one feature on one Manager's prefix.
type store struct {
	b       *backend
	feature string
	dir     string // P/!r/<feature>/
}

// Store implements seam.StoreProvider: feature's records under
// P/!r/<feature>/. feature is a short lower-case word.
func (b *backend) Store(feature string) (seam.Store, error) {
	if feature == "" || strings.Trim(feature, "abcdefghijklmnopqrstuvwxyz") != "" {
		return nil, fmt.Errorf("%w: etcd: store feature %q", manager.ErrNotSupported, feature)
	}
	if b.isClosed() {
		return nil, manager.ErrClosed
	}
	return &store{b: b, feature: feature, dir: b.prefix + storeDir + feature + "/"}, nil
}

func (s *store) path(key string) string { return s.dir + key }

// cut is v cut to max+1 bytes (the seam's rule for a record longer than max).
func cut(v []byte, max int) []byte { return v[:min(len(v), max+1)] }

// Load reads the record under key. A call without an answer is retried
// until CallTimeout: a caller must be able to tell "no record" from "no
// answer" (coalesce reads the outcome in place when a caller arrives).
func (s *store) Load(key string, max int) ([]byte, error) {
	if err := seam.CheckKey(key); err != nil {
		return nil, err
	}
	ctx, cancel := s.b.callCtx()
	defer cancel()
	for {
		g, err := s.b.cli.Get(ctx, s.path(key))
		if err == nil {
			if len(g.Kvs) == 0 {
				return nil, fmt.Errorf("etcd: %s record %q: %w", s.feature, key, fs.ErrNotExist)
			}
			return cut(g.Kvs[0].Value, max), nil
		}
		if permanent(err) || s.b.isClosed() {
			return nil, fmt.Errorf("etcd: load %s record %q: %w", s.feature, key, err)
		}
		select {
		case <-time.After(retryPause):
		case <-ctx.Done():
			return nil, fmt.Errorf("etcd: load %s record %q: %w", s.feature, key, err)
		}
	}
}

// Publish puts rec under key in one transaction that holds only while g's
// request key is the one granted (see the file comment).
func (s *store) Publish(g seam.Grant, key string, rec []byte) error {
	return s.publish(g, key, rec, false)
}

// PublishRelease implements seam.PublishReleaser: Publish and the release
// of g in one transaction.
func (s *store) PublishRelease(g seam.Grant, key string, rec []byte) error {
	return s.publish(g, key, rec, true)
}

func (s *store) publish(g seam.Grant, key string, rec []byte, release bool) error {
	if err := seam.CheckKey(key); err != nil {
		return err
	}
	what := fmt.Sprintf("etcd: publish %s record %q", s.feature, key)
	r, err := s.b.heldRequest(g)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	ops := []clientv3.Op{clientv3.OpPut(s.path(key), string(rec))}
	if release {
		ops = append(ops, clientv3.OpDelete(r.key))
	}
	ctx, cancel := s.b.callCtx()
	defer cancel()
	resp, err := s.b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(r.key), "=", r.createRev)).
		Then(ops...).Commit()
	switch {
	case err != nil && tooLarge(err):
		return fmt.Errorf("%s (%d bytes): %w: %w", what, len(rec), seam.ErrRecordTooLarge, err)
	case err != nil:
		if release {
			r.mayBeDeleted() // the transaction may have deleted the key: Release finds out who did
		}
		if s.b.isClosed() {
			return fmt.Errorf("%s: %w", what, manager.ErrClosed)
		}
		return fmt.Errorf("%s: %w", what, err)
	case !resp.Succeeded:
		return fmt.Errorf("%s: lock %q: %w", what, g.Name(), r.lostErr(r.sessDone()))
	}
	if release {
		r.releasedBy()
	}
	return nil
}

// tooLarge reports whether err says that a request was too large: etcd's
// --max-request-bytes (default 1.5 MiB), or gRPC's message limits (the
// server's, that limit plus 512 KiB; the client's MaxCallSendMsgSize,
// default 2 MiB).
func tooLarge(err error) bool {
	return errors.Is(err, rpctypes.ErrRequestTooLarge) || errors.Is(err, rpctypes.ErrGRPCRequestTooLarge) ||
		strings.Contains(err.Error(), "larger than max")
}

// heldRequest is the held request of this Manager that granted g (a Lock
// of this Manager: its name and token).
func (b *backend) heldRequest(g seam.Grant) (*request, error) {
	b.mu.Lock()
	closed := b.closed
	var found *request
	if !closed {
		for r := range b.reqs {
			if r.grantRev != 0 && r.name == g.Name() && uint64(r.grantRev) == g.Token() {
				found = r
				break
			}
		}
	}
	b.mu.Unlock()
	switch {
	case closed:
		return nil, manager.ErrClosed
	case found == nil:
		return nil, fmt.Errorf("lock %q (token %d) not held by this Manager: %w", g.Name(), g.Token(), manager.ErrStolen)
	case found.isLost():
		return nil, fmt.Errorf("lock %q: %w", g.Name(), found.lostErr(found.sessDone()))
	}
	return found, nil
}

// rangePage is how many records one read of Range returns (each up to a
// MiB for coalesce).
const rangePage = 16

// Range reads every record of the store, a page at a time, all pages at the
// revision of the first.
func (s *store) Range(max int, fn func(key string, rec []byte) error) error {
	ctx, cancel := s.b.callCtx()
	defer cancel()
	var errs []error
	from, end := s.dir, clientv3.GetPrefixRangeEnd(s.dir)
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(rangePage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		g, err := s.b.cli.Get(ctx, from, opts...)
		if err != nil {
			return errors.Join(append(errs, fmt.Errorf("etcd: read %s records: %w", s.feature, err))...)
		}
		rev = g.Header.Revision
		for _, kv := range g.Kvs {
			k := strings.TrimPrefix(string(kv.Key), s.dir)
			if seam.CheckKey(k) != nil {
				errs = append(errs, fmt.Errorf("%s store: unexpected key %q", s.feature, kv.Key))
				continue
			}
			if err := fn(k, cut(kv.Value, max)); err != nil {
				errs = append(errs, err)
			}
		}
		if !g.More || len(g.Kvs) == 0 {
			return errors.Join(errs...)
		}
		from = string(g.Kvs[len(g.Kvs)-1].Key) + "\x00"
	}
}

// Follow implements seam.Follower with a watch of the record's key: each
// put's event carries the whole record, so a follower learns the outcome
// of a flight from one event, without a read.
//
// The watch starts at the current revision, not at from+1: etcd serves a
// watch that starts at a revision already written from its "unsynced"
// group, which it catches up only every 100 ms, and the follower's own
// enqueue comes after from. When the watch's first revision is above
// from+1, the record is read once, and given to fn if it was put after
// from. A watch that breaks is resumed from the next revision; one
// compacted away is restarted at the current revision (the records in
// between are missed: the caller learns of them otherwise, as
// seam.Follower allows).
func (s *store) Follow(ctx context.Context, key string, max int, from int64, fn func(rec []byte)) {
	if seam.CheckKey(key) != nil {
		return
	}
	go func() {
		var rev int64 // the revision to resume from; 0: the current one
		gap := from > 0
		for ctx.Err() == nil && s.b.ctx.Err() == nil {
			opts := []clientv3.OpOption{clientv3.WithFilterDelete(), clientv3.WithCreatedNotify()}
			if rev != 0 {
				opts = append(opts, clientv3.WithRev(rev))
			}
			wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
			for wr := range s.b.cli.Watch(wctx, s.path(key), opts...) {
				if wr.CompactRevision != 0 {
					rev = 0
					break
				}
				if wr.Err() != nil || wr.Canceled {
					break
				}
				if wr.Created {
					if gap && wr.Header.Revision > from {
						s.readGap(ctx, key, max, from, fn)
					}
					gap = false
					continue
				}
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypePut {
						fn(cut(ev.Kv.Value, max))
					}
					rev = ev.Kv.ModRevision + 1
				}
			}
			cancel()
			select {
			case <-time.After(retryPause):
			case <-ctx.Done():
			case <-s.b.ctx.Done():
			}
		}
	}()
}

// readGap gives fn the record under key if it was put after revision from
// (Follow's watch started later).
func (s *store) readGap(ctx context.Context, key string, max int, from int64, fn func(rec []byte)) {
	g, err := s.b.cli.Get(ctx, s.path(key))
	if err == nil && len(g.Kvs) == 1 && g.Kvs[0].ModRevision > from {
		fn(cut(g.Kvs[0].Value, max))
	}
}

// grantRead returns the key of the record that ctx asks the grant's
// transaction to read (seam.GrantRead), if it is a record of this
// Manager's stores.
func (b *backend) grantRead(ctx context.Context) (*seam.GrantRead, string) {
	gr := seam.GrantReadOf(ctx)
	if gr == nil {
		return nil, ""
	}
	st, ok := gr.Store.(*store)
	if !ok || st.b != b || seam.CheckKey(gr.Key) != nil {
		return nil, ""
	}
	return gr, st.path(gr.Key)
}
