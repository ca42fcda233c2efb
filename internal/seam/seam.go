// Package seam is what package manager hands to the packages built on it
// (coalesce, and the backends' record stores), without knowing them: a
// context marker that admits reserved lock names, a per-bucket record store
// whose writes are fenced by a lock, and the Manager's name rules.
//
// The dependency runs one way: manager imports seam and registers, in its
// init, the function that opens a Manager's Bucket; a feature package
// imports manager and seam and calls Open. Nothing here is public API (the
// internal/ rule admits the packages of this module and of the modules
// nested under it, such as github.com/shmlocks/shmlocks/etcd).
package seam

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/shmlocks/shmlocks/internal/testhooks"
)

// reservedKey marks a ctx whose requests may use reserved names.
type reservedKey struct{}

// Reserved returns ctx marked so that a request made with it may use a
// reserved lock name: one starting with '-', which user requests may not,
// so that a feature's own locks never meet a user's names. Never hand such
// a ctx to user code.
func Reserved(ctx context.Context) context.Context {
	return context.WithValue(ctx, reservedKey{}, true)
}

// IsReserved reports whether ctx carries Reserved's marker.
func IsReserved(ctx context.Context) bool { return ctx.Value(reservedKey{}) != nil }

// Grant is a granted lock as a Store sees it: a *manager.Lock.
type Grant interface {
	Name() string
	Token() uint64
	Lost() <-chan struct{}
}

// Store keeps a feature's records in a bucket: one record per key, shared
// by every agent of the bucket, each record written only by the holder of
// the lock that guards its key. Records are untrusted bytes: the feature
// validates what it loads. Keys are 1 to 64 bytes of [0-9A-Za-z_-].
type Store interface {
	// Load returns the record under key, or an error wrapping
	// fs.ErrNotExist when there is none. A record longer than max bytes is
	// returned cut to max+1 bytes: the caller reports it as too long.
	Load(key string, max int) ([]byte, error)
	// Publish replaces the record under key with rec, atomically (a reader
	// sees the previous record or rec, whole), only while g is held: g is
	// checked held, and cannot be released (by its Manager's Close) until
	// the record is in place; a lost g is an error wrapping
	// manager.ErrStolen, a closed Manager manager.ErrClosed. The caller
	// holds g, the lock that guards key, so no other agent publishes under
	// key meanwhile.
	Publish(g Grant, key string, rec []byte) error
	// Range calls fn for every record (cut as by Load) and returns the
	// store's own findings (unreadable or unexpected entries) joined with
	// fn's errors; a store with no record yet is nil.
	Range(max int, fn func(key string, rec []byte) error) error
}

// StoreProvider is implemented by a manager.Backend that keeps feature
// records; the Managers made with NewBackendManager hand its stores to the
// feature packages. Without it, a feature that needs a store is
// ErrNotSupported on that backend.
type StoreProvider interface {
	// Store returns the store of feature (a short lower-case word, such
	// as "coalesce"), shared by every client of the backend's bucket.
	Store(feature string) (Store, error)
}

// Bucket is what a feature package gets from one Manager.
type Bucket struct {
	// MaxNameLen is the longest lock name the Manager accepts, in bytes.
	MaxNameLen int
	// Validate applies the Manager's checks to a request on name, in the
	// contract's order: closed (ErrClosed), then the name (ErrNotSupported),
	// then ctx (ErrAborted).
	Validate func(ctx context.Context, name string) error
	// Store is feature's record store in the Manager's bucket.
	Store Store
}

var open atomic.Pointer[func(m any, feature string) (Bucket, error)]

// Register sets the function Open calls; package manager calls it once,
// in its init.
func Register(f func(m any, feature string) (Bucket, error)) { open.Store(&f) }

// Open returns the Bucket of m, a *manager.Manager, for feature: an error
// wrapping manager.ErrClosed for a closed (or zero) Manager,
// manager.ErrNotSupported for a backend without a store.
func Open(m any, feature string) (Bucket, error) {
	f := open.Load()
	if f == nil {
		return Bucket{}, errNoManager
	}
	return (*f)(m, feature)
}

var errNoManager = errors.New("seam: package manager is not linked in")

// Crash marks a crash point of a feature or a store: a test may kill the
// process there (internal/testhooks.SetCrash, the table's hook too).
func Crash(point string) { testhooks.Crash(point) }

// CheckKey reports whether key is a valid store key: 1 to 64 bytes of
// [0-9A-Za-z_-]. A backend's store applies it as the table's does.
func CheckKey(key string) error { return checkKey(key) }

// ErrRecordTooLarge: a store refused a record for its size (etcd: the
// request is larger than the server takes). Publish wraps it; nothing was
// written, and the grant is still held.
var ErrRecordTooLarge = errors.New("seam: record too large for the store")

// PublishReleaser is implemented by a Store that can publish and give up
// the guarding grant in one step (etcd: one transaction puts the record
// and deletes the grant's request key). PublishRelease is Publish followed
// by the release of g, atomically: on success g's Release returns nil
// without another call to the store (the caller still calls it); on
// failure g is as Publish leaves it.
type PublishReleaser interface {
	PublishRelease(g Grant, key string, rec []byte) error
}

// Follower is implemented by a Store that can tell a waiting reader of a
// new record without polling (etcd: a watch of the record's key). Follow
// calls fn, from a goroutine of its own and one call at a time, with each
// record put under key after revision from (a GrantRead's Rev; 0: from
// about the call on), cut as by Load, until ctx ends. It may miss records
// (a watch compacted away): a caller uses it to learn early, never as its
// only way to learn.
type Follower interface {
	Follow(ctx context.Context, key string, max int, from int64, fn func(rec []byte))
}

// GrantRead asks the backend that takes a request made with a ctx that
// carries it (WithGrantRead) to read a record of one of its own stores in
// the step that grants the request or finds it not grantable (etcd: the
// transaction of an IfAvailable request), so that the record is the one in
// place at that attempt (at the grant, if granted). A backend that cannot
// leaves Done false and the caller loads the record itself.
type GrantRead struct {
	Store Store
	Key   string
	Max   int
	// Set by the backend when its attempt read the record: Rec is the
	// record (cut as by Load), nil when there was none.
	Done bool
	Rec  []byte
	// Rev, when the backend has one, is the store's revision at the
	// request's attempt, granted or not: a Follow from it misses nothing
	// published after the attempt.
	Rev int64
}

type grantReadKey struct{}

// WithGrantRead returns ctx carrying gr (for one request only).
func WithGrantRead(ctx context.Context, gr *GrantRead) context.Context {
	return context.WithValue(ctx, grantReadKey{}, gr)
}

// GrantReadOf returns the GrantRead ctx carries, or nil.
func GrantReadOf(ctx context.Context) *GrantRead {
	gr, _ := ctx.Value(grantReadKey{}).(*GrantRead)
	return gr
}
