package etcd

import (
	"context"
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// countKV is a client's KV and Watcher that count what the client asks of
// etcd: every KV call is one round trip (a transaction too), and every
// watch event received, by key (tests of "no polling", and the round
// trips measured by the benchmarks).
type countKV struct {
	clientv3.KV
	w clientv3.Watcher

	mu     sync.Mutex
	calls  []string // the first key of each KV call, in order
	events map[string]int
}

func newCountKV(cli *clientv3.Client) *countKV {
	c := &countKV{KV: cli.KV, w: cli.Watcher, events: map[string]int{}}
	cli.KV, cli.Watcher = c, c
	return c
}

func (c *countKV) note(key string) {
	c.mu.Lock()
	c.calls = append(c.calls, key)
	c.mu.Unlock()
}

// reset forgets what was counted so far.
func (c *countKV) reset() {
	c.mu.Lock()
	c.calls, c.events = nil, map[string]int{}
	c.mu.Unlock()
}

// trips is the number of KV calls made; with sub, only those whose first
// key contains sub.
func (c *countKV) trips(sub string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, k := range c.calls {
		if strings.Contains(k, sub) {
			n++
		}
	}
	return n
}

// eventsOn is the number of watch events received on keys containing sub.
func (c *countKV) eventsOn(sub string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, v := range c.events {
		if strings.Contains(k, sub) {
			n += v
		}
	}
	return n
}

func (c *countKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	c.note(key)
	return c.KV.Get(ctx, key, opts...)
}

func (c *countKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	c.note(key)
	return c.KV.Put(ctx, key, val, opts...)
}

func (c *countKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	c.note(key)
	return c.KV.Delete(ctx, key, opts...)
}

func (c *countKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	c.note(string(op.KeyBytes()))
	return c.KV.Do(ctx, op)
}

func (c *countKV) Txn(ctx context.Context) clientv3.Txn {
	return &countTxn{c: c, t: c.KV.Txn(ctx)}
}

type countTxn struct {
	c   *countKV
	t   clientv3.Txn
	key string // the first key of its Then ops
}

func (t *countTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.t = t.t.If(cs...); return t }
func (t *countTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		if t.key == "" {
			t.key = string(op.KeyBytes())
		}
	}
	t.t = t.t.Then(ops...)
	return t
}
func (t *countTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.t = t.t.Else(ops...); return t }
func (t *countTxn) Commit() (*clientv3.TxnResponse, error) {
	t.c.note("txn:" + t.key)
	return t.t.Commit()
}

func (c *countKV) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	in := c.w.Watch(ctx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for wr := range in {
			c.mu.Lock()
			for _, ev := range wr.Events {
				c.events[string(ev.Kv.Key)]++
			}
			c.mu.Unlock()
			select {
			case out <- wr:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

func (c *countKV) RequestProgress(ctx context.Context) error { return c.w.RequestProgress(ctx) }
func (c *countKV) Close() error                              { return c.w.Close() }
