//go:build unix

package futex

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
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

// TestHelperProcess is not a real test: it is the child side of
// TestCrossProcessWake, selected by FUTEX_TEST_ROLE.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("FUTEX_TEST_ROLE") != "waiter" {
		t.Skip("helper process only")
	}
	// Watchdog: never outlive a broken parent or a lost wake-up.
	time.AfterFunc(20*time.Second, func() {
		fmt.Println("RESULT watchdog-expired")
		os.Exit(3)
	})
	b, err := mapShared(os.Getenv("FUTEX_TEST_PATH"))
	if err != nil {
		fmt.Printf("RESULT error=%v\n", err)
		os.Exit(2)
	}
	ready, w := word(b, offReady), word(b, offWord)
	atomic.StoreUint32(ready, 1)
	if _, err := Wake(ready, 0); err != nil {
		fmt.Printf("RESULT error=%v\n", err)
		os.Exit(2)
	}
	for atomic.LoadUint32(w) == 0 {
		// No timeout: only the parent's Wake (or, when polling, the changed
		// value) can release this wait.
		if err := Wait(w, 0, 0); err != nil {
			fmt.Printf("RESULT error=%v\n", err)
			os.Exit(2)
		}
	}
	fmt.Printf("RESULT woke value=%#x\n", atomic.LoadUint32(w))
	os.Exit(0)
}

func TestCrossProcessWake(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Skipf("os.Executable: %v", err)
	}
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

	var stdout bytes.Buffer
	cmd := exec.Command(exe, "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), "FUTEX_TEST_ROLE=waiter", "FUTEX_TEST_PATH="+path,
		// Under -race, skip the race runtime's default 1 s sleep at exit.
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Stdout = &stdout
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	}()
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
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("child failed: %v\nstdout:\n%s", err, stdout.String())
		}
	case <-time.After(time.Until(stop)):
		t.Fatal("child did not exit after being woken")
	}
	want := fmt.Sprintf("RESULT woke value=%#x", wakeValue)
	var found bool
	sc := bufio.NewScanner(strings.NewReader(stdout.String()))
	for sc.Scan() {
		if sc.Text() == want {
			found = true
		}
	}
	if !found {
		t.Fatalf("child output %q does not contain %q", stdout.String(), want)
	}
}
