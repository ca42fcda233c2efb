//go:build unix

package shm

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestModeHonored(t *testing.T) {
	for _, umask := range []int{0o022, 0o077} {
		old := syscall.Umask(umask)
		path := filepath.Join(t.TempDir(), "table")
		m, created, err := Open(path, testSize, testMinSize, 0o640, initMagic, validateMagic)
		syscall.Umask(old)
		if err != nil || !created {
			t.Fatalf("umask %#o: Open: created=%v err=%v", umask, created, err)
		}
		m.Close()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != 0o640 {
			t.Errorf("umask %#o: mode %#o, want 0640", umask, got)
		}
	}
	// Default mode (0) is 0600.
	old := syscall.Umask(0)
	path := filepath.Join(t.TempDir(), "table")
	m, _, err := Open(path, testSize, testMinSize, 0, initMagic, validateMagic)
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("default mode: %v %v, want 0600", fi.Mode().Perm(), err)
	}
}

func TestSymlinkRefused(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	m, _, err := Open(target, testSize, testMinSize, 0, initMagic, validateMagic)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()

	for name, dest := range map[string]string{"link": target, "dangling": filepath.Join(dir, "missing")} {
		link := filepath.Join(dir, name)
		if err := os.Symlink(dest, link); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Open(link, testSize, testMinSize, 0, initMagic, validateMagic); !errors.Is(err, ErrSymlink) {
			t.Errorf("%s: Open = %v, want ErrSymlink", name, err)
		}
		if _, err := OpenReadOnly(link, testMinSize, validateMagic); !errors.Is(err, ErrSymlink) {
			t.Errorf("%s: OpenReadOnly = %v, want ErrSymlink", name, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "missing")); err == nil {
		t.Error("Open created the target of a dangling symlink")
	}
	noTempFiles(t, dir, "dangling", "link", "target")
}

func TestFIFORefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	done := make(chan error, 2)
	go func() {
		_, _, err := Open(path, testSize, testMinSize, 0, initMagic, validateMagic)
		done <- err
	}()
	go func() {
		_, err := OpenReadOnly(path, testMinSize, validateMagic)
		done <- err
	}()
	for i := 0; i < 2; i++ {
		select {
		case err := <-done:
			if !errors.Is(err, ErrNotRegular) {
				t.Errorf("open FIFO = %v, want ErrNotRegular", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("opening a FIFO blocked")
		}
	}
}
