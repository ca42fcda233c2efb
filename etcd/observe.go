package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/shmlocks/shmlocks/manager"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Observing a name without requesting it (manager.BackendObserver).
//
// State is one read of the name's keys. WaitUnlocked and Watch keep the
// name's keys up to date from a watch of P/e/ (a follower): a first read at
// revision R, then the watch from R+1, whose events are applied revision by
// revision, each revision giving one state of the name. They are woken by
// the watch only, never by polling. While they last they keep a watcher key
// P/e/w/<client>-<n> on the Manager's lease (NameState.Watchers counts
// them); WaitUnlocked writes it only when the name is not free at its first
// read.
//
// A watch that breaks (a member stopped, no leader, the client reconnecting)
// is resumed by the client from the next revision; one that etcd refuses
// because that revision was compacted away, or that ends, is replaced by a
// fresh read (the current state, which is delivered) and a watch from the
// read's revision + 1. The states between are lost, the last one never is.

// State implements manager.BackendObserver: one read of the name's keys.
func (b *backend) State(ctx context.Context, name string) (manager.NameState, error) {
	f := b.follower(name)
	if err := f.load(ctx); err != nil {
		return manager.NameState{}, b.obsErr(ctx, "state of lock", name, err)
	}
	st, err := f.state()
	if err != nil {
		return manager.NameState{}, fmt.Errorf("state of lock %q: %w", name, err)
	}
	return publicState(name, st), nil
}

// WaitUnlocked implements manager.BackendObserver.
func (b *backend) WaitUnlocked(ctx context.Context, name string, mode manager.Mode) error {
	f := b.follower(name)
	if err := f.load(ctx); err != nil {
		return b.obsErr(ctx, "wait for lock", name, err)
	}
	if st, err := f.state(); err != nil || unlocked(st, mode) {
		return wrapName("wait for lock", name, err)
	}
	w, err := f.register(ctx)
	if err != nil {
		return b.obsErr(ctx, "wait for lock", name, err)
	}
	if st, err := f.state(); err != nil || unlocked(st, mode) {
		w.remove()
		return wrapName("wait for lock", name, err)
	}
	err = f.follow(ctx, w.sess, func(st nameState) bool { return unlocked(st, mode) })
	if err == nil {
		// Woken: return at once, and let the watcher key go in the
		// background (a round trip that would delay every wake-up;
		// NameState.Watchers counts this call that much longer).
		go w.remove()
		return nil
	}
	w.remove()
	return b.obsErr(ctx, "wait for lock", name, err)
}

// unlocked reports whether a request in mode would be granted at once:
// nothing queued, nothing held that conflicts.
func unlocked(st nameState, mode manager.Mode) bool {
	for _, r := range st.reqs {
		if mode == manager.Exclusive || r.excl {
			return false
		}
	}
	return true
}

// Watch implements manager.BackendObserver: the channel holds the latest
// state not yet taken (a newer one replaces it), and closes when ctx ends,
// the Manager closes or the Manager's lease ends (its watcher key went).
func (b *backend) Watch(ctx context.Context, name string) (<-chan manager.NameState, error) {
	f := b.follower(name)
	w, err := f.register(ctx)
	if err != nil {
		return nil, b.obsErr(ctx, "watch lock", name, err)
	}
	st, err := f.state()
	if err != nil {
		w.remove()
		return nil, fmt.Errorf("watch lock %q: %w", name, err)
	}
	out := make(chan manager.NameState, 1)
	last := publicState(name, st)
	out <- last
	go func() {
		defer close(out)
		defer w.remove()
		f.follow(ctx, w.sess, func(st nameState) bool {
			ps := publicState(name, st)
			if sameState(ps, last) {
				return false
			}
			last = ps
			select {
			case <-out: // the reader has not taken the previous state: replace it
			default:
			}
			out <- ps // never blocks: this goroutine is the only sender
			return false
		})
	}()
	return out, nil
}

// follower holds the keys of one name, as of revision rev.
type follower struct {
	b          *backend
	name, base string
	kvs        map[string]*mvccpb.KeyValue
	rev        int64
}

func (b *backend) follower(name string) *follower {
	return &follower{b: b, name: name, base: b.nameBase(name)}
}

// load reads the name's keys.
func (f *follower) load(ctx context.Context) error {
	g, err := f.b.cli.Get(ctx, f.base, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	f.reset(g.Kvs, g.Header.Revision)
	return nil
}

func (f *follower) reset(kvs []*mvccpb.KeyValue, rev int64) {
	f.kvs = make(map[string]*mvccpb.KeyValue, len(kvs))
	for _, kv := range kvs {
		f.kvs[string(kv.Key)] = kv
	}
	f.rev = rev
}

func (f *follower) state() (nameState, error) {
	kvs := make([]*mvccpb.KeyValue, 0, len(f.kvs))
	for _, kv := range f.kvs {
		kvs = append(kvs, kv)
	}
	sort.Slice(kvs, func(i, j int) bool { return string(kvs[i].Key) < string(kvs[j].Key) })
	return parseName(f.base, kvs)
}

// watcher is a watcher key of this Manager.
type watcher struct {
	b    *backend
	key  string
	num  uint64
	sess *concurrency.Session
}

// register writes a watcher key for the name and reads the name's keys, in
// one transaction.
func (f *follower) register(ctx context.Context) (*watcher, error) {
	s, err := f.b.session(ctx)
	if err != nil {
		return nil, err
	}
	w := &watcher{b: f.b, num: f.b.newNum(), sess: s}
	w.key = f.base + "w/" + f.b.clientID + "-" + strconv.FormatUint(w.num, 10)
	val, _ := json.Marshal(meta{Client: f.b.clientID, PID: f.b.pid, Since: time.Now().UnixNano()})
	resp, err := f.b.cli.Txn(ctx).Then(
		clientv3.OpPut(w.key, string(val), clientv3.WithLease(s.Lease())),
		clientv3.OpGet(f.base, clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		w.remove() // the put may have happened
		if errors.Is(err, errLeaseNotFound) {
			err = fmt.Errorf("%w: %w", ErrSessionLost, err)
		}
		return nil, err
	}
	f.reset(resp.Responses[1].GetResponseRange().Kvs, resp.Header.Revision)
	return w, nil
}

// remove deletes the watcher key (retried in the background if etcd does
// not answer, until the lease ends).
func (w *watcher) remove() { w.b.deleteOwn(w.key, w.num, w.sess.Lease(), w.sess.Done()) }

// follow applies the name's changes from rev+1 on, revision by revision,
// and calls done with each revision's state (and with the state read after
// a watch had to be replaced) until done returns true (nil), ctx ends, the
// Manager closes or s ends.
func (f *follower) follow(ctx context.Context, s *concurrency.Session, done func(nameState) bool) error {
	for {
		if h := testHookFollow.get(); h != nil {
			h(f.base, f.rev)
		}
		over, err := f.watch(ctx, s, done)
		if over || err != nil {
			return err
		}
		// The watch was refused (compacted) or ended: read the name again.
		for {
			if err := f.load(ctx); err == nil {
				break
			}
			select {
			case <-time.After(retryPause):
			case <-ctx.Done():
				return ctx.Err()
			case <-f.b.ctx.Done():
				return manager.ErrClosed
			case <-s.Done():
				return ErrSessionLost
			}
		}
		st, err := f.state()
		if err != nil {
			return err
		}
		if done(st) {
			return nil
		}
	}
}

// watch runs one watch from rev+1; over: done returned true. It returns
// (false, nil) when the watch must be replaced.
func (f *follower) watch(ctx context.Context, s *concurrency.Session, done func(nameState) bool) (over bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := f.b.cli.Watch(wctx, f.base, clientv3.WithPrefix(), clientv3.WithRev(f.rev+1))
	for {
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case <-f.b.ctx.Done():
			return true, manager.ErrClosed
		case <-s.Done():
			return true, ErrSessionLost
		case wr, ok := <-wch:
			if !ok || wr.Canceled || wr.Err() != nil {
				return false, nil
			}
			evs := wr.Events
			for len(evs) > 0 {
				rev := evs[0].Kv.ModRevision
				n := 0
				for n < len(evs) && evs[n].Kv.ModRevision == rev {
					ev := evs[n]
					if ev.Type == clientv3.EventTypeDelete {
						delete(f.kvs, string(ev.Kv.Key))
					} else {
						f.kvs[string(ev.Kv.Key)] = ev.Kv
					}
					n++
				}
				evs = evs[n:]
				f.rev = rev
				st, err := f.state()
				if err != nil {
					return true, err
				}
				if done(st) {
					return true, nil
				}
			}
		}
	}
}

// testHookFollow, set only by tests, runs before a follower starts a watch
// from rev+1 of the keys under base.
var testHookFollow hook[func(base string, rev int64)]

// publicState is the manager's form of st. A holder's token is its key's
// mod revision (its create revision, or the revision at which it took a
// token above a steal's); a pending request's Since is when it was made.
func publicState(name string, st nameState) manager.NameState {
	out := manager.NameState{Name: name, Held: []manager.RequestState{}, Pending: []manager.RequestState{}, Watchers: st.watchers}
	for i, r := range st.reqs {
		rs := manager.RequestState{Mode: modeOf(r), ClientID: r.meta.Client, PID: r.meta.PID}
		if ok, _ := grantable(st.reqs, i); ok {
			rs.Token = uint64(r.modRev)
			out.Held = append(out.Held, rs)
			continue
		}
		if r.meta.Since != 0 {
			rs.Since = time.Unix(0, r.meta.Since)
		}
		out.Pending = append(out.Pending, rs)
	}
	return out
}

func sameState(a, b manager.NameState) bool {
	if a.Watchers != b.Watchers || len(a.Held) != len(b.Held) || len(a.Pending) != len(b.Pending) {
		return false
	}
	for i := range a.Held {
		if !sameRequest(a.Held[i], b.Held[i]) {
			return false
		}
	}
	for i := range a.Pending {
		if !sameRequest(a.Pending[i], b.Pending[i]) {
			return false
		}
	}
	return true
}

func sameRequest(a, b manager.RequestState) bool {
	return a.Mode == b.Mode && a.ClientID == b.ClientID && a.PID == b.PID && a.Token == b.Token && a.Since.Equal(b.Since)
}

// obsErr maps the error of an observation: ErrClosed, ErrAborted joined
// with ctx.Err(), ErrSessionLost, or etcd's.
func (b *backend) obsErr(ctx context.Context, what, name string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, manager.ErrClosed) || b.isClosed():
		return fmt.Errorf("%s %q: %w", what, name, manager.ErrClosed)
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %s %q: %w", manager.ErrAborted, what, name, ctx.Err())
	case errors.Is(err, ErrSessionLost):
		return fmt.Errorf("%s %q: %w", what, name, err)
	case errors.Is(err, manager.ErrCorrupt):
		return fmt.Errorf("%s %q: %w", what, name, err)
	}
	return fmt.Errorf("%s %q: etcd: %w", what, name, err)
}

// wrapName wraps a non-nil err with what was done and the name.
func wrapName(what, name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s %q: %w", what, name, err)
}
