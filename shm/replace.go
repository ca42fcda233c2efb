package shm

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"
)

// errBusy: a replacer holds the in-use write lock of the file at path (Open
// waits and starts over).
var errBusy = errors.New("shm: file being replaced")

// busyWait bounds how long Open waits for replacements in progress.
const busyWait = 5 * time.Second

// busyWaiter paces Open's retries while another process replaces the file:
// short, growing, jittered sleeps (eight processes starting together do
// not retry in step), up to busyWait in all.
type busyWaiter struct {
	start time.Time
	sleep time.Duration
}

func (b *busyWaiter) wait(path string) error {
	if b.start.IsZero() {
		b.start, b.sleep = time.Now(), 200*time.Microsecond
	}
	if time.Since(b.start) > busyWait {
		return fmt.Errorf("%w: %s: another process held it for over %v", ErrBusy, path, busyWait)
	}
	time.Sleep(b.sleep/2 + rand.N(b.sleep))
	b.sleep = min(2*b.sleep, 20*time.Millisecond)
	return nil
}

// claimInUse takes the in-use read lock on the open file f (fi its stat)
// and checks that path still names it: a file replaced between the open
// and the lock is left (errRetry), one whose replacer holds the write lock
// is waited for (errBusy). A file system whose locks do not reach every
// process is refused.
func claimInUse(f *os.File, fi os.FileInfo, path string) error {
	if err := checkFS(f, path); err != nil {
		return err
	}
	busy, err := takeInUse(f)
	if err != nil {
		return fmt.Errorf("shm: %s: %w", path, err)
	}
	if busy {
		return errBusy
	}
	lfi, err := os.Lstat(path)
	if err != nil || !os.SameFile(lfi, fi) {
		return errRetry
	}
	return nil
}

// Users says who uses a file that Replace is asked to replace, from its
// own bytes: n users (0: none), described for an error message. Replace
// asks it only when the kernel cannot say whether another process has the
// file open (no lease: not the file's owner and no CAP_LEASE), and of a
// file whose in-use lock no process holds.
type Users func(b []byte) (n int, who string)

// Replace puts a new file at path in place of the existing one, atomically
// (rename), if no process uses the existing one; the new file is built as
// Open builds one (size, mode, init) under a temporary name first. Before
// the rename, retire is called on the old file's bytes (mapped read-write)
// to mark it as replaced, so that a process that opened it in the meantime
// refuses it rather than use it alone.
//
// The old file is unused when no other open file description holds its
// in-use lock (its users of this format and later ones), and, for the
// users of earlier formats that never took that lock, when the kernel
// grants a write lease on it (no other open file or mapping anywhere),
// or, where it will not grant leases, when users says so.
//
// It returns nil when the file was replaced (or another process replaced
// it first: the caller opens path again), ErrInUse naming the users, or
// errBusy/errRetry (transient: open again).
func Replace(path string, size int64, mode os.FileMode, init func([]byte) error, users Users, retire func(b []byte)) error {
	f, fi, err := openFile(path, false)
	if err != nil {
		return err
	}
	defer f.Close()
	won, err := takeReplace(f)
	if err != nil {
		return fmt.Errorf("shm: %s: %w", path, err)
	}
	if !won {
		return errBusy // a user of a newer format, or another replacer
	}
	if lfi, err := os.Lstat(path); err != nil || !os.SameFile(lfi, fi) {
		return errRetry // replaced already
	}
	old, err := mapExisting(f, fi, path, 1, false, nil)
	if err != nil {
		return err
	}
	defer old.mm.Unmap()
	elsewhere, known := openedElsewhere(f)
	if !known {
		if n, who := users(old.mm); n > 0 {
			return fmt.Errorf("%w: %s: %s", ErrInUse, path, who)
		}
	} else if elsewhere {
		n, who := users(old.mm)
		if n == 0 {
			who = "a process that has it open"
		}
		return fmt.Errorf("%w: %s: %s", ErrInUse, path, who)
	}
	perm := mode.Perm()
	if perm == 0 {
		perm = fi.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".new*")
	if err != nil {
		return fmt.Errorf("shm: create replacement for %s: %w", path, err)
	}
	tmpName := tmp.Name()
	defer os.Remove(tmpName) // gone after the rename; left over on failure
	defer tmp.Close()
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("shm: chmod %s: %w", tmpName, err)
	}
	if err := tmp.Truncate(size); err != nil {
		return fmt.Errorf("shm: truncate %s: %w", tmpName, err)
	}
	if err := preallocate(tmp, size); err != nil {
		return fmt.Errorf("shm: allocate %s: %w", tmpName, err)
	}
	tfi, err := tmp.Stat()
	if err != nil {
		return fmt.Errorf("shm: stat %s: %w", tmpName, err)
	}
	nm, err := mapExisting(tmp, tfi, tmpName, size, false, nil)
	if err != nil {
		return err
	}
	if init != nil {
		if err := init(nm.mm); err != nil {
			nm.mm.Unmap()
			return err
		}
	}
	nm.mm.Unmap()
	retire(old.mm)
	if err := os.Rename(tmpName, path); err != nil {
		return fmt.Errorf("shm: replace %s: %w", path, err)
	}
	return nil
}

// IsTransient reports whether err from Replace means "open again".
func IsTransient(err error) bool { return errors.Is(err, errBusy) || errors.Is(err, errRetry) }

// Reopen opens the file at path again, read-write: a new open file
// description (whose locks are its own), which must be the file like
// describes (ErrReplaced otherwise).
func Reopen(path string, like os.FileInfo) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|openFlags, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: %w", err)
	}
	fi, err := f.Stat()
	if err != nil || like == nil || !os.SameFile(fi, like) {
		f.Close()
		return nil, fmt.Errorf("%w: %s", ErrReplaced, path)
	}
	return f, nil
}

// Probe returns a new descriptor of the mapping's open file for lock
// queries (F_OFD_GETLK), -1 where there is none; CloseProbe closes it.
func (m *Mapping) Probe() int {
	if m.f == nil {
		return -1
	}
	return dupFD(m.f)
}

// CloseProbe closes a descriptor returned by Probe.
func CloseProbe(fd int) {
	if fd >= 0 {
		closeFD(fd)
	}
}
