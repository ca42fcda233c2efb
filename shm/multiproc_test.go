package shm

import (
	"bufio"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// nonceOff is where init stores the creator's random nonce.
const nonceOff = 16

// TestHelperProcess is not a real test: it is the child side of
// TestMultiProcessCreateRace, selected by SHM_TEST_ROLE=create. It prints
// READY, then for every line "<round>" read from stdin it opens
// SHM_TEST_PATH.<round> and prints one RESULT line.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("SHM_TEST_ROLE") != "create" {
		t.Skip("helper process only")
	}
	time.AfterFunc(20*time.Second, func() {
		fmt.Println("RESULT watchdog-expired")
		os.Exit(3)
	})
	base := os.Getenv("SHM_TEST_PATH")
	fmt.Println("READY")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		path := base + "." + sc.Text()
		nonce := make([]byte, 16)
		if _, err := rand.Read(nonce); err != nil {
			fmt.Printf("RESULT error=%v\n", err)
			continue
		}
		validated := false
		m, created, err := Open(path, testSize, testMinSize, 0o600,
			func(b []byte) error {
				copy(b, magic)
				copy(b[nonceOff:], nonce)
				return nil
			},
			func(b []byte) error {
				validated = true
				return validateMagic(b)
			})
		if err != nil {
			fmt.Printf("RESULT error=%v\n", err)
			continue
		}
		fmt.Printf("RESULT created=%v first=%x validated=%v\n", created, m.Bytes()[nonceOff:nonceOff+16], validated)
		if err := m.Close(); err != nil {
			fmt.Printf("RESULT close-error=%v\n", err)
		}
	}
	os.Exit(0)
}

type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // stdout lines; closed at EOF
	exited chan error
}

// next returns the next stdout line starting with prefix, skipping others.
func (c *child) next(t *testing.T, prefix string, stop time.Time) string {
	t.Helper()
	timer := time.NewTimer(time.Until(stop))
	defer timer.Stop()
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("child %d: stdout closed while waiting for %q", c.cmd.Process.Pid, prefix)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-timer.C:
			t.Fatalf("child %d: timed out waiting for %q", c.cmd.Process.Pid, prefix)
		}
	}
}

func TestMultiProcessCreateRace(t *testing.T) {
	const (
		nChildren = 8
		rounds    = 10
	)
	exe, err := os.Executable()
	if err != nil {
		t.Skipf("os.Executable: %v", err)
	}
	dir := t.TempDir()
	base := filepath.Join(dir, "table")
	stop := time.Now().Add(60 * time.Second)

	children := make([]*child, nChildren)
	for i := range children {
		cmd := exec.Command(exe, "-test.run=^TestHelperProcess$")
		cmd.Env = append(os.Environ(), "SHM_TEST_ROLE=create", "SHM_TEST_PATH="+base,
			// Under -race, skip the race runtime's default 1 s sleep at exit.
			"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 64), exited: make(chan error, 1)}
		children[i] = c
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				c.lines <- sc.Text()
			}
			close(c.lines)
			c.exited <- cmd.Wait()
		}()
		t.Cleanup(func() {
			stdin.Close()
			cmd.Process.Kill() // no-op error if it already exited
		})
	}

	// All children are started and blocked reading stdin before any round
	// begins, so each round's Opens run as close together as possible.
	for _, c := range children {
		c.next(t, "READY", stop)
	}

	var wantFiles []string
	for r := 0; r < rounds; r++ {
		for _, c := range children {
			if _, err := fmt.Fprintf(c.stdin, "%d\n", r); err != nil {
				t.Fatal(err)
			}
		}
		wantFiles = append(wantFiles, fmt.Sprintf("table.%d", r))

		creators := 0
		nonces := map[string]int{}
		for i, c := range children {
			line := c.next(t, "RESULT ", stop)
			var created, validated bool
			var nonce string
			if _, err := fmt.Sscanf(line, "RESULT created=%t first=%s validated=%t", &created, &nonce, &validated); err != nil {
				t.Fatalf("round %d child %d: unexpected %q", r, i, line)
			}
			if created {
				creators++
			}
			if validated == created {
				t.Errorf("round %d child %d: created=%v but validated=%v", r, i, created, validated)
			}
			nonces[nonce]++
		}
		if creators != 1 {
			t.Errorf("round %d: %d processes report created=true, want exactly 1", r, creators)
		}
		if len(nonces) != 1 {
			t.Errorf("round %d: processes saw different contents: %v", r, nonces)
		}
		for n := range nonces {
			if n == strings.Repeat("0", 32) {
				t.Errorf("round %d: nonce is zero (init not visible)", r)
			}
		}
	}

	for _, c := range children {
		c.stdin.Close()
	}
	for i, c := range children {
		for range c.lines { // drain until EOF
		}
		select {
		case err := <-c.exited:
			if err != nil {
				t.Errorf("child %d: %v", i, err)
			}
		case <-time.After(time.Until(stop)):
			t.Fatalf("child %d did not exit", i)
		}
	}

	// Every temporary file was removed; only the published files remain.
	sort.Strings(wantFiles)
	noTempFiles(t, dir, wantFiles...)
}

// TestConcurrentCreateGoroutines races Opens inside one process, which also
// exercises the lost-link path under the race detector.
func TestConcurrentCreateGoroutines(t *testing.T) {
	const n = 16
	dir := t.TempDir()
	path := filepath.Join(dir, "table")
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		creators int
		start    = make(chan struct{})
		maps     []*Mapping
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			m, created, err := Open(path, testSize, testMinSize, 0, func(b []byte) error {
				copy(b, magic)
				b[nonceOff] = byte(i + 1)
				return nil
			}, validateMagic)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if created {
				creators++
			}
			maps = append(maps, m)
		}(i)
	}
	close(start)
	wg.Wait()
	if creators != 1 {
		t.Errorf("%d creators, want 1", creators)
	}
	for _, m := range maps {
		if m.Bytes()[nonceOff] != maps[0].Bytes()[nonceOff] || m.Bytes()[nonceOff] == 0 {
			t.Errorf("mappings disagree on the creator: %d vs %d", m.Bytes()[nonceOff], maps[0].Bytes()[nonceOff])
		}
	}
	for _, m := range maps {
		m.Close()
	}
	noTempFiles(t, dir, "table")
}
