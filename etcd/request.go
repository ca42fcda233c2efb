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
