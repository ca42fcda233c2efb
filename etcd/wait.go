package etcd

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/shmlocks/shmlocks/manager"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Waiting for a queued request's grant: the queue read, the watch of the
// key ahead, the pause between retries (request.go makes the request).
// enqueue creates the key and waits until it holds.
func (r *request) enqueue(ctx context.Context, val string) (int64, error) {
	// The put is conditional on our key not existing, so that a retry of a
	// call without an answer finds the key its earlier attempt may have
	// created, and keeps its place in the queue.
	var resp *clientv3.TxnResponse
	var err error
	for {
		resp, err = r.b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(r.key), "=", 0)).Then(
			clientv3.OpPut(r.key, val, clientv3.WithLease(r.sess.Lease())),
			clientv3.OpGet(r.base, clientv3.WithPrefix()),
		).Else(clientv3.OpGet(r.base, clientv3.WithPrefix())).Commit()
		if err == nil {
			break
		}
		if err := r.again(ctx, err); err != nil {
			r.withdraw() // the put may have happened
			return 0, err
		}
	}
	rev := resp.Header.Revision
	kvs := resp.Responses[len(resp.Responses)-1].GetResponseRange().Kvs
	for _, kv := range kvs {
		if string(kv.Key) == r.key {
			r.createRev = kv.CreateRevision
		}
	}
	r.b.track(r) // waiting requests fail when the Manager closes
	defer r.b.untrack(r)
	defer r.b.unparkDeadlock(r)
	for {
		st, err := parseName(r.base, kvs)
		if err != nil {
			r.withdraw()
			return 0, fmt.Errorf("lock %q: %w", r.name, err)
		}
		i := st.index(r.key)
		if i < 0 {
			// Our key is gone while we waited: our lease ended.
			return 0, r.lostWaiting()
		}
		ok, pred := grantable(st.reqs, i)
		if ok {
			if ctx.Err() != nil { // a grant that raced with the cancellation is given back
				r.withdraw()
				return 0, fmt.Errorf("%w: lock %q: %w", manager.ErrAborted, r.name, ctx.Err())
			}
			if st.marker > r.createRev {
				return r.fence(ctx, st.marker)
			}
			return r.createRev, nil
		}
		r.b.parkDeadlock(r) // the deadlock rounds check it once it has waited DeadlockDelay
		v, err := r.waitDeleted(ctx, pred.key, rev)
		if err != nil {
			r.withdraw()
			return 0, err
		}
		if v != nil {
			if err := r.giveUp(v); err != nil {
				return 0, err
			}
			// The cycle was broken meanwhile: wait on.
		}
		g, err := r.readQueue(ctx)
		if err != nil {
			r.withdraw()
			return 0, err
		}
		kvs, rev = g.Kvs, g.Header.Revision
	}
}

// readQueue reads the name's keys for a waiting request. A failed read
// (no leader during an election, a member restarting) is retried after a
// pause: the request stays queued, as its key does, until ctx ends, the
// lease is lost or the Manager closes.
func (r *request) readQueue(ctx context.Context) (*clientv3.GetResponse, error) {
	for {
		g, err := r.b.cli.Get(ctx, r.base, clientv3.WithPrefix())
		if err == nil {
			return g, nil
		}
		if err := r.pause(ctx); err != nil {
			return nil, err
		}
	}
}

// pause waits a moment before a retry, or returns why the request ends.
func (r *request) pause(ctx context.Context) error {
	t := time.NewTimer(retryPause)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: lock %q: %w", manager.ErrAborted, r.name, ctx.Err())
	case <-r.sess.Done():
		return r.lostWaiting()
	case <-r.b.ctx.Done():
		return fmt.Errorf("lock %q: %w", r.name, manager.ErrClosed)
	}
}

// retryPause is the pause between two attempts of a call that failed.
const retryPause = 50 * time.Millisecond

// index is the place of key in the queue, or -1.
func (st nameState) index(key string) int {
	for i := range st.reqs {
		if st.reqs[i].key == key {
			return i
		}
	}
	return -1
}

// lostWaiting is the error of a waiting request whose key disappeared: the
// Manager closed, the lease ended, or a steal took the grant before the
// request saw it.
func (r *request) lostWaiting() error {
	r.b.mu.Lock()
	closed := r.b.closed
	r.b.mu.Unlock()
	if closed {
		return fmt.Errorf("lock %q: %w", r.name, manager.ErrClosed)
	}
	if r.leaseEnded() {
		return fmt.Errorf("lock %q: request key deleted while waiting: %w", r.name, ErrSessionLost)
	}
	// Granted (the last conflicting key ahead went) and stolen before we
	// read the queue again, as the table reports it.
	return fmt.Errorf("lock %q: granted and stolen before use: %w", r.name, manager.ErrStolen)
}

// waitDeleted blocks until key (read at revision rev) is deleted, ctx ends,
// our lease is lost, the Manager closes or a deadlock round hands us a
// verdict (returned). A watch that cannot start from
// rev+1 (compacted) or breaks returns nil: the caller reads the queue again,
// which is always safe.
func (r *request) waitDeleted(ctx context.Context, key string, rev int64) (*verdict, error) {
	if h := testHookWatch.get(); h != nil {
		h(key, rev)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(r.b.ctx))
	defer cancel()
	wch := r.b.cli.Watch(wctx, key, clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: lock %q: %w", manager.ErrAborted, r.name, ctx.Err())
		case <-r.sess.Done():
			return nil, r.lostWaiting()
		case <-r.b.ctx.Done():
			return nil, fmt.Errorf("lock %q: %w", r.name, manager.ErrClosed)
		case v := <-r.verdict:
			return v, nil
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil || wr.Canceled {
				return nil, nil // re-read with a fresh Get
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return nil, nil
				}
			}
		}
	}
}

// testHookWatch, set only by tests, runs before waitDeleted starts its
// watch of key from rev+1 (TestWatchCompacted compacts past rev there).
var testHookWatch hook[func(key string, rev int64)]

// fence gives a request granted behind a steal a token above the steal's:
// the request was queued before the stealer (its create revision is lower)
// but is granted after it. One transaction rewrites our key (its mod
// revision becomes the token, above every revision so far) and the marker,
// so that every later request queued before the marker's revision does the
// same. The compare fails only if our key is gone: a steal or the end of
// our lease took the grant before we could use it.
func (r *request) fence(ctx context.Context, marker int64) (int64, error) {
	val, _ := json.Marshal(meta{Client: r.b.clientID, PID: r.b.pid})
	for {
		resp, err := r.b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(r.key), "=", r.createRev)).
			Then(clientv3.OpPut(r.key, string(val), clientv3.WithLease(r.sess.Lease())),
				clientv3.OpPut(r.base+"m", "")).Commit()
		if err == nil {
			if !resp.Succeeded {
				return 0, fmt.Errorf("lock %q: granted and taken away before use: %w", r.name, manager.ErrStolen)
			}
			// A retry after an attempt that took effect takes a new token
			// above it: still above the marker, and never handed out twice.
			return resp.Header.Revision, nil
		}
		if err := r.again(ctx, err); err != nil {
			r.withdraw()
			return 0, err
		}
	}
}

// steal deletes the keys of the name's holders and creates ours, marked as a
// steal (first in the queue), in one transaction that holds only if the
// holders read are still the holders: each of their keys still exists and
// no key of the name was created or changed since the read. Otherwise it
// reads again. The marker's mod revision becomes our token.
func (r *request) steal(ctx context.Context, val string) (int64, error) {
	for {
		g, err := r.b.cli.Get(ctx, r.base, clientv3.WithPrefix())
		if err != nil {
			if err := r.again(ctx, err); err != nil {
				r.withdraw() // an earlier attempt may have put our key
				return 0, err
			}
			continue
		}
		st, err := parseName(r.base, g.Kvs)
		if err != nil {
			r.withdraw()
			return 0, fmt.Errorf("lock %q: %w", r.name, err)
		}
		if i := st.index(r.key); i >= 0 { // an earlier attempt without an answer took effect
			r.createRev = st.reqs[i].createRev
			return r.createRev, nil
		}
		rev := g.Header.Revision
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.ModRevision(r.base+"x/").WithPrefix(), "<", rev+1),
			clientv3.Compare(clientv3.ModRevision(r.base+"s/").WithPrefix(), "<", rev+1),
		}
		var ops []clientv3.Op
		for _, h := range holders(st.reqs) {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.createRev))
			ops = append(ops, clientv3.OpDelete(h.key))
		}
		ops = append(ops, clientv3.OpPut(r.key, val, clientv3.WithLease(r.sess.Lease())), clientv3.OpPut(r.base+"m", ""))
		resp, err := r.b.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			if err := r.again(ctx, err); err != nil {
				r.withdraw()
				return 0, err
			}
			continue // the next read tells whether it took effect
		}
		if resp.Succeeded {
			r.createRev = resp.Header.Revision
			return r.createRev, nil
		}
	}
}

// watchHeld (the grant's Watch: started the first time someone looks at
// Lost) watches our key from the grant on: its deletion by anyone but us
// (a steal, the end of the lease) closes lost. A watch that breaks is
// restarted after a Get that finds the key still ours.
func (r *request) watchHeld() {
	ctx, cancel := context.WithCancel(r.b.ctx)
	r.mu.Lock()
	if r.released {
		r.mu.Unlock()
		cancel()
		return
	}
	r.stopW = cancel
	r.mu.Unlock()
	rev := r.grantRev
	go func() {
		defer cancel()
		for ctx.Err() == nil {
			wch := r.b.cli.Watch(ctx, r.key, clientv3.WithRev(rev+1), clientv3.WithFilterPut())
			for wr := range wch {
				if wr.Err() != nil || wr.Canceled {
					break
				}
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypeDelete {
						r.goneUnlessReleased()
						return
					}
				}
			}
			if ctx.Err() != nil {
				return
			}
			g, err := r.b.cli.Get(ctx, r.key)
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(retryPause):
				}
				continue
			}
			if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != r.createRev {
				r.goneUnlessReleased()
				return
			}
			rev = g.Header.Revision
		}
	}()
}

// goneUnlessReleased closes lost unless we released the grant ourselves.
func (r *request) goneUnlessReleased() {
	r.mu.Lock()
	rel := r.released
	r.mu.Unlock()
	if !rel {
		r.lose()
	}
}

var errLeaseNotFound = rpctypes.ErrLeaseNotFound
