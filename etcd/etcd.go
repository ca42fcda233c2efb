package etcd

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/manager"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Errors of the etcd backend, beside the manager sentinels. Test them with
// errors.Is.
var (
	// ErrSessionLost: the Manager's lease expired or was revoked (etcd
	// unreachable for longer than Options.TTL, or the lease deleted by
	// someone else). Its held locks were lost (errors.Is(err,
	// manager.ErrStolen) too) and its waiting requests failed.
	ErrSessionLost = errors.New("shmlocks/etcd: session lost")
	// ErrBadKey: a key under the prefix is not one this package wrote
	// (errors.Is(err, manager.ErrCorrupt) too).
	ErrBadKey = fmt.Errorf("shmlocks/etcd: unexpected key under the prefix: %w", manager.ErrCorrupt)
)

// Options configure Open. Zero fields take the defaults.
type Options struct {
	// TTL of the Manager's lease (default 5s; rounded up to whole seconds,
	// as etcd counts them; the server may raise it to its minimum). Every
	// request key is attached to the lease: when the process dies, or
	// cannot reach etcd, its held locks and pending requests are deleted
	// by etcd within TTL, and the Manager's Lost channels close. The
	// default of etcd's own concurrency.Session, 60s, is far too long for
	// "release when the process dies".
	TTL time.Duration
	// MaxNameLen is the longest lock name in bytes (default 256). A name
	// is escaped into the key, up to three bytes per byte.
	MaxNameLen int
	// CallTimeout bounds the etcd calls made without the caller's ctx:
	// Release, the withdrawal of an aborted request, Close (default 5s).
	CallTimeout time.Duration
	// DeadlockDelay is manager.OpenOptions.DeadlockDelay on etcd: how long
	// a request waits before the wait-for graph of the prefix is checked
	// for a cycle through it, then again every DeadlockDelay/2 while it
	// waits (default manager.DefaultDeadlockDelay; negative: this Manager
	// never checks and its requests are never chosen as victims; their
	// keys still record what their task holds, so other Managers see
	// cycles through them).
	DeadlockDelay time.Duration
}

const (
	defaultTTL        = 5 * time.Second
	defaultMaxNameLen = 256
	defaultCallTO     = 5 * time.Second
)

// Open returns a Manager with the manager contract whose locks live in etcd
// under prefix: one key per request, queued by create revision, attached to
// a lease of this Manager (see Options.TTL). Every Manager opened on the
// same prefix of the same cluster, in any process on any machine, is an
// agent of the same bucket. ctx bounds the creation of the lease. opts may
// be nil. Closing the Manager revokes the lease; cli stays open (it is the
// caller's).
func Open(ctx context.Context, cli *clientv3.Client, prefix string, opts *Options) (*manager.Manager, error) {
	b, err := open(ctx, cli, prefix, opts)
	if err != nil {
		return nil, err
	}
	return manager.NewBackendManager(b), nil
}

func open(ctx context.Context, cli *clientv3.Client, prefix string, opts *Options) (*backend, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.TTL <= 0 {
		o.TTL = defaultTTL
	}
	if o.MaxNameLen <= 0 {
		o.MaxNameLen = defaultMaxNameLen
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = defaultCallTO
	}
	// The client id is a random 64-bit number in hex, as the table's
	// (manager.ClientIDOf): the wait-for graph carries it as a nonce.
	var id [8]byte
	for binary.LittleEndian.Uint64(id[:]) == 0 {
		if _, err := rand.Read(id[:]); err != nil {
			return nil, err
		}
	}
	bctx, cancel := context.WithCancel(context.Background())
	b := &backend{
		cli:      cli,
		prefix:   strings.TrimRight(prefix, "/") + "/",
		opts:     o,
		clientID: inspect.ClientID(binary.LittleEndian.Uint64(id[:])),
		pid:      os.Getpid(),
		ctx:      bctx,
		cancel:   cancel,
		reqs:     map[*request]struct{}{},
	}
	if _, err := b.session(ctx); err != nil {
		cancel()
		return nil, fmt.Errorf("etcd: open %q: %w", prefix, err)
	}
	return b, nil
}

// backend is the manager.Backend of one Manager.
type backend struct {
	cli      *clientv3.Client
	prefix   string // ends with '/'
	opts     Options
	clientID string
	pid      int
	ctx      context.Context // cancelled by Close
	cancel   context.CancelFunc

	mu     sync.Mutex
	sess   *concurrency.Session // current lease; nil after it was lost
	seq    uint64               // key numbers made
	free   []uint64             // key numbers whose key is known to be gone
	reqs   map[*request]struct{}
	closed bool
	dl     deadlocks // deadlock.go
}

func (b *backend) ClientID() string { return b.clientID }
func (b *backend) MaxNameLen() int  { return b.opts.MaxNameLen }

// session returns the current lease, granting a new one if the last was
// lost: a lost lease fails what it carried, not the Manager.
func (b *backend) session(ctx context.Context) (*concurrency.Session, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, manager.ErrClosed
	}
	if b.sess != nil {
		select {
		case <-b.sess.Done():
			b.sess = nil
		default:
			return b.sess, nil
		}
	}
	ttl := int(math.Ceil(b.opts.TTL.Seconds()))
	// The lease lives until Close (b.ctx); ctx bounds only its grant.
	type result struct {
		s   *concurrency.Session
		err error
	}
	ch := make(chan result, 1)
	go func() {
		s, err := concurrency.NewSession(b.cli, concurrency.WithTTL(ttl), concurrency.WithContext(b.ctx))
		if err == nil {
			if err = b.putAgent(s); err != nil {
				s.Close()
				s = nil
			}
		}
		ch <- result{s, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		b.sess = r.s
		go b.watchSession(r.s)
		return r.s, nil
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.s != nil {
				r.s.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// putAgent writes the agent key of lease s (P/!a/<client>): it lives
// exactly as long as the lease, so the revision at which it was deleted is
// the revision at which the lease ended. Release uses it to tell the end of
// the lease from its own earlier delete (release.go).
func (b *backend) putAgent(s *concurrency.Session) error {
	ctx, cancel := context.WithTimeout(b.ctx, b.opts.CallTimeout)
	defer cancel()
	val, _ := json.Marshal(meta{Client: b.clientID, PID: b.pid})
	_, err := b.cli.Put(ctx, b.agentKey(), string(val), clientv3.WithLease(s.Lease()))
	if err != nil {
		return fmt.Errorf("agent key: %w", err)
	}
	return nil
}

// agentKey is this Manager's agent key.
func (b *backend) agentKey() string { return b.prefix + agentDir + b.clientID }

// watchSession fails everything s carried when it ends: held locks are
// lost (their keys are gone with the lease, or will be within its TTL),
// waiting requests return ErrSessionLost (they watch s.Done themselves).
func (b *backend) watchSession(s *concurrency.Session) {
	<-s.Done()
	b.mu.Lock()
	if b.sess == s {
		b.sess = nil
	}
	var lost []*request
	for r := range b.reqs {
		if r.sess == s {
			lost = append(lost, r)
		}
	}
	b.mu.Unlock()
	for _, r := range lost {
		r.lose()
	}
}

// isClosed reports whether Close was called (set before the lease is
// revoked, so that what the revocation ends can say ErrClosed).
func (b *backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

func (b *backend) track(r *request) {
	b.mu.Lock()
	b.reqs[r] = struct{}{}
	b.mu.Unlock()
}

func (b *backend) untrack(r *request) {
	b.mu.Lock()
	delete(b.reqs, r)
	b.mu.Unlock()
}

// Close revokes the lease, which deletes every key of this Manager in one
// step (its holds and its queued requests), closes the Lost channel of
// every held lock and fails waiting requests with ErrClosed.
func (b *backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	if b.dl.timer != nil {
		b.dl.timer.Stop()
	}
	s := b.sess
	b.sess = nil
	var reqs []*request
	for r := range b.reqs {
		reqs = append(reqs, r)
	}
	b.mu.Unlock()
	var err error
	if s != nil {
		ctx, cancel := context.WithTimeout(context.Background(), b.opts.CallTimeout)
		s.Orphan()
		_, err = b.cli.Revoke(ctx, s.Lease())
		cancel()
	}
	b.cancel()
	for _, r := range reqs {
		r.lose()
	}
	if err != nil {
		return fmt.Errorf("etcd: close: revoke lease: %w", err)
	}
	return nil
}

// nameBase is P/e/ for name.
func (b *backend) nameBase(name string) string { return b.prefix + escapeName(name) + "/" }

// callCtx is a ctx for a call made without the caller's.
func (b *backend) callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), b.opts.CallTimeout)
}

// newNum returns a number for a new request key: one whose key is known to
// be gone, else a new one. Keys are reused because etcd keeps a deleted
// key in its index until the next compaction, and a range read skips every
// such key under the name: with a new key per request, reading a name's
// queue slowed down with every request made on it since the last
// compaction (BenchmarkEtcd: 1.4-1.9x concurrency.Mutex's Lock+Unlock, which
// reuses its session's key). A live request's key is still its own: no
// two live requests share a number.
func (b *backend) newNum() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.free); n > 0 {
		num := b.free[n-1]
		b.free = b.free[:n-1]
		return num
	}
	b.seq++
	return b.seq
}

// freeNum makes num reusable (its key is gone).
func (b *backend) freeNum(num uint64) {
	b.mu.Lock()
	b.free = append(b.free, num)
	b.mu.Unlock()
}
