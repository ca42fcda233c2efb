package etcd

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/shmlocks/shmlocks/internal/waitgraph"
	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/table"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Deadlock detection across machines (docs/etcd.md, "Deadlocks"; the rules
// are the table's, docs/multi-and-deadlock.md).
//
// The wait-for graph is read from the prefix's keys in one Get (one
// revision: a consistent snapshot, so no second read is needed to rule out
// a phantom cycle). Its nodes are the request keys; its edges, built by
// waitgraph.New as on the table:
//
//   - hard and soft: a waiting request to the conflicting holders of its
//     name and the conflicting requests queued ahead of it;
//   - task: a held request to a waiting request of the same Manager whose
//     task holds it. The waiting request's key says so: its value lists the
//     keys of the grants its ctx carries (manager.CarriedHolds: Request's
//     callback ctx, an AcquireAll's earlier names, WithLock), written with
//     the key itself.
//
// Every Manager whose DeadlockDelay is not negative runs rounds while it has
// waiting requests: every DeadlockDelay/2, it checks those that have waited
// DeadlockDelay at least (so a request is checked between DeadlockDelay and
// 1.5 x DeadlockDelay after it started waiting, as on the table). A request
// on a cycle whose other waiting requests were all made before it (lower
// create revision) is that cycle's victim: every Manager computes the same
// victim from the same keys. The victim withdraws its key in a transaction
// that holds only if every key of the cycle still has the create revision
// read (the cycle still stands), and fails with ErrDeadlock naming the
// cycle; if the cycle was broken meanwhile it waits on.

// verdict is what a round hands a victim: the cycle, described, and the
// create revision of each of its keys.
type verdict struct {
	desc string
	keys map[string]int64
}

// deadlocks is a backend's bookkeeping of its rounds (b.mu).
type deadlocks struct {
	waiting map[*request]time.Time // waiting requests, since when
	armed   bool
	timer   *time.Timer
}

// deadlockDelay is the Manager's DeadlockDelay (<= 0: no checks).
func (b *backend) deadlockDelay() time.Duration {
	if b.opts.DeadlockDelay == 0 {
		return manager.DefaultDeadlockDelay
	}
	return b.opts.DeadlockDelay
}

// parkDeadlock registers waiting request r with the rounds (once).
func (b *backend) parkDeadlock(r *request) {
	d := b.deadlockDelay()
	if d <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.dl.waiting[r]; ok || b.closed {
		return
	}
	if b.dl.waiting == nil {
		b.dl.waiting = map[*request]time.Time{}
	}
	b.dl.waiting[r] = time.Now()
	if b.dl.armed {
		return
	}
	b.dl.armed = true
	if b.dl.timer == nil {
		b.dl.timer = time.AfterFunc(d, b.deadlockRound)
	} else {
		b.dl.timer.Reset(d)
	}
}

// unparkDeadlock ends r's registration (its wait is over).
func (b *backend) unparkDeadlock(r *request) {
	b.mu.Lock()
	delete(b.dl.waiting, r)
	b.mu.Unlock()
}

// deadlockRound checks the requests that have waited DeadlockDelay, and
// schedules the next round while any request waits.
func (b *backend) deadlockRound() {
	d := b.deadlockDelay()
	b.mu.Lock()
	var due []*request
	now := time.Now()
	for r, since := range b.dl.waiting {
		if now.Sub(since) >= d && len(r.verdict) == 0 {
			due = append(due, r)
		}
	}
	b.mu.Unlock()
	if len(due) > 0 {
		b.checkRound(due) // an error (etcd unreachable) skips this round
	}
	b.mu.Lock()
	if len(b.dl.waiting) > 0 && !b.closed {
		b.dl.timer.Reset(d / 2)
	} else {
		b.dl.armed = false
	}
	b.mu.Unlock()
}

// checkRound reads the graph and hands each request of due that is the
// victim of a cycle its verdict.
func (b *backend) checkRound(due []*request) error {
	ctx, cancel := b.callCtx()
	defer cancel()
	gr, err := b.readGraph(ctx)
	if err != nil {
		return err
	}
	inCycle := gr.g.InCycle()
	for _, r := range due {
		i, ok := gr.node[r.key]
		if !ok || gr.g.Held(i) || !inCycle[i] {
			continue
		}
		c := gr.g.CycleThrough(i, true)
		if c == nil {
			continue
		}
		v := &verdict{desc: gr.g.Describe(c), keys: map[string]int64{}}
		for _, n := range c {
			v.keys[gr.reqs[n].key] = gr.reqs[n].createRev
		}
		select {
		case r.verdict <- v:
		default:
		}
	}
	return nil
}

// giveUp withdraws victim r if its cycle still stands (every key of it
// still has the create revision read) and returns ErrDeadlock; it returns
// nil if the cycle was broken meanwhile (r waits on).
func (r *request) giveUp(v *verdict) error {
	if h := testHookVictim.get(); h != nil {
		h()
	}
	err := fmt.Errorf("lock %q: %w: %s", r.name, manager.ErrDeadlock, v.desc)
	cmps := make([]clientv3.Cmp, 0, len(v.keys))
	for k, rev := range v.keys {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", rev))
	}
	ctx, cancel := r.b.callCtx()
	defer cancel()
	resp, terr := r.b.cli.Txn(ctx).If(cmps...).Then(clientv3.OpDelete(r.key)).Commit()
	switch {
	case terr != nil:
		r.withdraw() // the cycle stood when it was read: give up, never leave the key
		return err
	case resp.Succeeded:
		r.b.freeNum(r.num)
		return err
	}
	return nil
}

// testHookVictim, set only by tests, runs when a victim is about to give up.
var testHookVictim hook[func()]

// carriedKeys returns the keys of this Manager's grants that ctx carries.
func (b *backend) carriedKeys(ctx context.Context) []string {
	hs := manager.CarriedHolds(ctx, b)
	if len(hs) == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var keys []string
	for _, h := range hs {
		for r := range b.reqs {
			if r.grantRev != 0 && r.name == h.Name && uint64(r.grantRev) == h.Token {
				keys = append(keys, r.key)
				break
			}
		}
	}
	sort.Strings(keys)
	return keys
}

// graphRead is the wait-for graph of one read of the prefix.
type graphRead struct {
	g    *waitgraph.Graph
	reqs []req          // the request of each node
	node map[string]int // node of each request key
	rev  int64
}

// readGraph reads every key under the prefix (one revision) into its
// wait-for graph. Nodes are table.LockInfo as the table's graph wants them:
// Slot is the node's index (Serial 0), Agent the index of its client, Nonce
// its client id, Since a waiting request's create revision (the victim
// rule's order), Tag a hold's link to the waiting request of its task.
func (b *backend) readGraph(ctx context.Context) (*graphRead, error) {
	g, err := b.readNames(ctx)
	if err != nil {
		return nil, err
	}
	byName := map[string][]*mvccpb.KeyValue{}
	var names []string
	for _, kv := range g.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), b.prefix)
		e, _, ok := strings.Cut(rest, "/")
		if !ok {
			return nil, fmt.Errorf("%w: %q", ErrBadKey, kv.Key)
		}
		if reserved(e) {
			continue
		}
		if byName[e] == nil {
			names = append(names, e)
		}
		byName[e] = append(byName[e], kv)
	}
	sort.Strings(names)
	var heldR, pendR []req
	var heldN, pendN []string
	for _, e := range names {
		name, err := unescapeName(e)
		if err != nil {
			return nil, err
		}
		st, err := parseName(b.prefix+e+"/", byName[e])
		if err != nil {
			return nil, err
		}
		for i, r := range st.reqs {
			if ok, _ := grantable(st.reqs, i); ok {
				heldR, heldN = append(heldR, r), append(heldN, name)
			} else {
				pendR, pendN = append(pendR, r), append(pendN, name)
			}
		}
	}
	gr := &graphRead{reqs: append(heldR, pendR...), node: map[string]int{}, rev: g.Header.Revision}
	agents := map[string]uint32{}
	info := func(r req, name string, slot int) table.LockInfo {
		a, ok := agents[r.meta.Client]
		if !ok {
			a = uint32(len(agents))
			agents[r.meta.Client] = a
		}
		nonce, _ := strconv.ParseUint(r.meta.Client, 16, 64)
		mode := uint32(table.ModeExclusive)
		if !r.excl {
			mode = table.ModeShared
		}
		return table.LockInfo{Name: name, Mode: mode, Agent: a, PID: r.meta.PID, Nonce: nonce,
			Slot: uint32(slot), Steal: r.meta.Steal}
	}
	held := make([]table.LockInfo, len(heldR))
	for i, r := range heldR {
		held[i] = info(r, heldN[i], i)
		held[i].Token = uint64(r.modRev)
		gr.node[r.key] = i
	}
	pending := make([]table.LockInfo, len(pendR))
	for j, r := range pendR {
		i := len(heldR) + j
		pending[j] = info(r, pendN[j], i)
		pending[j].Since = r.createRev
		gr.node[r.key] = i
	}
	for j, r := range pendR {
		for _, k := range r.meta.Holds {
			if h, ok := gr.node[k]; ok && h < len(heldR) && held[h].Agent == pending[j].Agent && held[h].Tag == 0 {
				held[h].Tag = table.TaskTag(table.Ref{Slot: uint32(len(heldR) + j)})
			}
		}
	}
	gr.g = waitgraph.New(held, pending)
	return gr, nil
}

// WaitGraph implements manager.BackendWaitGrapher: who waits for whom
// under the prefix at one revision, and the cycles, each from its victim.
func (b *backend) WaitGraph(ctx context.Context) (manager.WaitGraph, error) {
	gr, err := b.readGraph(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return manager.WaitGraph{}, fmt.Errorf("%w: %w", manager.ErrAborted, ctx.Err())
		}
		return manager.WaitGraph{}, fmt.Errorf("etcd: %w", err)
	}
	return waitgraph.Public(gr.g).(manager.WaitGraph), nil
}
