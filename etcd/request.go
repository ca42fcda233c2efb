package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/shmlocks/shmlocks/manager"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// request is one request key of this Manager, pending or held.
type request struct {
	b         *backend
	name      string
	base      string // P/e/
	key       string
	num       uint64 // the key's number among this Manager's (see backend.newNum)
	excl      bool
	sess      *concurrency.Session
	createRev int64

	lost     chan struct{} // closed when a held grant is taken away
	lostOnce sync.Once
	grantRev int64              // the revision of the grant (the token)
	stopW    context.CancelFunc // stops the holder's watch (once Watch started it; r.mu)

	verdict chan *verdict // a deadlock round found it a cycle's victim (buffered 1; deadlock.go)

	mu       sync.Mutex
	released bool       // Release was called (r.mu)
	rel      *releaseOp // the release, once started (r.mu; release.go)
	maybeDel bool       // a delete of our key by a store's PublishRelease got no answer (r.mu; store.go)
}

// lose closes the request's lost channel (once).
func (r *request) lose() { r.lostOnce.Do(func() { close(r.lost) }) }

func (r *request) isLost() bool {
	select {
	case <-r.lost:
		return true
	default:
		return false
	}
}

// Acquire implements manager.Backend: one transaction creates the request
// key and reads the name's queue; a request with nothing conflicting ahead
// holds at once, otherwise it watches the last conflicting key ahead of it
// (only that one: no thundering herd) until that key is deleted, reads the
// queue again, and so on.
func (b *backend) Acquire(ctx context.Context, name string, opts manager.RequestOptions) (manager.BackendGrant, error) {
	s, err := b.session(ctx)
	for err != nil {
		if permanent(err) || errors.Is(err, manager.ErrClosed) || ctx.Err() != nil {
			return manager.BackendGrant{}, b.callErr(ctx, name, err)
		}
		select { // etcd unreachable: the request waits for it, as for the lock
		case <-time.After(retryPause):
		case <-ctx.Done():
		case <-b.ctx.Done():
		}
		s, err = b.session(ctx)
	}
	r := &request{b: b, name: name, base: b.nameBase(name), excl: opts.Mode == manager.Exclusive,
		sess: s, lost: make(chan struct{}), verdict: make(chan *verdict, 1)}
	sub := "s/"
	if r.excl {
		sub = "x/"
	}
	r.num = b.newNum()
	r.key = r.base + sub + b.clientID + "-" + strconv.FormatUint(r.num, 10)
	md := meta{Client: b.clientID, PID: b.pid, Steal: opts.Steal, Since: time.Now().UnixNano()}
	if !opts.Steal && !opts.IfAvailable {
		md.Holds = b.carriedKeys(ctx) // the task edges of the wait-for graph (deadlock.go)
	}
	val, _ := json.Marshal(md)

	var token int64
	switch {
	case opts.Steal:
		token, err = r.steal(ctx, string(val))
	case opts.IfAvailable:
		token, err = r.ifAvailable(ctx, string(val))
	default:
		token, err = r.enqueue(ctx, string(val))
	}
	if err != nil {
		if errors.Is(err, manager.ErrNotAvailable) {
			b.freeNum(r.num) // no key was created
		}
		return manager.BackendGrant{}, err
	}
	r.grantRev = token
	b.track(r)
	return manager.BackendGrant{Token: uint64(token), Lost: r.lost, Release: r.release, Watch: r.watchHeld}, nil
}

// callErr maps the error of an etcd call made with the caller's ctx.
func (b *backend) callErr(ctx context.Context, name string, err error) error {
	switch {
	case errors.Is(err, manager.ErrClosed):
		return fmt.Errorf("lock %q: %w", name, manager.ErrClosed)
	case ctx.Err() != nil:
		return fmt.Errorf("%w: lock %q: %w", manager.ErrAborted, name, ctx.Err())
	}
	return fmt.Errorf("lock %q: etcd: %w", name, err)
}

// ifAvailable creates the key only if the request is grantable at once, in
// one transaction: a range compare on the exclusive sub-range (and, for an
// exclusive request, the shared one) says nothing is held or queued that
// conflicts. No key is created (and none deleted) when it is not. A call
// without an answer is retried, as a transaction that first looks for our
// key (the earlier attempt may have created it: then we hold).
func (r *request) ifAvailable(ctx context.Context, val string) (int64, error) {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(r.base+"x/").WithPrefix(), "=", 0)}
	if r.excl {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(r.base+"s/").WithPrefix(), "=", 0))
	}
	put := clientv3.OpPut(r.key, val, clientv3.WithLease(r.sess.Lease()))
	// A record the caller wants read with the attempt (seam.GrantRead: a
	// coalesce flight's outcome) is read in the same transaction, granted
	// or not (the caller compares later records with it).
	gr, grKey := r.b.grantRead(ctx)
	ops, els := []clientv3.Op{put}, []clientv3.Op(nil)
	if gr != nil {
		ops = append(ops, clientv3.OpGet(grKey))
		els = append(els, clientv3.OpGet(grKey))
	}
	resp, err := r.b.cli.Txn(ctx).If(cmps...).Then(ops...).Else(els...).Commit()
	if err != nil {
		gr = nil // the retry below does not read it
	}
	for err != nil {
		if err := r.again(ctx, err); err != nil {
			r.withdraw() // the put may have happened
			return 0, err
		}
		var rr *clientv3.TxnResponse
		rr, err = r.b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(r.key), ">", 0)).
			Then(clientv3.OpGet(r.key)).Else(clientv3.OpTxn(cmps, []clientv3.Op{put}, nil)).Commit()
		if err != nil {
			continue
		}
		if rr.Succeeded { // the earlier attempt created our key
			r.createRev = rr.Responses[0].GetResponseRange().Kvs[0].CreateRevision
			return r.createRev, nil
		}
		resp = (*clientv3.TxnResponse)(rr.Responses[0].GetResponseTxn())
		resp.Header = rr.Header
	}
	if gr != nil {
		gr.Rev, gr.Done, gr.Rec = resp.Header.Revision, true, nil
		if kvs := resp.Responses[len(resp.Responses)-1].GetResponseRange().GetKvs(); len(kvs) == 1 {
			gr.Rec = cut(kvs[0].Value, gr.Max)
		}
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("lock %q: %w", r.name, manager.ErrNotAvailable)
	}
	r.createRev = resp.Header.Revision
	return r.createRev, nil
}

// again decides what to do after an etcd call of a request failed with
// err: nil after a pause (retry: etcd unreachable for a moment, a member
// stopped, an election), or the request's error (ctx ended, the lease is
// lost, the Manager closed, or an error that retrying cannot mend).
func (r *request) again(ctx context.Context, err error) error {
	err = r.sessionErr(err)
	if errors.Is(err, ErrSessionLost) || permanent(err) || ctx.Err() != nil {
		return r.b.callErr(ctx, r.name, err)
	}
	return r.pause(ctx)
}

// sessionErr turns the error of a put with a lease that is gone into
// ErrSessionLost.
func (r *request) sessionErr(err error) error {
	select {
	case <-r.sess.Done():
		return fmt.Errorf("%w: %w", ErrSessionLost, err)
	default:
	}
	if err != nil && errors.Is(err, errLeaseNotFound) {
		return fmt.Errorf("%w: %w", ErrSessionLost, err)
	}
	return err
}

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
