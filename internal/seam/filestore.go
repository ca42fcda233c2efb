package seam

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The table's record store: a directory beside the table file, one file
// per key (KEY.rec-suffix), replaced by writing a temporary file
// (KEY.res.tmp-RANDOM, created with O_EXCL) and renaming it over the
// record inside the fence, so a reader sees a whole record or the previous
// one. The fence runs the rename only while the writer's lock is held and
// its Manager cannot close; inside it the writer also removes the temporary
// files of earlier holders of the key's lock (killed between writing and
// renaming): nobody else can be writing one then. Records are not made
// durable (no fsync): like the table, they serve live processes of one boot.
const (
	recordSuffix = ".res"
	tempInfix    = ".tmp-"
)

// TempInfix is in the name of every temporary file of a FileStore (tests
// look for leftovers).
const TempInfix = tempInfix

type fileStore struct {
	dir     string
	feature string
	fence   func(g Grant, write func() error) error
}

// NewFileStore returns the store of feature in directory dir (created on
// the first Publish). fence runs write only while g is held by its Manager
// and cannot be released meanwhile (else an error: ErrStolen, ErrClosed).
// Publish marks the crash point feature+".written" between writing the
// temporary file and the fence.
func NewFileStore(dir, feature string, fence func(g Grant, write func() error) error) Store {
	return &fileStore{dir: dir, feature: feature, fence: fence}
}

// FilePath is the file of key's record in the FileStore of directory dir.
func FilePath(dir, key string) string { return filepath.Join(dir, key+recordSuffix) }

func checkKey(key string) error {
	if len(key) == 0 || len(key) > 64 {
		return fmt.Errorf("seam: store key of %d bytes", len(key))
	}
	for _, c := range []byte(key) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || c == '-') {
			return fmt.Errorf("seam: store key %q", key)
		}
	}
	return nil
}

func (s *fileStore) Load(key string, max int) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	return readCut(FilePath(s.dir, key), max)
}

// readCut reads the file at p, at most max+1 bytes of it.
func readCut(p string, max int) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, int64(max)+1))
}

func (s *fileStore) Publish(g Grant, key string, rec []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	var rb [8]byte
	rand.Read(rb[:])
	final := FilePath(s.dir, key)
	tmp := final + tempInfix + hex.EncodeToString(rb[:])
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(rec)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	Crash(s.feature + ".written")
	err = s.fence(g, func() error {
		olds, _ := filepath.Glob(final + tempInfix + "*")
		for _, p := range olds {
			if p != tmp {
				os.Remove(p)
			}
		}
		return os.Rename(tmp, final)
	})
	if err != nil {
		os.Remove(tmp) // the lock is gone or the rename failed: ours, never published
	}
	return err
}

func (s *fileStore) Range(max int, fn func(key string, rec []byte) error) error {
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		n := e.Name()
		if strings.Contains(n, tempInfix) {
			continue // being written, or left by a holder killed before its rename
		}
		key, ok := strings.CutSuffix(n, recordSuffix)
		if !ok || checkKey(key) != nil {
			errs = append(errs, fmt.Errorf("%s store: unexpected file %q", s.feature, n))
			continue
		}
		rec, err := readCut(filepath.Join(s.dir, n), max)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := fn(key, rec); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
