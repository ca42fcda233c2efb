package shm

import (
	"crypto/rand"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/internal/proctest"
)

// nonceOff is where init stores the creator's random nonce.
const nonceOff = 16

// TestHelperProcess is not a real test: it runs the children of the
// multi-process tests (internal/proctest).
func TestHelperProcess(t *testing.T) {
	proctest.Main(t, proctest.Roles{"create": createChild})
}

// createChild is the child side of TestMultiProcessCreateRace: it prints
// READY, then for every line "<round>" read from stdin it opens
// BASE.<round> and prints one RESULT line.
func createChild(args []string) int {
	base := args[0]
	proctest.Say("READY")
	for f := range proctest.Commands() {
		path := base + "." + f[0]
		nonce := make([]byte, 16)
		if _, err := rand.Read(nonce); err != nil {
			proctest.Say("RESULT error=%v", err)
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
			proctest.Say("RESULT error=%v", err)
			continue
		}
		proctest.Say("RESULT created=%v first=%x validated=%v", created, m.Bytes()[nonceOff:nonceOff+16], validated)
		if err := m.Close(); err != nil {
			proctest.Say("RESULT close-error=%v", err)
		}
	}
	return 0
}

func TestMultiProcessCreateRace(t *testing.T) {
	const (
		nChildren = 8
		rounds    = 10
	)
	dir := t.TempDir()
	base := filepath.Join(dir, "table")

	children := make([]*proctest.Child, nChildren)
	for i := range children {
		children[i] = proctest.SpawnWith(t, proctest.Options{Within: 30 * time.Second}, "create", base)
	}

	// All children are started and blocked reading stdin before any round
	// begins, so each round's Opens run as close together as possible.
	for _, c := range children {
		c.Expect("READY")
	}

	var wantFiles []string
	for r := 0; r < rounds; r++ {
		for _, c := range children {
			c.Send("%d", r)
		}
		wantFiles = append(wantFiles, fmt.Sprintf("table.%d", r))

		creators := 0
		nonces := map[string]int{}
		for i, c := range children {
			line := c.Expect("RESULT ")
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

	for i, c := range children {
		if err := c.Wait(); err != nil { // closes its stdin: the child exits
			t.Errorf("child %d: %v", i, err)
		}
		if l := c.Lines(""); len(l) != 0 {
			t.Errorf("child %d: unexpected lines %q", i, l)
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
