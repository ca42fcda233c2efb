package shm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"unsafe"

	mmap "github.com/edsrzf/mmap-go"
)

// Mapping is an open, memory-mapped file. Its methods must not be called
// concurrently with Close; the memory returned by Bytes, Uint32 and Uint64 must
// not be used after Close.
type Mapping struct {
	f        *os.File
	mm       mmap.MMap
	readOnly bool
}

// maxAttempts bounds how often Open restarts when the file vanishes (or is
// replaced) between a failed link and the following open.
const maxAttempts = 8

// canRemoveOpenFile reports whether a file's name can be removed while the file
// is open (and mapped). Not on Windows, which has no FILE_SHARE_DELETE in os.
const canRemoveOpenFile = runtime.GOOS != "windows"

var (
	// errRetry marks transient conditions after which Open starts over: the
	// file vanished after a lost link race, or was replaced between Lstat and
	// open.
	errRetry = errors.New("shm: file changed during open")
)

// Open opens the file at path, creating it if it does not exist, and maps it
// read-write and shared.
//
// If path does not exist, a temporary file is created in the same directory
// (O_EXCL, random name), set to mode with fchmod (0600 if mode is 0; the umask
// does not apply), truncated to size, mapped and passed to init (which may be
// nil) to be filled, and then published at path with os.Link. If the link fails
// because path appeared in the meantime, the temporary file is discarded and
// the existing file opened instead. The temporary file is always removed. See
// the package documentation for why this is race-free.
//
// If path exists it is opened (O_RDWR) and mapped in full. A symlink is refused
// with ErrSymlink, a non-regular file with ErrNotRegular, and a file smaller than
// minSize (or empty) with an error wrapping ErrTooSmall, before mapping. Then
// validate (which may be nil) is called on the mapped bytes and its error, if
// any, returned unchanged. validate is never called on a file this call created.
//
// created reports whether this call created the file at path.
func Open(path string, size int64, minSize int64, mode os.FileMode, init func(b []byte) error, validate func(b []byte) error) (m *Mapping, created bool, err error) {
	if size <= 0 || size < minSize || int64(int(size)) != size {
		return nil, false, fmt.Errorf("shm: open %s: invalid size %d (minimum %d)", path, size, minSize)
	}
	perm := mode.Perm()
	if perm == 0 {
		perm = 0o600
	}
	var busy busyWaiter
	for attempt := 0; attempt < maxAttempts; attempt++ {
		f, fi, err := openFile(path, false)
		if err == nil {
			err = claimInUse(f, fi, path)
			if err != nil {
				f.Close()
			}
		}
		if err == nil {
			m, err := mapExisting(f, fi, path, minSize, false, validate)
			if err != nil {
				return nil, false, err
			}
			return m, false, nil
		}
		if errors.Is(err, errBusy) {
			attempt-- // a replacement in progress: wait for it, within busyWait
			if err := busy.wait(path); err != nil {
				return nil, false, err
			}
			continue
		}
		if errors.Is(err, errRetry) {
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, false, err
		}
		m, created, err := create(path, size, minSize, perm, init, validate)
		if errors.Is(err, errRetry) {
			continue // lost the race, or the winner's file vanished: start over
		}
		if err != nil {
			return nil, false, err
		}
		return m, created, nil
	}
	return nil, false, fmt.Errorf("shm: open %s: gave up after %d attempts: %w", path, maxAttempts, errRetry)
}

// OpenReadOnly opens an existing file and maps it read-only, with the same
// checks as Open (ErrSymlink, ErrNotRegular, ErrTooSmall, then validate). It
// never creates the file. Writing through the returned memory faults, so
// callers must only read it (e.g. with atomic loads).
func OpenReadOnly(path string, minSize int64, validate func([]byte) error) (*Mapping, error) {
	var busy busyWaiter
	for attempt := 0; attempt < maxAttempts; attempt++ {
		f, fi, err := openFile(path, true)
		if errors.Is(err, errBusy) {
			attempt--
			if err := busy.wait(path); err != nil {
				return nil, err
			}
			continue
		}
		if errors.Is(err, errRetry) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return mapExisting(f, fi, path, minSize, true, validate)
	}
	return nil, fmt.Errorf("shm: open %s: gave up after %d attempts: %w", path, maxAttempts, errRetry)
}

// openFile opens an existing regular file at path, refusing symlinks. An
// absent file yields an error wrapping fs.ErrNotExist.
func openFile(path string, readOnly bool) (*os.File, os.FileInfo, error) {
	lfi, err := os.Lstat(path)
	if err != nil {
		return nil, nil, fmt.Errorf("shm: %w", err)
	}
	if err := checkType(path, lfi); err != nil {
		return nil, nil, err
	}
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag|openFlags, 0)
	if errors.Is(err, syscall.EAGAIN) {
		// A replacer holds a write lease on it for a moment (Replace): an
		// open with O_NONBLOCK is refused meanwhile rather than made to wait.
		return nil, nil, errBusy
	}
	if err != nil {
		// O_NOFOLLOW fails with ELOOP (Linux, macOS) or EMLINK (FreeBSD) when a
		// symlink was put at path after the Lstat: report it as such.
		if lfi, lerr := os.Lstat(path); lerr == nil && lfi.Mode()&fs.ModeSymlink != 0 {
			return nil, nil, fmt.Errorf("%w: %s", ErrSymlink, path)
		}
		return nil, nil, fmt.Errorf("shm: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("shm: stat %s: %w", path, err)
	}
	if err := checkType(path, fi); err != nil {
		f.Close()
		return nil, nil, err
	}
	if !os.SameFile(lfi, fi) {
		// Replaced between Lstat and open (on Windows possibly by a symlink,
		// which the open would have followed): look again.
		f.Close()
		return nil, nil, errRetry
	}
	return f, fi, nil
}

func checkType(path string, fi os.FileInfo) error {
	if fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("%w: %s", ErrSymlink, path)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s (mode %v)", ErrNotRegular, path, fi.Mode().Type())
	}
	return nil
}

// mapExisting checks the size of the open file f, maps it in full and runs
// validate. f is closed on error.
func mapExisting(f *os.File, fi os.FileInfo, path string, minSize int64, readOnly bool, validate func([]byte) error) (*Mapping, error) {
	size := fi.Size()
	if minSize < 1 {
		minSize = 1 // an empty file cannot be mapped
	}
	if size < minSize {
		f.Close()
		return nil, fmt.Errorf("%w: %s is %d bytes, need at least %d", ErrTooSmall, path, size, minSize)
	}
	if int64(int(size)) != size {
		f.Close()
		return nil, fmt.Errorf("shm: %s: size %d too large to map", path, size)
	}
	prot := mmap.RDWR
	if readOnly {
		prot = mmap.RDONLY
	}
	mm, err := mmap.MapRegion(f, int(size), prot, 0, 0)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("shm: map %s: %w", path, err)
	}
	m := &Mapping{f: f, mm: mm, readOnly: readOnly}
	if validate != nil {
		if err := validate(mm); err != nil {
			m.Close()
			return nil, err
		}
	}
	return m, nil
}

// create builds and initialises a temporary file next to path and publishes
// it with os.Link. It returns errRetry if path already exists (lost race).
func create(path string, size, minSize int64, perm os.FileMode, init, validate func([]byte) error) (m *Mapping, created bool, err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return nil, false, fmt.Errorf("shm: create temporary file for %s: %w", path, err)
	}
	tmpName := tmp.Name()
	var mm mmap.MMap
	published := false
	defer func() {
		if !published {
			if mm != nil {
				mm.Unmap()
			}
			tmp.Close()
		}
		os.Remove(tmpName) // the published inode keeps its other name, path
	}()

	if err := checkFS(tmp, path); err != nil {
		return nil, false, err
	}
	if busy, err := takeInUse(tmp); err != nil || busy {
		return nil, false, fmt.Errorf("shm: lock %s: %w", tmpName, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		return nil, false, fmt.Errorf("shm: chmod %s: %w", tmpName, err)
	}
	if err := tmp.Truncate(size); err != nil {
		return nil, false, fmt.Errorf("shm: truncate %s: %w", tmpName, err)
	}
	if err := preallocate(tmp, size); err != nil {
		return nil, false, fmt.Errorf("shm: allocate %s: %w", tmpName, err)
	}
	mm, err = mmap.MapRegion(tmp, int(size), mmap.RDWR, 0, 0)
	if err != nil {
		mm = nil
		return nil, false, fmt.Errorf("shm: map %s: %w", tmpName, err)
	}
	if init != nil {
		if err := init(mm); err != nil {
			return nil, false, err
		}
	}
	if err := os.Link(tmpName, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, false, errRetry
		}
		return nil, false, fmt.Errorf("shm: publish %s: %w", path, err)
	}

	if canRemoveOpenFile {
		published = true
		return &Mapping{f: renameFile(tmp, path), mm: mm}, true, nil
	}

	// Windows: the temporary name cannot be removed while the file is open, so
	// close it, drop the name and reopen the published file by path. If path
	// no longer names our inode by then, treat it like any existing file.
	ours, statErr := tmp.Stat()
	published = true
	mm.Unmap()
	tmp.Close()
	os.Remove(tmpName)
	f, fi, err := openFile(path, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, errRetry
	}
	if err != nil {
		return nil, false, err
	}
	if statErr == nil && os.SameFile(ours, fi) {
		m, err := mapExisting(f, fi, path, minSize, false, nil)
		return m, err == nil, err
	}
	m, err = mapExisting(f, fi, path, minSize, false, validate)
	return m, false, err
}

// Bytes returns the whole mapping (nil after Close).
func (m *Mapping) Bytes() []byte { return m.mm }

// Len returns the length of the mapping in bytes (0 after Close).
func (m *Mapping) Len() int { return len(m.mm) }

// File returns the open file, e.g. for fstat or flock by callers, or nil after
// Close. Its Name() is the path passed to Open. Callers must not close it.
func (m *Mapping) File() *os.File { return m.f }

// Close unmaps the memory and closes the file. It is idempotent: calls after
// the first return nil.
// CloseFile closes the file now and keeps the mapping, which stays valid
// (a mapping holds its own reference to the file); Close unmaps it later.
// For owners that must release the descriptor at once but cannot yet prove
// that nobody reads the mapping any more.
func (m *Mapping) CloseFile() error {
	if m.f == nil {
		return nil
	}
	err := m.f.Close()
	m.f = nil
	if err != nil {
		return fmt.Errorf("shm: %w", err)
	}
	return nil
}

func (m *Mapping) Close() error {
	var err error
	if m.mm != nil {
		if uerr := m.mm.Unmap(); uerr != nil {
			err = fmt.Errorf("shm: unmap: %w", uerr)
		}
		m.mm = nil
	}
	if m.f != nil {
		if cerr := m.f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("shm: %w", cerr)
		}
		m.f = nil
	}
	return err
}

// check verifies that a word of the given size at off lies inside the mapping
// and is aligned to its size.
func (m *Mapping) check(off, size int) error {
	if m.mm == nil {
		return ErrClosed
	}
	if off < 0 || off > len(m.mm)-size || off%size != 0 {
		return fmt.Errorf("%w: %d-byte word at offset %d (mapping length %d)", ErrBounds, size, off, len(m.mm))
	}
	return nil
}

// Uint32 returns a pointer to the 32-bit word at off, for use with sync/atomic.
// off must be in range and a multiple of 4, otherwise the error wraps ErrBounds.
func (m *Mapping) Uint32(off int) (*uint32, error) {
	if err := m.check(off, 4); err != nil {
		return nil, err
	}
	return (*uint32)(unsafe.Pointer(&m.mm[off])), nil
}

// Uint64 returns a pointer to the 64-bit word at off, for use with sync/atomic.
// off must be in range and a multiple of 8, otherwise the error wraps ErrBounds.
// Mappings are page-aligned, so the word is 8-byte aligned in memory (as 64-bit
// atomics require on 32-bit platforms).
func (m *Mapping) Uint64(off int) (*uint64, error) {
	if err := m.check(off, 8); err != nil {
		return nil, err
	}
	return (*uint64)(unsafe.Pointer(&m.mm[off])), nil
}
