//go:build unix

package stress

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// mono returns CLOCK_MONOTONIC in nanoseconds: one clock for every process
// of the machine (Go's monotonic readings are per process).
func mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// mapping is a shared read-write mapping of a whole file.
type mapping struct {
	f   *os.File
	buf []byte
}

// createRegionFile creates path (which must not exist) with size bytes and maps it.
func createRegionFile(path string, size int) (*mapping, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return mapFile(f, size)
}

// openRegionFile maps an existing region file.
func openRegionFile(path string) (*mapping, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return mapFile(f, int(fi.Size()))
}

func mapFile(f *os.File, size int) (*mapping, error) {
	if size <= 0 {
		f.Close()
		return nil, fmt.Errorf("stress: %s is empty", f.Name())
	}
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("stress: mmap %s: %w", f.Name(), err)
	}
	return &mapping{f: f, buf: b}, nil
}

func (m *mapping) close() error {
	err := unix.Munmap(m.buf)
	if cerr := m.f.Close(); err == nil {
		err = cerr
	}
	return err
}
