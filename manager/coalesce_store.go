package manager

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The outcome store of Coalesce: one file per name in a directory beside the
// table file (path + ".coalesce"), written only by the holder of the name's
// flight lock, to a temporary file that is then renamed over the name's
// result file, so a reader sees a whole outcome or the previous one. See
// docs/coalesce.md.
//
// Result file (little-endian), header of resultHeaderSize bytes:
//
//	Offset Size Field
//	0      8    magic "SHMLCOAL"
//	8      4    version (1)
//	12     4    kind: 0 result, 1 error text, 2 result too large (error text)
//	16     8    token: the fencing token of the flight lock of the flight that wrote it
//	24     8    unix nanoseconds when it was written
//	32     4    name length n (≤ the table's MaxNameLen)
//	36     4    data length d (≤ MaxResultSize)
//	40     4    CRC-32C of bytes 0..39, the name and the data
//	44     4    reserved, 0
//	48     n    name
//	48+n   d    data (the result, or the leader's error text)
//
// The file is untrusted: a reader checks, in this order, size, magic,
// version, kind, lengths, total size and checksum, and reports the first
// failure as ErrCorrupt with the field and its value.

// MaxResultSize is the largest result Coalesce carries: a leader whose fn
// returns more gets ErrResultTooLarge, and so does every follower of its
// flight. A leader's error text is cut to this size.
const MaxResultSize = 1 << 20

const (
	resultMagic      = "SHMLCOAL"
	resultVersion    = 1
	resultHeaderSize = 48

	kindResult   = 0
	kindError    = 1
	kindTooLarge = 2

	resultSuffix = ".res"
	tempInfix    = ".tmp-"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// outcome is a published flight outcome.
type outcome struct {
	kind  uint32
	token uint64
	at    int64 // unix ns when written
	name  string
	data  []byte
}

// gen identifies a published outcome: a follower accepts only an outcome
// published after it arrived (a different gen from the one it saw then).
type gen struct {
	token uint64
	at    int64
	ok    bool // a valid outcome for the name was there
}

func (o *outcome) gen() gen { return gen{token: o.token, at: o.at, ok: true} }

// resultStore is the directory of one table's outcomes.
type resultStore struct {
	dir        string
	maxNameLen int
}

func newResultStore(tablePath string, maxNameLen int) resultStore {
	return resultStore{dir: tablePath + ".coalesce", maxNameLen: maxNameLen}
}

// fileKey is the file name stem of name's outcome: names are arbitrary bytes.
func fileKey(name string) string {
	h := sha256.Sum256([]byte(name))
	return hex.EncodeToString(h[:16])
}

func (s resultStore) path(name string) string {
	return filepath.Join(s.dir, fileKey(name)+resultSuffix)
}

func corruptResult(path, field string, value any) error {
	return fmt.Errorf("%w: coalesce result %s: field %s = %v", ErrCorrupt, path, field, value)
}

// read returns name's published outcome; fs.ErrNotExist if there is none, an
// ErrCorrupt if the file is not a valid outcome, and a nil outcome with no
// error if the file is the outcome of another name (a file-name collision).
func (s resultStore) read(name string) (*outcome, error) {
	p := s.path(name)
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseResult(f, p, s.maxNameLen, name)
}

// parseResult reads and validates one result file.
func parseResult(f *os.File, p string, maxNameLen int, name string) (*outcome, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	if size < resultHeaderSize || size > resultHeaderSize+int64(maxNameLen)+MaxResultSize {
		return nil, corruptResult(p, "size", size)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, corruptResult(p, "size", fmt.Sprintf("%d (read: %v)", size, err))
	}
	le := binary.LittleEndian
	if string(b[:8]) != resultMagic {
		return nil, corruptResult(p, "magic", fmt.Sprintf("%q", b[:8]))
	}
	if v := le.Uint32(b[8:]); v != resultVersion {
		return nil, corruptResult(p, "version", v)
	}
	o := &outcome{kind: le.Uint32(b[12:]), token: le.Uint64(b[16:]), at: int64(le.Uint64(b[24:]))}
	if o.kind > kindTooLarge {
		return nil, corruptResult(p, "kind", o.kind)
	}
	n, d := le.Uint32(b[32:]), le.Uint32(b[36:])
	if n > uint32(maxNameLen) {
		return nil, corruptResult(p, "name length", n)
	}
	if d > MaxResultSize {
		return nil, corruptResult(p, "data length", d)
	}
	if want := resultHeaderSize + int64(n) + int64(d); size != want {
		return nil, corruptResult(p, "size", fmt.Sprintf("%d (header says %d)", size, want))
	}
	c := crc32.Update(crc32.Checksum(b[:40], castagnoli), castagnoli, b[resultHeaderSize:])
	if got := le.Uint32(b[40:]); got != c {
		return nil, corruptResult(p, "checksum", fmt.Sprintf("%#x (computed %#x)", got, c))
	}
	if r := le.Uint32(b[44:]); r != 0 {
		return nil, corruptResult(p, "reserved", r)
	}
	o.name = string(b[resultHeaderSize : resultHeaderSize+n])
	if name != "" && o.name != name {
		return nil, nil // another name's outcome: not a result for name
	}
	o.data = b[resultHeaderSize+n:]
	return o, nil
}

// encodeResult lays out outcome o.
func encodeResult(o *outcome) []byte {
	b := make([]byte, resultHeaderSize+len(o.name)+len(o.data))
	le := binary.LittleEndian
	copy(b, resultMagic)
	le.PutUint32(b[8:], resultVersion)
	le.PutUint32(b[12:], o.kind)
	le.PutUint64(b[16:], o.token)
	le.PutUint64(b[24:], uint64(o.at))
	le.PutUint32(b[32:], uint32(len(o.name)))
	le.PutUint32(b[36:], uint32(len(o.data)))
	copy(b[resultHeaderSize:], o.name)
	copy(b[resultHeaderSize+len(o.name):], o.data)
	le.PutUint32(b[40:], crc32.Update(crc32.Checksum(b[:40], castagnoli), castagnoli, b[resultHeaderSize:]))
	return b
}

// writeTemp writes o to a new temporary file beside name's result file and
// returns its path. Only the holder of name's flight lock calls it.
func (s resultStore) writeTemp(o *outcome) (string, error) {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return "", err
	}
	var rb [8]byte
	rand.Read(rb[:])
	tmp := s.path(o.name) + tempInfix + hex.EncodeToString(rb[:])
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	_, err = f.Write(encodeResult(o))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

// removeTemps removes the temporary files of name's earlier leaders (killed
// between writing and renaming). Only the holder of name's flight lock calls
// it, so no temporary file of name is being written meanwhile.
func (s resultStore) removeTemps(name string) {
	olds, _ := filepath.Glob(s.path(name) + tempInfix + "*")
	for _, p := range olds {
		os.Remove(p)
	}
}

// check validates every result file of the store: each parses, and its name
// is the one its file name stands for. Temporary files are allowed (a leader
// may be writing one, or have died before its rename).
func (s resultStore) check() error {
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
			continue
		}
		if !strings.HasSuffix(n, resultSuffix) {
			errs = append(errs, fmt.Errorf("coalesce store: unexpected file %q", n))
			continue
		}
		p := filepath.Join(s.dir, n)
		f, err := os.Open(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		o, err := parseResult(f, p, s.maxNameLen, "")
		f.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if fileKey(o.name)+resultSuffix != n {
			errs = append(errs, corruptResult(p, "name", fmt.Sprintf("%q (file is not its)", o.name)))
		}
	}
	return errors.Join(errs...)
}

// fresh reports whether o is a successful result written at most maxAge ago.
func (o *outcome) fresh(maxAge time.Duration, now time.Time) bool {
	age := now.UnixNano() - o.at
	return o.kind == kindResult && age >= 0 && age <= int64(maxAge)
}
