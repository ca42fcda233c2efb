//go:build unix

package futex

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shmlocks/shmlocks/internal/proctest"
)

// Layout of the shared test file.
const (
	offReady = 0 // child sets to 1 once it has mapped the file
	offWord  = 4 // child waits while this is 0; parent stores wakeValue
	fileSize = 4096
	// wakeValue is what the parent stores; the child echoes it back.
	wakeValue = 0xC0FFEE
)

// mapShared maps the whole file at path read-write, MAP_SHARED.
func mapShared(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the mapping stays valid after close
	return unix.Mmap(int(f.Fd()), 0, fileSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

func word(b []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }

// TestHelperProcess is not a real test: it runs the children of the
// multi-process tests (internal/proctest).
func TestHelperProcess(t *testing.T) {
	proctest.Main(t, proctest.Roles{"waiter": waiterChild})
}

// waiterChild is the child side of TestCrossProcessWake: it maps the file
// args[0], sets the ready word, waits on the word with no timeout until it
// is not 0, and prints "RESULT woke value=V".
func waiterChild(args []string) int {
	b, err := mapShared(args[0])
	if err != nil {
		proctest.Say("RESULT error=%v", err)
		return 2
	}
	ready, w := word(b, offReady), word(b, offWord)
	atomic.StoreUint32(ready, 1)
	if _, err := Wake(ready, 0); err != nil {
		proctest.Say("RESULT error=%v", err)
		return 2
	}
	for atomic.LoadUint32(w) == 0 {
		// No timeout: only the parent's Wake (or, when polling, the changed
		// value) can release this wait.
		if err := Wait(w, 0, 0); err != nil {
			proctest.Say("RESULT error=%v", err)
			return 2
		}
	}
	proctest.Say("RESULT woke value=%#x", atomic.LoadUint32(w))
	return 0
}

func TestCrossProcessWake(t *testing.T) {
	path := filepath.Join(t.TempDir(), "words")
	if err := os.WriteFile(path, make([]byte, fileSize), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := mapShared(path)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	ready, w := word(b, offReady), word(b, offWord)

	c := proctest.SpawnWith(t, proctest.Options{Within: deadline}, "waiter", path)
	stop := time.Now().Add(deadline)

	// Wait (on a futex, bounded) for the child to have mapped the file.
	for atomic.LoadUint32(ready) == 0 {
		if time.Now().After(stop) {
			t.Fatal("child never became ready")
		}
		if err := Wait(ready, 0, 100*time.Millisecond); err != nil {
			t.Fatalf("Wait: %v", err)
		}
	}

	if !Polling {
		// Prove the wake crosses the process boundary: with the word unchanged,
		// keep waking until the kernel reports that it woke a sleeper, which can
		// only be the child. (A private futex would never find it.) The child
		// re-checks, sees 0 and sleeps again.
		for {
			n, err := Wake(w, 1)
			if err != nil {
				t.Fatalf("Wake: %v", err)
			}
			if n == 1 {
				break
			}
			if time.Now().After(stop) {
				t.Fatal("Wake never found the child sleeping on the shared word")
			}
			runtime.Gosched()
		}
	}

	atomic.StoreUint32(w, wakeValue)
	if _, err := Wake(w, 0); err != nil {
		t.Fatalf("Wake: %v", err)
	}
	want := fmt.Sprintf("RESULT woke value=%#x", wakeValue)
	if l := c.Expect("RESULT"); l != want {
		t.Fatalf("child said %q, want %q", l, want)
	}
	if err := c.Wait(); err != nil {
		t.Fatalf("child failed: %v", err)
	}
}
