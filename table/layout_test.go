package table

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestLayoutOffsets asserts the byte layout documented in doc.go and
// docs/design.md: every field's offset, size and alignment (off % size == 0).
func TestLayoutOffsets(t *testing.T) {
	type field struct {
		name      string
		off, size uintptr
		end       uintptr // record size the field must fit in
	}
	fields := []field{
		{"hdrMagic", hdrMagic, 8, HeaderSize}, {"hdrVersion", hdrVersion, 4, HeaderSize},
		{"hdrHeaderSize", hdrHeaderSize, 4, HeaderSize}, {"hdrMaxResources", hdrMaxResources, 4, HeaderSize},
		{"hdrMaxRequests", hdrMaxRequests, 4, HeaderSize}, {"hdrMaxAgents", hdrMaxAgents, 4, HeaderSize},
		{"hdrMaxNameLen", hdrMaxNameLen, 4, HeaderSize}, {"hdrBuckets", hdrBuckets, 4, HeaderSize},
		{"hdrEntryStride", hdrEntryStride, 4, HeaderSize}, {"hdrFileSize", hdrFileSize, 8, HeaderSize},
		{"hdrBucketsOff", hdrBucketsOff, 8, HeaderSize}, {"hdrEntriesOff", hdrEntriesOff, 8, HeaderSize},
		{"hdrSlotsOff", hdrSlotsOff, 8, HeaderSize}, {"hdrAgentsOff", hdrAgentsOff, 8, HeaderSize},
		{"hdrNonce", hdrNonce, 8, HeaderSize}, {"hdrCreated", hdrCreated, 8, HeaderSize},
		{"hdrFairness", hdrFairness, 4, HeaderSize}, {"hdrFairSpare", hdrFairSpare, 4, HeaderSize},
		{"hdrFairBound", hdrFairBound, 8, HeaderSize},
		{"hdrChecksum", hdrChecksum, 4, HeaderSize}, {"hdrBootID", hdrBootID, 8, HeaderSize},
		{"hdrBootID+8", hdrBootID + 8, 8, HeaderSize}, {"hdrEntryHint", hdrEntryHint, 4, HeaderSize},
		{"hdrSlotHint", hdrSlotHint, 4, HeaderSize}, {"hdrAgentHint", hdrAgentHint, 4, HeaderSize},
		{"hdrReaps", hdrReaps, 8, HeaderSize}, {"hdrRepairs", hdrRepairs, 8, HeaderSize},
		{"bkLatch", bkLatch, 4, BucketSize}, {"bkHead", bkHead, 4, BucketSize}, {"bkMaxToken", bkMaxToken, 8, BucketSize},
		{"enState", enState, 4, entryFixed}, {"enNext", enNext, 4, entryFixed}, {"enQHead", enQHead, 4, entryFixed},
		{"enQTail", enQTail, 4, entryFixed}, {"enHHead", enHHead, 4, entryFixed}, {"enNHeld", enNHeld, 4, entryFixed},
		{"enHMode", enHMode, 4, entryFixed}, {"enSeq", enSeq, 4, entryFixed}, {"enToken", enToken, 8, entryFixed},
		{"enHash", enHash, 8, entryFixed}, {"enNameLen", enNameLen, 4, entryFixed}, {"enNWait", enNWait, 4, entryFixed},
		{"enFast", enFast, 8, entryFixed}, {"enWHead", enWHead, 4, entryFixed}, {"enGen", enGen, 4, entryFixed},
		{"enStamp", enStamp, 8, entryFixed},
		{"slWord", slWord, 8, SlotSize}, {"slEntry", slEntry, 4, SlotSize}, {"slMode", slMode, 4, SlotSize},
		{"slPrev", slPrev, 4, SlotSize}, {"slNext", slNext, 4, SlotSize}, {"slSeq", slSeq, 4, SlotSize},
		{"slFlags", slFlags, 4, SlotSize}, {"slToken", slToken, 8, SlotSize}, {"slEnqueue", slEnqueue, 8, SlotSize},
		{"slGrant", slGrant, 8, SlotSize},
		{"agWord", agWord, 8, AgentSize}, {"agStart", agStart, 8, AgentSize}, {"agBoot", agBoot, 8, AgentSize},
		{"agNonce", agNonce, 8, AgentSize}, {"agBell", agBell, 4, AgentSize}, {"agParked", agParked, 4, AgentSize},
		{"agStealSeq", agStealSeq, 4, AgentSize}, {"agSince", agSince, 8, AgentSize},
		{"agSlotMask", agSlotMask, 8, AgentSize}, {"agEntryMask", agEntryMask, 8, AgentSize},
		{"agCoOwner", agCoOwner, 8, AgentSize},
		{"agDeath", agDeath, 4, AgentSize},
		{"agXBell", agXBell, 4, AgentSize},
		{"agPidNS", agPidNS, 8, AgentSize},
		{"agNetNS", agNetNS, 8, AgentSize},
		{"hdrAgentsGen", hdrAgentsGen, 4, HeaderSize},
	}
	for _, f := range fields {
		require.Zero(t, f.off%f.size, "%s at %d is not aligned to %d", f.name, f.off, f.size)
		require.LessOrEqual(t, f.off+f.size, f.end, "%s overflows its record", f.name)
	}
	require.Equal(t, uintptr(112), uintptr(hdrChecksum), "the checksum covers [0, 112)")
	require.Equal(t, uintptr(hdrChecksum), uintptr(hdrFairBound+8), "the fairness fields are covered by the checksum")
	require.Equal(t, uintptr(enName), uintptr(entryFixed))

	// Derived regions of a few geometries: 8-byte aligned strides and offsets.
	for _, g := range []Geometry{DefaultGeometry, smallGeometry, {1, 1, 1, 1}, {3, 5, 7, 9}, {16, 64, 16, 255}} {
		l := g.layout()
		require.Zero(t, l.bucketsOff%8)
		require.Zero(t, l.entriesOff%8)
		require.Zero(t, l.slotsOff%8)
		require.Zero(t, l.agentsOff%8)
		require.Zero(t, l.entryStride%8)
		require.Equal(t, uint32(0), l.buckets&(l.buckets-1), "buckets power of two")
		require.GreaterOrEqual(t, int(l.buckets), 2*g.MaxResources)
		require.Equal(t, l.agentsOff+uint64(g.MaxAgents)*AgentSize, l.size)
		require.Equal(t, l.slotsOff+uint64(g.MaxRequests+g.MaxResources)*SlotSize, l.agentsOff, "a reserved slot per entry after the request slots")
	}
	require.Equal(t, uintptr(8), unsafe.Sizeof(uint64(0)))
}

func TestDefaultGeometrySize(t *testing.T) {
	l := DefaultGeometry.layout()
	require.Less(t, l.size, uint64(8<<20), "default table stays small")
	t.Logf("default table: %d bytes", l.size)
}

// corruptCase mutates a valid header and names the field the error must mention.
type corruptCase struct {
	name  string
	field string
	mut   func(b []byte)
}

func TestHeaderValidationLadder(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.tbl")
	tb, _, err := Open(good, smallGeometry, 0)
	require.NoError(t, err)
	tb.Close()
	orig, err := os.ReadFile(good)
	require.NoError(t, err)
	ne := binary.NativeEndian
	resum := func(b []byte) { ne.PutUint32(b[hdrChecksum:], headerChecksum(b)) }
	cases := []corruptCase{
		{"magic", "magic", func(b []byte) { copy(b, "NOTLOCKS") }},
		// Another format is ErrFormat, not ErrCorrupt (replace_test.go).
		{"checksum", "checksum", func(b []byte) { b[hdrMaxAgents]++ }},
		{"geometry", "MaxRequests", func(b []byte) { ne.PutUint32(b[hdrMaxRequests:], 0); resum(b) }},
		{"buckets", "buckets", func(b []byte) { ne.PutUint32(b[hdrBuckets:], 7); resum(b) }},
		{"offset", "slots offset", func(b []byte) { ne.PutUint64(b[hdrSlotsOff:], 12); resum(b) }},
		{"recorded size", "recorded file size", func(b []byte) { ne.PutUint64(b[hdrFileSize:], 1<<40); resum(b) }},
		{"header size", "header size", func(b []byte) { ne.PutUint32(b[hdrHeaderSize:], 8); resum(b) }},
		// The fairness fields (fairness.go), checksummed but validated as
		// untrusted all the same.
		{"fairness kind", "fairness = 7", func(b []byte) { ne.PutUint32(b[hdrFairness:], 7); resum(b) }},
		{"fairness spare", "fairness spare", func(b []byte) { ne.PutUint32(b[hdrFairSpare:], 1); resum(b) }},
		{"FIFO with a bound", "fairness bound", func(b []byte) { ne.PutUint64(b[hdrFairBound:], 5); resum(b) }},
		{"bounded without a bound", "fairness bound = 0", func(b []byte) { ne.PutUint32(b[hdrFairness:], fairBounded); resum(b) }},
		{"bound too long", "fairness bound", func(b []byte) {
			ne.PutUint32(b[hdrFairness:], fairBounded)
			ne.PutUint64(b[hdrFairBound:], uint64(MaxFairnessBound)+1)
			resum(b)
		}},
		{"bound negative", "fairness bound", func(b []byte) {
			ne.PutUint32(b[hdrFairness:], fairBounded)
			ne.PutUint64(b[hdrFairBound:], 1<<63)
			resum(b)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := append([]byte(nil), orig...)
			c.mut(b)
			p := filepath.Join(dir, c.name+".tbl")
			require.NoError(t, os.WriteFile(p, b, 0o600))
			_, _, err := Open(p, smallGeometry, 0)
			require.ErrorIs(t, err, ErrCorrupt)
			require.Contains(t, err.Error(), c.field)
			_, err = OpenReadOnly(p)
			require.ErrorIs(t, err, ErrCorrupt)
		})
	}
	t.Run("truncated", func(t *testing.T) {
		p := filepath.Join(dir, "trunc.tbl")
		require.NoError(t, os.WriteFile(p, orig[:len(orig)-8], 0o600))
		_, _, err := Open(p, smallGeometry, 0)
		require.ErrorIs(t, err, ErrCorrupt)
		require.Contains(t, err.Error(), "file size")
	})
	t.Run("tiny", func(t *testing.T) {
		p := filepath.Join(dir, "tiny.tbl")
		require.NoError(t, os.WriteFile(p, []byte("SHM"), 0o600))
		_, _, err := Open(p, smallGeometry, 0)
		require.ErrorIs(t, err, ErrCorrupt)
	})
	t.Run("symlink", func(t *testing.T) {
		p := filepath.Join(dir, "link.tbl")
		require.NoError(t, os.Symlink(good, p))
		_, _, err := Open(p, smallGeometry, 0)
		require.Error(t, err)
	})
	t.Run("existing keeps its geometry", func(t *testing.T) {
		tb, created, err := Open(good, DefaultGeometry, 0)
		require.NoError(t, err)
		require.False(t, created)
		require.Equal(t, smallGeometry, tb.Geometry())
		tb.Close()
	})
}

func TestFileMode(t *testing.T) {
	dir := t.TempDir()
	for _, mode := range []os.FileMode{0, 0o640, 0o660} {
		p := filepath.Join(dir, mode.String()+".tbl")
		tb, _, err := Open(p, smallGeometry, mode)
		require.NoError(t, err)
		tb.Close()
		st, err := os.Stat(p)
		require.NoError(t, err)
		want := mode
		if want == 0 {
			want = 0o600
		}
		require.Equal(t, want, st.Mode().Perm())
	}
}

// FuzzHeader feeds arbitrary bytes (seeded from testdata/fuzz/FuzzHeader)
// to the validation ladder: it must return a table or ErrCorrupt, never
// panic, and a table it accepts must pass the checker and serve requests.
func FuzzHeader(f *testing.F) {
	dir := f.TempDir()
	good := filepath.Join(dir, "seed.tbl")
	tb, _, err := Open(good, Geometry{MaxResources: 2, MaxRequests: 4, MaxAgents: 2, MaxNameLen: 8}, 0)
	require.NoError(f, err)
	tb.Close()
	b, _ := os.ReadFile(good)
	f.Add(b)
	f.Add(b[:HeaderSize])
	f.Add([]byte{})
	bounded := filepath.Join(dir, "bounded.tbl")
	tb, _, err = OpenFair(bounded, Geometry{MaxResources: 2, MaxRequests: 4, MaxAgents: 2, MaxNameLen: 8}, 0, time.Millisecond)
	require.NoError(f, err)
	tb.Close()
	b, _ = os.ReadFile(bounded)
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "f.tbl")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Skip()
		}
		if len(data) > 1<<20 {
			t.Skip()
		}
		tb, err := OpenReadOnly(p)
		if err != nil {
			if len(data) > 0 && !errors.Is(err, ErrFormat) {
				require.ErrorIs(t, err, ErrCorrupt)
			}
			return
		}
		defer tb.Close()
		// Accepted bytes: the lock-free readers must not panic or hang.
		tb.Snapshot(nil)
		tb.Usage()
		tb.Agents()
		tb.Check(nil)
	})
}

// The reaper skips slot ranges an agent never claimed from: every slot is in
// exactly one range and rangeEnd moves past it.
func TestSlotRanges(t *testing.T) {
	for _, n := range []uint32{1, 2, 3, 4, 63, 64, 65, 100, 1000, 32768} {
		for s := uint32(0); s < n; s++ {
			r := slotRange(s, n)
			require.Less(t, r, uint32(64))
			end := rangeEnd(r, n)
			require.Greater(t, end, s, "n=%d s=%d", n, s)
			if end < n {
				require.NotEqual(t, r, slotRange(end, n), "n=%d: range %d ends at %d", n, r, end)
			}
		}
	}
}

// Entry ranges (agEntryMask) are 2^entryShift entries each, at most 64 of
// them, and the reaper's skip to the next range lands on its first entry.
func TestEntryRanges(t *testing.T) {
	for _, n := range []int{1, 2, 3, 63, 64, 65, 100, 4096, 4097, 131072, MaxResourcesLimit} {
		l := Geometry{MaxResources: n, MaxRequests: 1, MaxAgents: 1, MaxNameLen: 1}.layout()
		tb := &Table{l: l}
		last := tb.entryRange(uint32(n - 1))
		require.Less(t, last, uint32(64), "MaxResources %d", n)
		for _, e := range []uint32{0, 1, uint32(n / 2), uint32(n - 1)} {
			if e >= uint32(n) {
				continue
			}
			r := tb.entryRange(e)
			next := (r + 1) << l.entryShift // where inflateAgentFastHolds skips to
			require.Greater(t, next, e)
			if next < uint32(n) {
				require.Equal(t, r+1, tb.entryRange(next), "MaxResources %d: entry %d", n, e)
				require.Equal(t, r, tb.entryRange(next-1))
			}
		}
		if n >= 64 {
			require.GreaterOrEqual(t, last, uint32(32), "MaxResources %d: the ranges are not needlessly coarse", n)
		}
	}
}

// TestHashIsPartOfTheFormat pins Hash's values: every process that shares a
// table must place a name in the same bucket, so a change of Hash must come
// with a new FormatVersion (and new values here). make test also runs this
// under GOARCH=386: the values do not depend on the machine's word size.
func TestHashIsPartOfTheFormat(t *testing.T) {
	require.Equal(t, uint32(8), uint32(FormatVersion), "these values are those of formats 3 to 8 (4 changed the fast path, 5 and 7 the entry header, 6 the slot's park mark, 7 the agent's co-owner and the header's fairness, 8 liveness by locks and the agent's namespaces, not the hash)")
	for _, c := range []struct {
		name string
		want uint64
	}{
		{"", 0xf47cdffd9671363d},
		{"a", 0x489e983c3a584d86},
		{"bench", 0x5b98c8b1186f7846},
		{"n000123", 0x6738071b3ace68b0},
		{"12345678", 0x12023222c7d52e86},
		{"orders/2026/11/21/customer-000123", 0x4868e30d3d89fe3b},
	} {
		require.Equal(t, c.want, Hash(c.name), "Hash(%q)", c.name)
	}
}

// TestHashTailLoads: Hash reads a name's last 1-7 bytes with two
// overlapping loads; it must give the values of the byte-by-byte definition
// (the one pinned above) at every length and for every byte value.
func TestHashTailLoads(t *testing.T) {
	ref := func(name string) uint64 {
		h := uint64(len(name)) ^ hashK1
		for ; len(name) >= 8; name = name[8:] {
			h = hashMix(h^binary.LittleEndian.Uint64([]byte(name[:8])), hashK2)
		}
		if len(name) > 0 {
			var tail uint64
			for i := len(name) - 1; i >= 0; i-- {
				tail = tail<<8 | uint64(name[i])
			}
			h = hashMix(h^tail, hashK2)
		}
		return hashMix(h, hashK1)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 48)
	for n := 0; n <= len(buf); n++ {
		for round := 0; round < 200; round++ {
			for i := range buf[:n] {
				buf[i] = byte(rng.Uint32())
			}
			name := string(buf[:n])
			require.Equal(t, ref(name), Hash(name), "length %d, %x", n, name)
		}
	}
}

// TestHashSpreadsNames: names that differ in one byte anywhere, as generated
// names do, fill buckets like random values would (BucketOf's fold of the
// hash, 2^18 buckets, 100,000 names: Poisson with mean 0.38).
func TestHashSpreadsNames(t *testing.T) {
	const buckets = 1 << 18
	for _, format := range []string{"n%06d", "/var/lib/app/locks/%06d.lock", "%06d/tail-shared-by-all"} {
		count := make([]uint8, buckets)
		for i := 0; i < 100_000; i++ {
			h := Hash(fmt.Sprintf(format, i))
			count[uint32(h^h>>32)&(buckets-1)]++
		}
		empty, most := 0, uint8(0)
		for _, c := range count {
			if c == 0 {
				empty++
			}
			most = max(most, c)
		}
		// Expected: e^-0.381 = 68.3% empty, and no bucket with 8 names
		// (probability about 0.004 over all buckets).
		require.InDelta(t, 0.683, float64(empty)/buckets, 0.01, "format %q: share of empty buckets", format)
		require.Less(t, most, uint8(8), "format %q: longest chain", format)
	}
}

// TestFairnessInHeader: a table created with a bound records it and every
// later open (read-write or read-only) reads it back; an existing file
// keeps its own whatever the opener asks for; a bound out of range is
// refused at creation.
func TestFairnessInHeader(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "bounded.tbl")
	tb, created, err := OpenFair(p, smallGeometry, 0, 1500*time.Microsecond)
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, 1500*time.Microsecond, tb.Bound())
	tb.Close()
	tb, created, err = Open(p, smallGeometry, 0) // asks for FIFO: the file keeps its own
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, 1500*time.Microsecond, tb.Bound())
	tb.Close()
	ro, err := OpenReadOnly(p)
	require.NoError(t, err)
	require.Equal(t, 1500*time.Microsecond, ro.Bound())
	ro.Close()

	f := filepath.Join(dir, "fifo.tbl")
	tb, _, err = Open(f, smallGeometry, 0)
	require.NoError(t, err)
	require.Zero(t, tb.Bound())
	tb.Close()
	tb, _, err = OpenFair(f, smallGeometry, 0, time.Millisecond)
	require.NoError(t, err)
	require.Zero(t, tb.Bound(), "an existing FIFO file stays FIFO")
	tb.Close()

	for _, d := range []time.Duration{-1, MaxFairnessBound + 1} {
		_, _, err := OpenFair(filepath.Join(dir, "bad.tbl"), smallGeometry, 0, d)
		require.ErrorIs(t, err, ErrGeometry, "bound %v", d)
	}
}
