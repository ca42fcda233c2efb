package etcd

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/shmlocks/shmlocks/manager"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Query implements manager.Backend: one read of the whole prefix (one
// revision, so a consistent snapshot), per name in name order; held are
// the requests with nothing conflicting ahead, pending the others in queue
// order.
func (b *backend) Query(ctx context.Context) (manager.Snapshot, error) {
	snap := manager.Snapshot{Held: []manager.LockInfo{}, Pending: []manager.LockInfo{}}
	g, err := b.readNames(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return snap, fmt.Errorf("%w: %w", manager.ErrAborted, ctx.Err())
		}
		return snap, fmt.Errorf("etcd: %w", err)
	}
	byName := map[string][]*mvccpb.KeyValue{}
	for _, kv := range g.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), b.prefix)
		e, _, ok := strings.Cut(rest, "/")
		if !ok {
			return snap, fmt.Errorf("%w: %q", ErrBadKey, kv.Key)
		}
		if reserved(e) {
			continue
		}
		byName[e] = append(byName[e], kv)
	}
	names := make([]string, 0, len(byName))
	for e := range byName {
		names = append(names, e)
	}
	sort.Strings(names)
	for _, e := range names {
		name, err := unescapeName(e)
		if err != nil {
			return snap, err
		}
		st, err := parseName(b.prefix+e+"/", byName[e])
		if err != nil {
			return snap, err
		}
		for i, r := range st.reqs {
			li := manager.LockInfo{Name: name, Mode: modeOf(r), ClientID: r.meta.Client, PID: r.meta.PID}
			if ok, _ := grantable(st.reqs, i); ok {
				snap.Held = append(snap.Held, li)
			} else {
				snap.Pending = append(snap.Pending, li)
			}
		}
	}
	return snap, nil
}
