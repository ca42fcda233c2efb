//go:build unix

package stress

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shmlocks/shmlocks/manager"
)

// Request outcomes other than a grant, as the backends report them.
var (
	errNotAvailable = errors.New("not available")
	errTimedOut     = errors.New("timed out")
	errStolenEarly  = errors.New("stolen before the grant was seen")
	errAborted      = errors.New("aborted: the run ended")
	errLost         = errors.New("lost: stolen while held")
)

// backend is a lock implementation under test.
type backend interface {
	// acquire requests name; it returns a handle for release and the grant's
	// fencing token (0 if the backend has none).
	acquire(ctx context.Context, g, name int, mode uint32, ifAvailable, steal bool) (any, uint64, error)
	release(h any) error
	close() error
}

// shmBackend drives the manager package.
type shmBackend struct {
	m *manager.Manager
}

func newShmBackend(table string, handOver bool) (*shmBackend, error) {
	var o *manager.OpenOptions
	if handOver {
		o = &manager.OpenOptions{HandOver: true}
	}
	m, err := manager.Open(table, o)
	if err != nil {
		return nil, err
	}
	return &shmBackend{m: m}, nil
}

func (b *shmBackend) acquire(ctx context.Context, g, name int, mode uint32, ifAvailable, steal bool) (any, uint64, error) {
	o := manager.RequestOptions{IfAvailable: ifAvailable, Steal: steal}
	if mode == modeShared {
		o.Mode = manager.Shared
	}
	l, err := b.m.Acquire(ctx, nameOf(name), o)
	switch {
	case err == nil:
		return l, l.Token(), nil
	case errors.Is(err, manager.ErrNotAvailable):
		return nil, 0, errNotAvailable
	case errors.Is(err, manager.ErrAborted) && errors.Is(err, context.DeadlineExceeded):
		return nil, 0, errTimedOut
	case errors.Is(err, manager.ErrAborted):
		return nil, 0, errAborted
	case errors.Is(err, manager.ErrStolen):
		return nil, 0, errStolenEarly
	}
	return nil, 0, err
}

func (b *shmBackend) release(h any) error {
	err := h.(*manager.Lock).Release()
	if errors.Is(err, manager.ErrStolen) {
		return errLost
	}
	return err
}

func (b *shmBackend) close() error { return b.m.Close() }

// flockBackend: one lock file per name, flock(2) on a descriptor per
// goroutine and name (flock locks belong to open file descriptions, so two
// descriptors of one process conflict like two processes). If-available is
// LOCK_NB; a deadline polls LOCK_NB with backoff; steal is not supported
// (such requests are made as plain exclusive requests).
type flockBackend struct {
	dir string
	fds [][]int // [goroutine][name], -1 until opened
}

func newFlockBackend(dir string, goroutines, names int) *flockBackend {
	b := &flockBackend{dir: dir, fds: make([][]int, goroutines)}
	for g := range b.fds {
		b.fds[g] = make([]int, names)
		for n := range b.fds[g] {
			b.fds[g][n] = -1
		}
	}
	return b
}

// flockPath is the lock file of name n.
func flockPath(dir string, n int) string { return filepath.Join(dir, nameOf(n)+".lock") }

type flockHandle struct{ fd int }

func (b *flockBackend) fd(g, name int) (int, error) {
	if fd := b.fds[g][name]; fd >= 0 {
		return fd, nil
	}
	fd, err := unix.Open(flockPath(b.dir, name), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return -1, fmt.Errorf("open lock file: %w", err)
	}
	b.fds[g][name] = fd
	return fd, nil
}

func flock(fd, how int) error {
	for {
		err := unix.Flock(fd, how)
		if err != unix.EINTR {
			return err
		}
	}
}

func (b *flockBackend) acquire(ctx context.Context, g, name int, mode uint32, ifAvailable, steal bool) (any, uint64, error) {
	fd, err := b.fd(g, name)
	if err != nil {
		return nil, 0, err
	}
	how := unix.LOCK_EX
	if mode == modeShared {
		how = unix.LOCK_SH
	}
	if ifAvailable {
		switch err := flock(fd, how|unix.LOCK_NB); err {
		case nil:
			return flockHandle{fd}, 0, nil
		case unix.EWOULDBLOCK:
			return nil, 0, errNotAvailable
		default:
			return nil, 0, err
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		// Block in the kernel. The run's end does not interrupt this wait:
		// every holder releases soon after, so it ends.
		if err := flock(fd, how); err != nil {
			return nil, 0, err
		}
		return flockHandle{fd}, 0, nil
	}
	backoff := 20 * time.Microsecond
	for {
		switch err := flock(fd, how|unix.LOCK_NB); err {
		case nil:
			return flockHandle{fd}, 0, nil
		case unix.EWOULDBLOCK:
		default:
			return nil, 0, err
		}
		if err := ctx.Err(); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return nil, 0, errTimedOut
			}
			return nil, 0, errAborted
		}
		time.Sleep(backoff)
		if backoff < time.Millisecond {
			backoff *= 2
		}
	}
}

func (b *flockBackend) release(h any) error { return flock(h.(flockHandle).fd, unix.LOCK_UN) }

func (b *flockBackend) close() error {
	for _, row := range b.fds {
		for _, fd := range row {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}
	return nil
}

// flockFree reports whether every lock file in dir can be locked exclusively
// at once (nobody holds any): the final check of a flock run.
func flockFree(dir string, names int) error {
	for n := 0; n < names; n++ {
		fd, err := unix.Open(flockPath(dir, n), unix.O_RDWR|unix.O_CLOEXEC, 0)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		err = flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("%s is still locked after every worker exited: %v", flockPath(dir, n), err)
		}
	}
	return nil
}
