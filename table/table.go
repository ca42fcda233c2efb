package table

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/shmlocks/shmlocks/shm"
)

// Table is one process's view of a mapped lock table file.
type Table struct {
	m        *shm.Mapping
	buf      []byte
	base     unsafe.Pointer
	l        layout
	mask     uint32
	nonce    uint64
	readOnly bool
	closed   atomic.Bool
	ringer   atomic.Pointer[func(agent uint32, nonce uint64)]

	path   string                      // the path it was opened by (agents reopen it for their locks)
	fi     os.FileInfo                 // the mapped file (a reopened path must be it)
	probe  atomic.Int64                // a descriptor for lock queries (live.go); -1 none
	events atomic.Pointer[func(Event)] // SetEventHook (events.go)
}

// Open maps the table at path, creating it with geometry g (and permission
// bits mode, 0 meaning 0600) when it does not exist. An existing file keeps
// its own geometry; it is validated (magic, version, checksum, geometry,
// size) and anything else is ErrCorrupt naming the field. A table Open
// creates grants in strict arrival order (OpenFair for bounded fairness).
func Open(path string, g Geometry, mode os.FileMode) (t *Table, created bool, err error) {
	return OpenFair(path, g, mode, 0)
}

// OpenFair is Open with the fairness a created table records: bound 0 is
// strict arrival order (FIFO), a bound in (0, MaxFairnessBound] is bounded
// fairness (fairness.go). An existing file keeps its own (Table.Bound).
func OpenFair(path string, g Geometry, mode os.FileMode, bound time.Duration) (t *Table, created bool, err error) {
	if err := g.validate(); err != nil {
		return nil, false, err
	}
	if bound < 0 || bound > MaxFairnessBound {
		return nil, false, fmt.Errorf("%w: fairness bound %v out of range [0, %v]", ErrGeometry, bound, MaxFairnessBound)
	}
	l := g.layout()
	l.bound = int64(bound)
	if mode == 0 {
		mode = 0o600
	}
	init := func(b []byte) error {
		var n [8]byte
		if _, err := rand.Read(n[:]); err != nil {
			return err
		}
		l.writeHeader(b, binary.NativeEndian.Uint64(n[:])|1, time.Now().UnixNano())
		writeBootID(b, BootID())
		return nil
	}
	validate := func(b []byte) (err error) {
		defer recoverFault(&err)
		_, err = parseHeader(b)
		return err
	}
	m, created, err := openOrReplace(path, l, mode, init, validate)
	if err != nil {
		if errors.Is(err, shm.ErrTooSmall) {
			return nil, false, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return nil, false, err
	}
	t, err = newTable(m, false)
	return t, created, err
}

// OpenReadOnly maps an existing table read-only (for inspection tools). Such a
// table supports Snapshot(nil), Agents, Check(nil) and Render, never updates.
func OpenReadOnly(path string) (*Table, error) {
	validate := func(b []byte) (err error) {
		defer recoverFault(&err)
		_, err = parseHeader(b)
		return err
	}
	m, err := shm.OpenReadOnly(path, HeaderSize, validate)
	var fe *FormatError
	if errors.As(err, &fe) && fe.Found < FormatVersion {
		fe.InUse, fe.Unused = formatUse(path)
	}
	if err != nil {
		if errors.Is(err, shm.ErrTooSmall) {
			return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return nil, err
	}
	return newTable(m, true)
}

func newTable(m *shm.Mapping, ro bool) (*Table, error) {
	b := m.Bytes()
	l, err := parseHeader(b)
	if err != nil {
		m.Close()
		return nil, err
	}
	t := &Table{m: m, buf: b, base: unsafe.Pointer(&b[0]), l: l, mask: l.buckets - 1, readOnly: ro}
	t.nonce = binary.NativeEndian.Uint64(b[hdrNonce:])
	t.probe.Store(-1)
	if f := m.File(); f != nil {
		t.path = f.Name()
		t.fi, _ = f.Stat()
		t.probe.Store(int64(m.Probe()))
	}
	return t, nil
}

// CloseFile closes the table's file descriptor and keeps the mapping valid
// until Close. The Manager uses it so that a racing Release never faults.
func (t *Table) CloseFile() error { return t.m.CloseFile() }

// Close unmaps the table. Idempotent.
func (t *Table) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	err := t.m.Close()
	shm.CloseProbe(int(t.probe.Swap(-1)))
	return err
}

// Geometry returns the table's geometry.
func (t *Table) Geometry() Geometry { return t.l.Geometry }

// Slots returns the number of slots: MaxRequests request slots and one
// reserved slot per entry (slot indices in a Ref are below it).
func (t *Table) Slots() int { return int(t.l.slots) }

// Size returns the file size in bytes.
func (t *Table) Size() int { return int(t.l.size) }

// Nonce returns the random number that names this table (creation nonce).
func (t *Table) Nonce() uint64 { return t.nonce }

// Bytes exposes the mapping (tests, fuzzing and the dump tool).
func (t *Table) Bytes() []byte { return t.buf }

// Created returns the creation time recorded in the header.
func (t *Table) Created() time.Time {
	return time.Unix(0, int64(binary.NativeEndian.Uint64(t.buf[hdrCreated:])))
}

// BucketOf returns the bucket of a name hash.
func (t *Table) BucketOf(h uint64) uint32 { return uint32(h^h>>32) & t.mask }

func writeBootID(b []byte, id [16]byte) {
	ne := binary.NativeEndian
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&b[hdrBootID])), ne.Uint64(id[:8]))
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&b[hdrBootID+8])), ne.Uint64(id[8:]))
}

// BootID returns the boot id recorded in the header (the kernel that last
// reset the table's agents).
func (t *Table) BootID() [16]byte {
	var id [16]byte
	ne := binary.NativeEndian
	ne.PutUint64(id[:8], atomic.LoadUint64(t.u64(hdrBootID)))
	ne.PutUint64(id[8:], atomic.LoadUint64(t.u64(hdrBootID+8)))
	return id
}

// StaleBoot reports whether the header's boot id differs from the running
// kernel's: the file outlived a reboot and every recorded agent is dead.
func (t *Table) StaleBoot() bool { return t.BootID() != BootID() }

// MarkBoot records the running kernel's boot id in the header.
func (t *Table) MarkBoot() {
	if !t.readOnly {
		writeBootID(t.buf, BootID())
	}
}

// recoverFault turns a memory fault on the mapping (a file truncated under
// us: SIGBUS) into ErrCorrupt. It must be deferred by a function that called
// debug.SetPanicOnFault(true) or runs on a goroutine that did; Guard does both.
func recoverFault(err *error) {
	if r := recover(); r != nil {
		*err = faultErr(r)
	}
}

// faultErr is ErrCorrupt for a recovered memory fault; any other panic goes on.
func faultErr(r any) error {
	if e, ok := r.(interface{ Addr() uintptr }); ok {
		return fmt.Errorf("%w: memory fault at %#x reading the mapping (file truncated?)", ErrCorrupt, e.Addr())
	}
	panic(r)
}

// Guard runs f with memory faults on the mapping turned into ErrCorrupt
// instead of crashing the process.
func Guard(f func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer recoverFault(&err)
	return f()
}

// BeginGuard and EndGuard are Guard without a closure, for the hot paths
// (Acquire and Release): a function that may read the mapping starts with
//
//	defer table.EndGuard(table.BeginGuard(), &err, onFault)
//
// and a memory fault on the mapping below it returns ErrCorrupt in err
// instead of crashing the process; onFault (may be nil) is then called.
// EndGuard must be the deferred function itself (it calls recover).
func BeginGuard() bool { return debug.SetPanicOnFault(true) }

// EndGuard restores the fault mode saved by BeginGuard; see BeginGuard.
func EndGuard(old bool, err *error, onFault func()) {
	debug.SetPanicOnFault(old)
	if r := recover(); r != nil {
		*err = faultErr(r)
		if onFault != nil {
			onFault()
		}
	}
}

// SpareWord returns a pointer to a reserved, otherwise unused 32-bit word of
// the header (benchmarks use it for the raw-CAS floor on the shared mapping).
func (t *Table) SpareWord() unsafe.Pointer { return unsafe.Pointer(t.u32(hdrSpare)) }

// Buckets is the number of buckets (a power of two, at least 2·MaxResources).
func (t *Table) Buckets() int { return int(t.l.buckets) }
