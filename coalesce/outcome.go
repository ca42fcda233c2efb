package coalesce

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

// A flight's outcome is one record of the bucket's "coalesce" store (for
// the table: one file per key in PATH.coalesce/, see internal/seam), under
// the store key recordKey(key), written only by the holder of the key's
// flight lock. Record (little-endian), header of recordHeaderSize bytes:
//
//	Offset Size Field
//	0      8    magic "SHMLCOAL"
//	8      4    version (1)
//	12     4    kind: 0 result, 1 error text, 2 result too large (error text)
//	16     8    token: the fencing token of the flight lock of the flight that wrote it
//	24     8    unix nanoseconds when it was written
//	32     4    key length n (≤ the Manager's MaxNameLen)
//	36     4    data length d (≤ MaxResultSize)
//	40     4    CRC-32C of bytes 0..39, the key and the data
//	44     4    reserved, 0
//	48     n    key
//	48+n   d    data (the result, or the leader's error text)
//
// A record is untrusted: a reader checks, in this order, size, magic,
// version, kind, lengths, total size, checksum and the reserved word, and
// reports the first failure as manager.ErrCorrupt with the field and its
// value.

// MaxResultSize is the largest result Do carries: a leader whose fn returns
// more gets ErrResultTooLarge, and so does every follower of its flight. A
// leader's error text is cut to this size.
const MaxResultSize = 1 << 20

// feature is the name of the package's record store in a bucket.
const feature = "coalesce"

const (
	recordMagic      = "SHMLCOAL"
	recordVersion    = 1
	recordHeaderSize = 48

	kindResult   = 0
	kindError    = 1
	kindTooLarge = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// outcome is a published flight outcome.
type outcome struct {
	kind  uint32
	token uint64
	at    int64 // unix ns when written
	key   string
	data  []byte
}

// gen identifies a published outcome: a follower accepts only an outcome
// published after it arrived (a different gen from the one it saw then).
type gen struct {
	token uint64
	at    int64
	ok    bool // a valid outcome for the key was there
}

func (o *outcome) gen() gen { return gen{token: o.token, at: o.at, ok: true} }

// recordKey is the store key of key's outcome: keys are arbitrary bytes.
func recordKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:16])
}

// maxRecord is the longest valid record under a MaxNameLen of maxName.
func maxRecord(maxName int) int { return recordHeaderSize + maxName + MaxResultSize }

func corruptRecord(rk, field string, value any) error {
	return fmt.Errorf("%w: coalesce record %s: field %s = %v", manager.ErrCorrupt, rk, field, value)
}

// parseRecord validates record b, stored under store key rk. With key not
// empty, a valid record of another key (a store-key collision) is no
// outcome for key: nil, nil.
func parseRecord(b []byte, rk string, maxName int, key string) (*outcome, error) {
	size := len(b)
	if size < recordHeaderSize || size > maxRecord(maxName) {
		return nil, corruptRecord(rk, "size", size)
	}
	le := binary.LittleEndian
	if string(b[:8]) != recordMagic {
		return nil, corruptRecord(rk, "magic", fmt.Sprintf("%q", b[:8]))
	}
	if v := le.Uint32(b[8:]); v != recordVersion {
		return nil, corruptRecord(rk, "version", v)
	}
	o := &outcome{kind: le.Uint32(b[12:]), token: le.Uint64(b[16:]), at: int64(le.Uint64(b[24:]))}
	if o.kind > kindTooLarge {
		return nil, corruptRecord(rk, "kind", o.kind)
	}
	n, d := le.Uint32(b[32:]), le.Uint32(b[36:])
	if n > uint32(maxName) {
		return nil, corruptRecord(rk, "name length", n)
	}
	if d > MaxResultSize {
		return nil, corruptRecord(rk, "data length", d)
	}
	if want := recordHeaderSize + int(n) + int(d); size != want {
		return nil, corruptRecord(rk, "size", fmt.Sprintf("%d (header says %d)", size, want))
	}
	c := crc32.Update(crc32.Checksum(b[:40], castagnoli), castagnoli, b[recordHeaderSize:])
	if got := le.Uint32(b[40:]); got != c {
		return nil, corruptRecord(rk, "checksum", fmt.Sprintf("%#x (computed %#x)", got, c))
	}
	if r := le.Uint32(b[44:]); r != 0 {
		return nil, corruptRecord(rk, "reserved", r)
	}
	o.key = string(b[recordHeaderSize : recordHeaderSize+n])
	if key != "" && o.key != key {
		return nil, nil
	}
	o.data = b[recordHeaderSize+n:]
	return o, nil
}

// encodeRecord lays out outcome o.
func encodeRecord(o *outcome) []byte {
	b := make([]byte, recordHeaderSize+len(o.key)+len(o.data))
	le := binary.LittleEndian
	copy(b, recordMagic)
	le.PutUint32(b[8:], recordVersion)
	le.PutUint32(b[12:], o.kind)
	le.PutUint64(b[16:], o.token)
	le.PutUint64(b[24:], uint64(o.at))
	le.PutUint32(b[32:], uint32(len(o.key)))
	le.PutUint32(b[36:], uint32(len(o.data)))
	copy(b[recordHeaderSize:], o.key)
	copy(b[recordHeaderSize+len(o.key):], o.data)
	le.PutUint32(b[40:], crc32.Update(crc32.Checksum(b[:40], castagnoli), castagnoli, b[recordHeaderSize:]))
	return b
}

// fresh reports whether o is a successful result written at most maxAge ago.
func (o *outcome) fresh(maxAge time.Duration, now time.Time) bool {
	age := now.UnixNano() - o.at
	return o.kind == kindResult && age >= 0 && age <= int64(maxAge)
}

// result is what a follower in another process gets from outcome o.
func (o *outcome) result() ([]byte, error) {
	switch o.kind {
	case kindResult:
		return o.data, nil
	case kindTooLarge:
		return nil, fmt.Errorf("%w: coalesce %q (leader token %d): %s", ErrResultTooLarge, o.key, o.token, o.data)
	}
	return nil, fmt.Errorf("%w: coalesce %q (leader token %d): %s", ErrLeaderFailed, o.key, o.token, o.data)
}
