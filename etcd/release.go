package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shmlocks/shmlocks/manager"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Releasing a grant, and withdrawing a request that was not granted.
//
// Both delete the request's key, and both must never leave it behind: a key
// nobody waits for keeps its name blocked for as long as the Manager's lease
// lives, which is as long as the Manager (Request cannot even retry: its Lock
// is gone when fn returns). So a call that fails without an answer (etcd
// unreachable, the member stopped, a timeout: the delete may or may not have
// happened) is retried until etcd answers, the lease ends (the key goes
// with it) or the Manager closes (its lease is revoked).
//
// A retry of a release may find the key gone because its own earlier
// attempt deleted it. Release then finds out who deleted the key, from the
// key's history: the revision D of its deletion (a watch of the key from
// the grant on), and what else changed at D:
//
//	the agent key P/!a/<client> gone at D  the lease ended (ErrStolen, ErrSessionLost)
//	the name's marker P/e/m written at D   a steal (ErrStolen)
//	neither                                our own earlier attempt (success)
//
// If that history was compacted away meanwhile, the current keys decide:
// the agent key still on our lease and the marker not written since the
// grant mean that no steal and no end of the lease happened, so the delete
// was ours; otherwise Release reports ErrStolen, the answer that never
// claims a protection that may have been lost.

// releaseOp is the one release of a grant: started by the first Release,
// joined by any later one (a Release that gave up waiting leaves it running).
type releaseOp struct {
	done chan struct{}
	err  error // set before done closes
}

// releaseWait bounds how long one Release call waits for its release to be
// settled: an attempt per CallTimeout until the lease ends (TTL after the
// last keep-alive) and then CallTimeout to learn who deleted the key. The
// release goes on in the background after it.
func (b *backend) releaseWait() time.Duration {
	return b.opts.TTL + 3*b.opts.CallTimeout
}

// release deletes our key if it is still the one we created: a late
// Release after a steal or the end of the lease touches nothing and
// reports ErrStolen.
func (r *request) release() error {
	r.mu.Lock()
	r.released = true
	op, first := r.rel, r.rel == nil
	if first {
		op = &releaseOp{done: make(chan struct{})}
		r.rel = op
	}
	r.mu.Unlock()
	if first {
		if r.isLost() {
			r.finishRelease(op, r.lostErr(r.leaseEnded()), false)
			return op.err
		}
		// The usual case: one transaction, settled at once.
		resp, err := r.releaseTxn()
		switch {
		case err == nil:
			r.finishRelease(op, r.settle(resp, r.mayHaveDeleted()), true)
			return op.err
		case permanent(err):
			r.abandonRelease(op, err)
			return op.err
		}
		go r.retryRelease(op)
	}
	t := time.NewTimer(r.b.releaseWait())
	defer t.Stop()
	select {
	case <-op.done:
		return op.err
	case <-t.C:
		return fmt.Errorf("etcd: release not settled in %v (etcd unreachable); it goes on in the background "+
			"until the key is gone or the lease ends", r.b.releaseWait())
	}
}

// releasedBy settles the release of r as done by a transaction of ours that
// deleted its key (a store's PublishRelease): a later Release returns nil
// without a call.
func (r *request) releasedBy() {
	r.mu.Lock()
	if r.rel != nil {
		r.mu.Unlock()
		return
	}
	op := &releaseOp{done: make(chan struct{})}
	r.rel, r.released = op, true
	r.mu.Unlock()
	r.finishRelease(op, nil, true)
}

// mayBeDeleted notes that a transaction of ours that deletes our key got no
// answer: the release that follows treats a key found gone as a retry does
// (it may be that transaction's doing, not a steal).
func (r *request) mayBeDeleted() {
	r.mu.Lock()
	r.maybeDel = true
	r.mu.Unlock()
}

func (r *request) mayHaveDeleted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maybeDel
}

// releaseTxn deletes our key if its create revision is still ours; else it
// reads our agent key (is our lease alive?).
func (r *request) releaseTxn() (*clientv3.TxnResponse, error) {
	ctx, cancel := r.b.callCtx()
	defer cancel()
	return r.b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(r.key), "=", r.createRev)).
		Then(clientv3.OpDelete(r.key)).Else(clientv3.OpGet(r.b.agentKey())).Commit()
}

// retryRelease retries a release whose first attempt got no answer, until
// one is settled (see the file comment).
func (r *request) retryRelease(op *releaseOp) {
	var sessEnd time.Time
	for {
		if h := testHookRelease.get(); h != nil {
			h(r.key)
		}
		resp, err := r.releaseTxn()
		if err == nil {
			r.finishRelease(op, r.settle(resp, true), true)
			return
		}
		if r.b.ctx.Err() != nil {
			r.finishRelease(op, manager.ErrClosed, false) // Close revoked the lease
			return
		}
		if permanent(err) {
			r.abandonRelease(op, err)
			return
		}
		select {
		case <-r.sess.Done():
			if sessEnd.IsZero() {
				sessEnd = time.Now()
			} else if time.Since(sessEnd) > r.b.opts.CallTimeout {
				// The key is gone with the lease (or by an attempt of ours
				// whose answer was lost): etcd did not say which.
				r.finishRelease(op, fmt.Errorf("%w (%w): the lease ended before etcd confirmed the release (%v)",
					manager.ErrStolen, ErrSessionLost, err), false)
				return
			}
		default:
		}
		select {
		case <-time.After(retryPause):
		case <-r.b.ctx.Done():
		}
	}
}

// abandonRelease ends op with an error that retrying cannot mend (the call
// was refused: not permitted, invalid): nothing was deleted, the grant is
// still held, and a later Release starts a new release.
func (r *request) abandonRelease(op *releaseOp, err error) {
	r.mu.Lock()
	r.rel, r.released = nil, false
	r.mu.Unlock()
	op.err = fmt.Errorf("etcd: %w", err)
	close(op.done)
}

// finishRelease settles op with err; gone says the key is known to be gone
// (its number may be reused).
func (r *request) finishRelease(op *releaseOp, err error, gone bool) {
	r.stop()
	if gone {
		r.b.freeNum(r.num)
	}
	if err != nil {
		r.lose()
	}
	op.err = err
	close(op.done)
}

// settle says what a release transaction's answer means. retried: an
// earlier attempt got no answer and may have deleted the key itself.
func (r *request) settle(resp *clientv3.TxnResponse, retried bool) error {
	if resp.Succeeded {
		return nil
	}
	if !retried { // nothing of ours deleted the key
		return r.lostErr(!r.agentAlive(resp))
	}
	return r.whoDeleted()
}

// agentAlive reports whether the answer of releaseTxn's else branch shows
// our agent key on our lease.
func (r *request) agentAlive(resp *clientv3.TxnResponse) bool {
	if len(resp.Responses) == 0 {
		return false
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	return len(kvs) == 1 && clientv3.LeaseID(kvs[0].Lease) == r.sess.Lease()
}

// whoDeleted finds out who deleted our key after a retried release found
// it gone: our own earlier attempt (nil), a steal, or the end of our lease
// (see the file comment). It tries until etcd answers or the Manager closes.
func (r *request) whoDeleted() error {
	for {
		err, ok := r.whoDeletedOnce()
		if ok {
			return err
		}
		select {
		case <-time.After(retryPause):
		case <-r.b.ctx.Done():
			return manager.ErrClosed
		}
	}
}

func (r *request) whoDeletedOnce() (error, bool) {
	ctx, cancel := r.b.callCtx()
	defer cancel()
	d, err := r.deleteRev(ctx)
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return r.whoDeletedNow(ctx)
	case err != nil:
		return nil, false
	}
	resp, err := r.b.cli.Txn(ctx).Then(
		clientv3.OpGet(r.b.agentKey(), clientv3.WithRev(d)),
		clientv3.OpGet(r.base+"m", clientv3.WithRev(d)),
	).Commit()
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return r.whoDeletedNow(ctx)
	case err != nil:
		return nil, false
	}
	agent := resp.Responses[0].GetResponseRange().GetKvs()
	if len(agent) != 1 || clientv3.LeaseID(agent[0].Lease) != r.sess.Lease() {
		return r.lostErr(true), true // the lease ended at d (its agent key went with our key)
	}
	if m := resp.Responses[1].GetResponseRange().GetKvs(); len(m) == 1 && m[0].ModRevision == d {
		return r.lostErr(false), true // stolen: the steal's transaction wrote the marker at d
	}
	return nil, true // our own earlier attempt
}

// deleteRev is the revision at which our key was deleted after the grant.
func (r *request) deleteRev(ctx context.Context) (int64, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range r.b.cli.Watch(wctx, r.key, clientv3.WithRev(r.grantRev+1), clientv3.WithFilterPut()) {
		if wr.CompactRevision != 0 {
			return 0, rpctypes.ErrCompacted
		}
		if err := wr.Err(); err != nil {
			return 0, err
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return ev.Kv.ModRevision, nil
			}
		}
	}
	return 0, fmt.Errorf("watch of %q ended: %w", r.key, ctx.Err())
}

// whoDeletedNow decides from the current keys when the key's history was
// compacted away: no write of the marker since the grant and our agent key
// on our lease mean that neither a steal nor the end of the lease deleted
// the key, so our earlier attempt did.
func (r *request) whoDeletedNow(ctx context.Context) (error, bool) {
	resp, err := r.b.cli.Txn(ctx).Then(clientv3.OpGet(r.b.agentKey()), clientv3.OpGet(r.base+"m")).Commit()
	if err != nil {
		return nil, false
	}
	agent := resp.Responses[0].GetResponseRange().GetKvs()
	if len(agent) != 1 || clientv3.LeaseID(agent[0].Lease) != r.sess.Lease() {
		return fmt.Errorf("%w (history compacted: the lease ended before or after this release)", r.lostErr(true)), true
	}
	if m := resp.Responses[1].GetResponseRange().GetKvs(); len(m) == 1 && m[0].ModRevision > r.grantRev {
		return fmt.Errorf("%w (history compacted: the name was stolen or fenced since the grant)", r.lostErr(false)), true
	}
	return nil, true
}

// testHookRelease, set only by tests, runs before each retry of a release.
var testHookRelease hook[func(key string)]

// withdraw deletes our key if it is still ours (an aborted or failed
// request), with its own ctx (the caller's may be done). If etcd does not
// answer, it goes on in the background until it does, the lease ends or
// the Manager closes: a queued key nobody waits for would block its name.
func (r *request) withdraw() { r.b.deleteOwn(r.key, r.num, r.sess.Lease(), r.sess.Done()) }

// deleteOwn deletes key (number num) if it is still on lease, retrying in
// the background until etcd answers (the number is then reused), the lease
// ends (done: the key goes with it) or the Manager closes.
func (b *backend) deleteOwn(key string, num uint64, lease clientv3.LeaseID, done <-chan struct{}) {
	if b.deleteOwnTxn(key, num, lease) {
		return
	}
	go func() {
		for {
			select {
			case <-time.After(retryPause):
			case <-done:
				return
			case <-b.ctx.Done():
				return
			}
			if b.deleteOwnTxn(key, num, lease) {
				return
			}
		}
	}()
}

// deleteOwnTxn makes one attempt; it reports whether etcd answered (or
// refused the call for good: then the key goes with the lease).
func (b *backend) deleteOwnTxn(key string, num uint64, lease clientv3.LeaseID) bool {
	ctx, cancel := b.callCtx()
	defer cancel()
	_, err := b.cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", lease)).
		Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return permanent(err)
	}
	b.freeNum(num)
	return true
}

func (r *request) stop() {
	r.mu.Lock()
	stop := r.stopW
	r.mu.Unlock()
	if stop != nil {
		stop()
	}
	r.b.untrack(r)
}

// sessDone reports whether the client knows that our lease ended.
func (r *request) sessDone() bool {
	select {
	case <-r.sess.Done():
		return true
	default:
		return false
	}
}

// leaseEnded reports whether our lease has ended: the client knows it, or
// our agent key is no longer on it (the client may learn it only at its
// next keep-alive).
func (r *request) leaseEnded() bool {
	if r.sessDone() {
		return true
	}
	ctx, cancel := r.b.callCtx()
	defer cancel()
	g, err := r.b.cli.Get(ctx, r.b.agentKey())
	if err != nil {
		return r.sessDone()
	}
	return len(g.Kvs) != 1 || clientv3.LeaseID(g.Kvs[0].Lease) != r.sess.Lease()
}

// lostErr says why a held grant is gone; sessionLost: our lease ended.
func (r *request) lostErr(sessionLost bool) error {
	r.b.mu.Lock()
	closed := r.b.closed
	r.b.mu.Unlock()
	if closed {
		return manager.ErrClosed
	}
	if sessionLost {
		return fmt.Errorf("%w (%w)", manager.ErrStolen, ErrSessionLost)
	}
	return manager.ErrStolen
}
