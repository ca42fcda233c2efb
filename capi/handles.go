//go:build linux && cgo

package main

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/shmlocks/shmlocks/manager"
)

// A handle is what crosses the C boundary for a table, a lock or a cancel
// token: the kind in its top byte and a sequence number below, never
// reused for the life of the process. A handle that was closed, released
// or freed is simply absent from its kind's map, so a stale, double or
// foreign handle is refused, never dereferenced (no Go pointer and no
// cgo.Handle crosses the boundary: cgo.Handle.Value panics, and aborts the
// host, on a deleted handle).
type handleKind uint64

const (
	kindTable  handleKind = 0x51
	kindLock   handleKind = 0x52
	kindCancel handleKind = 0x53
	kindShift             = 56
)

func (k handleKind) String() string {
	switch k {
	case kindTable:
		return "table"
	case kindLock:
		return "lock"
	case kindCancel:
		return "cancel token"
	}
	return "unknown"
}

var seq atomic.Uint64

func newHandle(k handleKind) uint64 { return uint64(k)<<kindShift | seq.Add(1) }

func kindOf(h uint64) handleKind { return handleKind(h >> kindShift) }

type tableEntry struct {
	m          *manager.Manager
	maxNameLen int
}

type lockEntry struct {
	l     *manager.Lock
	table uint64
	// watch is the lost descriptor's watcher, started by the first
	// shmlocks_lost_fd (lostfd.go); nil until then.
	watch *lostWatch
}

type cancelEntry struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// registry holds every live handle. Its maps are written under mu; each
// entry's fields are set before it is inserted and not changed after,
// except lockEntry.watch, set under mu.
var registry struct {
	mu      sync.Mutex
	tables  map[uint64]*tableEntry
	locks   map[uint64]*lockEntry
	cancels map[uint64]*cancelEntry
	// closed holds the table handles that were closed (8 bytes each, for
	// the life of the process), so that a call on one says
	// SHMLOCKS_ERR_CLOSED, as the manager does after Close.
	closed map[uint64]struct{}
}

func init() {
	registry.tables = map[uint64]*tableEntry{}
	registry.locks = map[uint64]*lockEntry{}
	registry.cancels = map[uint64]*cancelEntry{}
	registry.closed = map[uint64]struct{}{}
}

// badHandle is the error for a handle h that should be of kind want.
func badHandle(h uint64, want handleKind) *apiError {
	if h == 0 {
		return errf(codeInvalid, "shmlocks: %s handle is 0", want)
	}
	if k := kindOf(h); k != want {
		return errf(codeBadHandle, "shmlocks: handle %#x is not a %s handle (it is of kind %s)", h, want, k)
	}
	return errf(codeBadHandle, "shmlocks: %s handle %#x is not live (closed, released, freed, or never issued)", want, h)
}

func getTable(h uint64) (*tableEntry, *apiError) {
	registry.mu.Lock()
	t := registry.tables[h]
	_, closed := registry.closed[h]
	registry.mu.Unlock()
	if closed {
		return nil, errf(codeClosed, "shmlocks: table handle %#x was closed", h)
	}
	if t == nil {
		return nil, badHandle(h, kindTable)
	}
	return t, nil
}

func getLock(h uint64) (*lockEntry, *apiError) {
	registry.mu.Lock()
	l := registry.locks[h]
	registry.mu.Unlock()
	if l == nil {
		return nil, badHandle(h, kindLock)
	}
	return l, nil
}

func getCancel(h uint64) (*cancelEntry, *apiError) {
	registry.mu.Lock()
	c := registry.cancels[h]
	registry.mu.Unlock()
	if c == nil {
		return nil, badHandle(h, kindCancel)
	}
	return c, nil
}
