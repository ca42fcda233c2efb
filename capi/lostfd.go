//go:build linux && cgo

package main

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// lostWatch is a lock's lost descriptor: an eventfd that a goroutine makes
// readable when the lock's Lost channel closes. stop (at release) ends the
// goroutine first and closes the descriptor after it, so that the
// goroutine never writes to a descriptor number the process has reused.
type lostWatch struct {
	fd   int
	quit chan struct{}
	done chan struct{}
}

// lostFD returns the lost descriptor of lock, creating it on the first call.
func lostFD(lock uint64) (int, *apiError) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	le := registry.locks[lock]
	if le == nil {
		return -1, badHandle(lock, kindLock)
	}
	if le.watch != nil {
		return le.watch.fd, nil
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, errf(codeInternal, "shmlocks: lost_fd: eventfd: %v", err)
	}
	w := &lostWatch{fd: fd, quit: make(chan struct{}), done: make(chan struct{})}
	lost := le.l.Lost()
	go func() {
		defer close(w.done)
		select {
		case <-lost:
			var one [8]byte
			binary.NativeEndian.PutUint64(one[:], 1)
			unix.Write(fd, one[:])
		case <-w.quit:
		}
	}()
	le.watch = w
	return fd, nil
}

func (w *lostWatch) stop() {
	close(w.quit)
	<-w.done
	unix.Close(w.fd)
}
