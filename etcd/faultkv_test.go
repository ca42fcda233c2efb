package etcd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// faultKV is a client's KV whose transactions a test can fail: before
// they reach etcd (nothing applied) or after (applied, the answer lost, as
// when the member that took the call stops before it answers). The rest of
// the client works.
type faultKV struct {
	clientv3.KV
	mu    sync.Mutex
	rule  func(t *txnCall) fault // nil: no faults
	reads atomic.Int64           // Gets and transactions made (tests of "never polls")
}

func (f *faultKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	f.reads.Add(1)
	return f.KV.Get(ctx, key, opts...)
}

// txnCall is one transaction as the backend built it.
type txnCall struct {
	then, els []clientv3.Op
}

// release reports whether the transaction is a Release (delete our key if
// still ours, else read the agent key), and of which key.
func (c *txnCall) release() (string, bool) {
	if len(c.then) == 1 && c.then[0].IsDelete() && len(c.els) == 1 && c.els[0].IsGet() {
		return string(c.then[0].KeyBytes()), true
	}
	return "", false
}

// withdrawal reports whether the transaction is the withdrawal of a request.
func (c *txnCall) withdrawal() (string, bool) {
	if len(c.then) == 1 && c.then[0].IsDelete() && len(c.els) == 0 {
		return string(c.then[0].KeyBytes()), true
	}
	return "", false
}

type fault int

const (
	pass       fault = iota
	failBefore       // not applied, an error returned
	failAfter        // applied, an error returned instead of the answer
	refuse           // not applied, refused for good (permission denied)
)

var errInjected = errors.New("injected: etcd unreachable")

func newFaultKV(cli *clientv3.Client) *faultKV {
	f := &faultKV{KV: cli.KV}
	cli.KV = f
	return f
}

func (f *faultKV) setRule(rule func(*txnCall) fault) {
	f.mu.Lock()
	f.rule = rule
	f.mu.Unlock()
}

func (f *faultKV) Txn(ctx context.Context) clientv3.Txn {
	return &faultTxn{f: f, t: f.KV.Txn(ctx)}
}

type faultTxn struct {
	f *faultKV
	t clientv3.Txn
	c txnCall
}

func (t *faultTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.t = t.t.If(cs...); return t }
func (t *faultTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.c.then = append(t.c.then, ops...)
	t.t = t.t.Then(ops...)
	return t
}
func (t *faultTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.c.els = append(t.c.els, ops...)
	t.t = t.t.Else(ops...)
	return t
}

func (t *faultTxn) Commit() (*clientv3.TxnResponse, error) {
	t.f.reads.Add(1)
	t.f.mu.Lock()
	rule := t.f.rule
	t.f.mu.Unlock()
	what := pass
	if rule != nil {
		what = rule(&t.c)
	}
	switch what {
	case failBefore:
		return nil, errInjected
	case refuse:
		return nil, rpctypes.ErrPermissionDenied
	case failAfter:
		if _, err := t.t.Commit(); err != nil {
			return nil, err
		}
		return nil, errInjected
	}
	return t.t.Commit()
}

// put reports whether the transaction puts key-prefix keys: the first
// attempt of an enqueue (put and read, or read), an IfAvailable (a put), a
// steal (deletes, our put and the marker's).
func (c *txnCall) puts() int {
	n := 0
	for _, op := range c.then {
		if op.IsPut() {
			n++
		}
	}
	return n
}
