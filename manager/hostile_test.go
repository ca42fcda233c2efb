package manager

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/table"
)

// Hostile bytes: garbage written into random words of a live table (held
// locks, a queue, dead agents' leftovers) must never make Open, Query,
// Acquire, Release or the checker panic or hang; what they cannot use they
// report as ErrCorrupt (or as the ordinary error of the operation).

var hostileGeometry = &OpenOptions{MaxResources: 8, MaxRequests: 32, MaxAgents: 8, MaxNameLen: 16}

// hostileRun builds a live table, applies the corruption and exercises it.
// Every blocking call carries a deadline, and latch waits behind a live
// owner give up after 50 ms, so a hang would show as a test timeout.
func hostileRun(t *testing.T, corrupt func(b []byte)) {
	old := table.LatchGiveUp
	table.LatchGiveUp = 50 * time.Millisecond
	defer func() { table.LatchGiveUp = old }()

	path := tablePath(t)
	m1, err := Open(path, hostileGeometry)
	require.NoError(t, err)
	defer m1.Close()
	ctx := context.Background()
	l1, err := m1.Acquire(ctx, "a", RequestOptions{})
	require.NoError(t, err)
	_, err = m1.Acquire(ctx, "s", RequestOptions{Mode: Shared})
	require.NoError(t, err)
	qctx, qcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer qcancel()
	queued := acquireAsync(qctx, m1, "a", RequestOptions{Mode: Shared})
	waitPending(t, m1, "a", 1)

	corrupt(m1.Table().Bytes())

	opctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	m2, err := Open(path, hostileGeometry)
	if err == nil {
		m2.Query(opctx)
		if l, err := m2.Acquire(opctx, "a", RequestOptions{}); err == nil {
			l.Release()
		}
		if l, err := m2.Acquire(opctx, "new", RequestOptions{IfAvailable: true}); err == nil {
			l.Release()
		}
		m2.Check()
		m2.Close()
	} else if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrTableFull) {
		t.Fatalf("Open of a corrupted table: %v", err)
	}
	m1.Check()
	l1.Release()
	if r := <-queued; r.l != nil {
		r.l.Release()
	}
	m1.Query(opctx)
}

// corruptWords writes the values in data (8 bytes of offset, 8 of value
// each) into 32- or 64-bit words of b.
func corruptWords(b []byte, data []byte) {
	for len(data) >= 16 {
		off := binary.LittleEndian.Uint64(data) % uint64(len(b)/4) * 4
		v := binary.LittleEndian.Uint64(data[8:])
		if off%8 == 0 && v>>63 == 1 && off+8 <= uint64(len(b)) {
			binary.NativeEndian.PutUint64(b[off:], v&^(1<<63))
		} else {
			binary.NativeEndian.PutUint32(b[off:], uint32(v))
		}
		data = data[16:]
	}
}

func FuzzHostileWords(f *testing.F) {
	for seed := uint64(0); seed < 8; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		data := make([]byte, 16*(1+seed%4))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		hostileRun(t, func(b []byte) { corruptWords(b, data) })
	})
}

// TestHostileWords runs a few hundred seeded corruptions in every test run,
// favouring small values (indices, states, agent numbers), which are the
// dangerous ones.
func TestHostileWords(t *testing.T) {
	n := 100
	if testing.Short() || raceEnabled {
		n = 30
	}
	for i := 0; i < n; i++ {
		rng := rand.New(rand.NewPCG(uint64(i), 2))
		words := 1 + rng.IntN(4)
		data := make([]byte, 16*words)
		for w := 0; w < words; w++ {
			binary.LittleEndian.PutUint64(data[16*w:], rng.Uint64())
			v := rng.Uint64()
			if rng.IntN(3) > 0 {
				v = uint64(rng.IntN(40)) // small: indices, states, counts
			}
			binary.LittleEndian.PutUint64(data[16*w+8:], v)
		}
		hostileRun(t, func(b []byte) { corruptWords(b, data) })
	}
}

// A file truncated under a running process: Query and the checker report
// ErrCorrupt instead of dying of SIGBUS (the default geometry spans many
// pages, so the reads past the new end fault).
func TestTruncatedUnderUs(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, &OpenOptions{})
	l, err := m.Acquire(context.Background(), "t", RequestOptions{})
	require.NoError(t, err)
	_ = l
	require.NoError(t, os.Truncate(path, 100))
	_, err = m.Query(context.Background())
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorIs(t, m.Check(), ErrCorrupt)
	_, err = Open(path, nil)
	require.ErrorIs(t, err, ErrCorrupt)
	// The bell loop keeps reading the mapping in the background (its safety
	// scan, every 100 ms): two more rounds of it must not fault the process.
	done := m.loops.Load()
	require.Eventually(t, func() bool { return m.loops.Load() >= done+2 }, eventually, time.Millisecond,
		"the bell loop stopped after the truncation")
}
