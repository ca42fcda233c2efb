package shm

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"
)

const (
	testSize    = 4096
	testMinSize = 64
)

var magic = []byte("SHMTEST1")

func initMagic(b []byte) error {
	copy(b, magic)
	b[len(b)-1] = 0x5a
	return nil
}

func validateMagic(b []byte) error {
	if len(b) < testMinSize || !bytes.Equal(b[:len(magic)], magic) {
		return errBadMagic
	}
	return nil
}

var errBadMagic = errors.New("test: bad magic")

// noTempFiles fails if dir holds anything but the listed names.
func noTempFiles(t *testing.T, dir string, want ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("directory holds %q, want %q", got, want)
	}
}

func TestCreateThenReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "table")

	initCalls, validateCalls := 0, 0
	m1, created, err := Open(path, testSize, testMinSize, 0,
		func(b []byte) error { initCalls++; return initMagic(b) },
		func(b []byte) error { validateCalls++; return validateMagic(b) })
	if err != nil {
		t.Fatal(err)
	}
	defer m1.Close()
	if !created || initCalls != 1 || validateCalls != 0 {
		t.Fatalf("first Open: created=%v init=%d validate=%d, want true 1 0", created, initCalls, validateCalls)
	}
	if m1.Len() != testSize || len(m1.Bytes()) != testSize {
		t.Fatalf("Len=%d len(Bytes)=%d, want %d", m1.Len(), len(m1.Bytes()), testSize)
	}
	if m1.File() == nil || m1.File().Name() != path {
		t.Fatalf("File() = %v, want a file named %s", m1.File(), path)
	}
	if fi, err := m1.File().Stat(); err != nil || fi.Size() != testSize {
		t.Fatalf("File().Stat() = %v, %v", fi, err)
	}
	noTempFiles(t, dir, "table")

	var validatedLen int
	m2, created, err := Open(path, testSize, testMinSize, 0,
		func(b []byte) error { initCalls++; return nil },
		func(b []byte) error { validateCalls++; validatedLen = len(b); return validateMagic(b) })
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if created || initCalls != 1 || validateCalls != 1 || validatedLen != testSize {
		t.Fatalf("second Open: created=%v init=%d validate=%d len=%d", created, initCalls, validateCalls, validatedLen)
	}
	if m2.File() == nil || m2.File().Name() != path {
		t.Fatalf("File() = %v, want a file named %s", m2.File(), path)
	}
	if !bytes.Equal(m1.Bytes(), m2.Bytes()) {
		t.Fatal("reopened mapping differs")
	}

	// Both mappings share the file: an atomic store through one is visible
	// through the other.
	p1, err := m1.Uint64(8)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := m2.Uint64(8)
	if err != nil {
		t.Fatal(err)
	}
	atomic.StoreUint64(p1, 0x0123456789abcdef)
	if got := atomic.LoadUint64(p2); got != 0x0123456789abcdef {
		t.Fatalf("second mapping sees %#x", got)
	}
	noTempFiles(t, dir, "table")
}

func TestNilInitAndValidate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "table")
	m, created, err := Open(path, testSize, 0, 0, nil, nil)
	if err != nil || !created {
		t.Fatalf("Open: created=%v err=%v", created, err)
	}
	if !bytes.Equal(m.Bytes(), make([]byte, testSize)) {
		t.Fatal("new file without init is not zero-filled")
	}
	m.Close()
	m, created, err = Open(path, testSize, 0, 0, nil, nil)
	if err != nil || created {
		t.Fatalf("reopen: created=%v err=%v", created, err)
	}
	m.Close()
}

func TestValidateErrorReturned(t *testing.T) {
	path := filepath.Join(t.TempDir(), "table")
	if err := os.WriteFile(path, make([]byte, testSize), 0o600); err != nil {
		t.Fatal(err)
	}
	m, created, err := Open(path, testSize, testMinSize, 0, initMagic, validateMagic)
	if !errors.Is(err, errBadMagic) || m != nil || created {
		t.Fatalf("Open = %v, %v, %v; want errBadMagic", m, created, err)
	}
	if _, err := OpenReadOnly(path, testMinSize, validateMagic); !errors.Is(err, errBadMagic) {
		t.Fatalf("OpenReadOnly = %v; want errBadMagic", err)
	}
}

func TestInitErrorLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "table")
	errInit := errors.New("init failed")
	_, created, err := Open(path, testSize, testMinSize, 0, func([]byte) error { return errInit }, validateMagic)
	if !errors.Is(err, errInit) || created {
		t.Fatalf("Open: created=%v err=%v, want errInit", created, err)
	}
	noTempFiles(t, dir) // neither path nor a temporary file
}

func TestTooSmallRefusedBeforeMapping(t *testing.T) {
	dir := t.TempDir()
	for _, size := range []int{0, 10, testMinSize - 1} {
		path := filepath.Join(dir, "small")
		if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		validate := func([]byte) error {
			t.Errorf("size %d: validate called on a too-small file", size)
			return nil
		}
		_, created, err := Open(path, testSize, testMinSize, 0, initMagic, validate)
		if !errors.Is(err, ErrTooSmall) || created {
			t.Errorf("size %d: Open: created=%v err=%v, want ErrTooSmall", size, created, err)
		}
		if _, err := OpenReadOnly(path, testMinSize, validate); !errors.Is(err, ErrTooSmall) {
			t.Errorf("size %d: OpenReadOnly: %v, want ErrTooSmall", size, err)
		}
		if fi, err := os.Stat(path); err != nil || fi.Size() != int64(size) {
			t.Errorf("size %d: file was modified: %v %v", size, fi, err)
		}
	}
	// An empty file is refused even with minSize 0: it cannot be mapped.
	path := filepath.Join(dir, "empty")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(path, testSize, 0, 0, nil, nil); !errors.Is(err, ErrTooSmall) {
		t.Errorf("empty file with minSize 0: %v, want ErrTooSmall", err)
	}
}

func TestDirectoryRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dir")
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(path, testSize, testMinSize, 0, initMagic, validateMagic); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("Open(dir) = %v, want ErrNotRegular", err)
	}
	if _, err := OpenReadOnly(path, testMinSize, validateMagic); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("OpenReadOnly(dir) = %v, want ErrNotRegular", err)
	}
}

func TestMissingDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope", "table")
	if _, _, err := Open(path, testSize, testMinSize, 0, initMagic, validateMagic); err == nil {
		t.Fatal("Open in a missing directory succeeded")
	}
	if _, err := OpenReadOnly(path, testMinSize, nil); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("OpenReadOnly(missing) = %v, want ErrNotExist", err)
	}
}

func TestInvalidSize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "table")
	for _, c := range []struct{ size, min int64 }{{0, 0}, {-1, 0}, {64, 128}} {
		if _, _, err := Open(path, c.size, c.min, 0, nil, nil); err == nil {
			t.Errorf("Open(size=%d, minSize=%d) succeeded", c.size, c.min)
		}
	}
	noTempFiles(t, filepath.Dir(path))
}

func TestCloseIdempotent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "table")
	m, _, err := Open(path, testSize, testMinSize, 0, initMagic, validateMagic)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if m.File() != nil || m.Bytes() != nil || m.Len() != 0 {
		t.Fatal("closed mapping still exposes its file or memory")
	}
	if _, err := m.Uint32(0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Uint32 after Close = %v, want ErrClosed", err)
	}
}

func TestAccessors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "table")
	m, _, err := Open(path, testSize, testMinSize, 0, initMagic, validateMagic)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	for _, off := range []int{0, 4, 8, testSize - 4} {
		p, err := m.Uint32(off)
		if err != nil {
			t.Fatalf("Uint32(%d): %v", off, err)
		}
		if unsafe.Pointer(p) != unsafe.Pointer(&m.Bytes()[off]) {
			t.Fatalf("Uint32(%d) does not point at Bytes()[%d]", off, off)
		}
		atomic.StoreUint32(p, uint32(off)+1)
	}
	for _, off := range []int{0, 8, testSize - 8} {
		p, err := m.Uint64(off)
		if err != nil {
			t.Fatalf("Uint64(%d): %v", off, err)
		}
		if unsafe.Pointer(p) != unsafe.Pointer(&m.Bytes()[off]) {
			t.Fatalf("Uint64(%d) does not point at Bytes()[%d]", off, off)
		}
		if uintptr(unsafe.Pointer(p))%8 != 0 {
			t.Fatalf("Uint64(%d) is not 8-byte aligned in memory", off)
		}
		atomic.AddUint64(p, 1)
	}
	for _, off := range []int{-4, -1, 1, 2, 3, 6, testSize, testSize - 3, testSize + 4} {
		if _, err := m.Uint32(off); !errors.Is(err, ErrBounds) {
			t.Errorf("Uint32(%d) = %v, want ErrBounds", off, err)
		} else if !strings.Contains(err.Error(), "offset "+strconv.Itoa(off)) {
			t.Errorf("Uint32(%d) error %q does not name the offset", off, err)
		}
	}
	for _, off := range []int{-8, 4, 12, testSize - 4, testSize, testSize + 8} {
		if _, err := m.Uint64(off); !errors.Is(err, ErrBounds) {
			t.Errorf("Uint64(%d) = %v, want ErrBounds", off, err)
		}
	}
}

func TestOpenReadOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "table")
	m, _, err := Open(path, testSize, testMinSize, 0, initMagic, validateMagic)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	w, _ := m.Uint32(16)
	atomic.StoreUint32(w, 42)

	called := false
	ro, err := OpenReadOnly(path, testMinSize, func(b []byte) error { called = true; return validateMagic(b) })
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if !called || ro.Len() != testSize {
		t.Fatalf("validate called=%v Len=%d", called, ro.Len())
	}
	r, err := ro.Uint32(16)
	if err != nil {
		t.Fatal(err)
	}
	if got := atomic.LoadUint32(r); got != 42 {
		t.Fatalf("read-only mapping sees %d, want 42", got)
	}
	atomic.StoreUint32(w, 43) // later writes through the writable mapping are visible
	if got := atomic.LoadUint32(r); got != 43 {
		t.Fatalf("read-only mapping sees %d, want 43", got)
	}
}
