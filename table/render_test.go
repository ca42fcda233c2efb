package table

import (
	"bytes"
	"encoding/binary"
	"flag"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The golden files are rewritten with: go test ./table -run Render -update
// The flag is defined here unless another test file of the package already
// defines one with that name (package variables initialise before init).
func init() {
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite the golden files in testdata")
	}
}

func renderUpdate() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

var renderGeometry = Geometry{MaxResources: 8, MaxRequests: 32, MaxAgents: 8, MaxNameLen: 32}

// TestRenderGolden builds a table with fake agents (one of them dead), held
// and pending requests in both modes and a steal, pins every time stamp, the
// nonce, the boot id and liveness, and compares Render with the golden file.
func TestRenderGolden(t *testing.T) {
	path := filepath.Join(t.TempDir(), "render.tbl")
	tb, created, err := Open(path, renderGeometry, 0)
	require.NoError(t, err)
	require.True(t, created)
	t.Cleanup(func() { tb.Close() })

	// PID 1003 is dead, the others alive.
	SetLiveness(func(id Identity) bool { return id.PID != 1003 })
	t.Cleanup(func() { SetLiveness(nil) })

	base := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	now := base.Add(90 * time.Minute)

	// Pin the header's time stamp and random fields (and fix its checksum).
	ne := binary.NativeEndian
	ne.PutUint64(tb.buf[hdrCreated:], uint64(base.UnixNano()))
	ne.PutUint64(tb.buf[hdrNonce:], 0x5eed5eed5eed5eed)
	ne.PutUint32(tb.buf[hdrChecksum:], headerChecksum(tb.buf))
	tb.nonce = 0x5eed5eed5eed5eed
	writeBootID(tb.buf, [16]byte{0xb0, 0x07, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14})

	reg := func(pid int, nonce uint64, since time.Duration) *Agent {
		a, err := tb.Register(Identity{PID: pid, Start: 4242, Boot: 77}, nonce)
		require.NoError(t, err)
		atomic.StoreUint64(tb.u64(tb.agentOff(a.Idx)+agSince), uint64(base.Add(since).UnixNano()))
		return a
	}
	a1 := reg(1001, 0xa1, time.Minute)
	a2 := reg(1002, 0xa2, 2*time.Minute)
	a3 := reg(1003, 0xa3, 3*time.Minute)

	var w Wakes
	acq := func(a *Agent, name string, mode uint32, steal bool, at time.Duration) (Ref, Outcome) {
		ref, out, _, err := tb.Acquire(a, name, Hash(name), mode, false, steal, &w)
		require.NoError(t, err)
		so := tb.slotOff(ref.Slot)
		ts := uint64(base.Add(at).UnixNano())
		atomic.StoreUint64(tb.u64(so+slEnqueue), ts)
		if out == Granted {
			atomic.StoreUint64(tb.u64(so+slGrant), ts)
		}
		return ref, out
	}
	_, out := acq(a1, "invoices", ModeExclusive, false, 80*time.Minute)
	require.Equal(t, Granted, out)
	_, out = acq(a2, "invoices", ModeShared, false, 85*time.Minute)
	require.Equal(t, Queued, out)
	_, out = acq(a3, "invoices", ModeExclusive, false, 89*time.Minute+59*time.Second+500*time.Millisecond)
	require.Equal(t, Queued, out)
	_, out = acq(a1, "reports", ModeShared, false, 60*time.Minute)
	require.Equal(t, Granted, out)
	ref, out := acq(a2, "reports", ModeShared, false, 89*time.Minute)
	require.Equal(t, Granted, out)
	atomic.StoreUint64(tb.u64(tb.slotOff(ref.Slot)+slGrant), 0) // granted at once: time not recorded
	_, out = acq(a3, "cache\x00\"odd\"", ModeExclusive, false, 30*time.Minute)
	require.Equal(t, Granted, out)
	_, out = acq(a2, "cache\x00\"odd\"", ModeExclusive, true, 89*time.Minute+59*time.Second+999*time.Millisecond+400*time.Microsecond)
	require.Equal(t, Granted, out)
	// The stolen slot of a3 stays STOLEN (in no list) until a3 frees it.
	// a1 waits for "invoices" to be free for a shared request; a2 watches it.
	watch := func(a *Agent, name string, mode uint32, at time.Duration) {
		r, err := tb.Claim(a, Hash(name))
		require.NoError(t, err)
		out, err := tb.Watch(a, r, name, Hash(name), mode, base.Add(at).UnixNano(), &w)
		require.NoError(t, err)
		require.Equal(t, WatchLinked, out)
	}
	watch(a1, "invoices", ModeShared, 89*time.Minute+30*time.Second)
	watch(a2, "invoices", ModeAny, 70*time.Minute)

	var got bytes.Buffer
	require.NoError(t, tb.Render(&got, now))

	// The same bytes render the same way through a read-only mapping.
	ro, err := OpenReadOnly(path)
	require.NoError(t, err)
	defer ro.Close()
	var again bytes.Buffer
	require.NoError(t, ro.Render(&again, now))
	require.Equal(t, got.String(), again.String(), "read-only render differs")

	golden := filepath.Join("testdata", "render.golden")
	if renderUpdate() {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(golden, got.Bytes(), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err, "run with -update to create the golden file")
	require.Equal(t, string(want), got.String())
}

// TestRenderEmptyAndTruncated: an empty table renders "none"; Render on a
// mapping whose file was truncated underneath reports ErrCorrupt, not a crash.
func TestRenderEmptyAndTruncated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "empty.tbl")
	tb, _, err := Open(path, renderGeometry, 0)
	require.NoError(t, err)
	defer tb.Close()
	var out bytes.Buffer
	require.NoError(t, tb.Render(&out, time.Now()))
	require.Contains(t, out.String(), "agents: 0")
	require.Contains(t, out.String(), "locks: none")

	require.NoError(t, os.Truncate(path, 0))
	err = tb.Render(&bytes.Buffer{}, time.Now())
	if err != nil { // some platforms keep the pages readable
		require.ErrorIs(t, err, ErrCorrupt)
	}
}

func TestRenderAge(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{0, "0s"},
		{1500 * time.Nanosecond, "2µs"},
		{1234567 * time.Nanosecond, "1ms"},
		{1567 * time.Millisecond, "1.6s"},
		{61*time.Second + 600*time.Millisecond, "1m2s"},
		{90 * time.Minute, "1h30m0s"},
	} {
		require.Equal(t, c.want, RenderAge(c.d), "%v", c.d)
	}
}
