package manager_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/table"

	. "github.com/shmlocks/shmlocks/manager"
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
	// The queued request's deadline is armed only after l1's release below:
	// one armed here could pass, on a busy machine, before the request is
	// even queued, and waitPending would then wait in vain.
	qctx, qcancel := context.WithTimeout(ctx, eventually)
	defer qcancel()
	queued := acquireAsync(qctx, m1, "a", RequestOptions{Mode: Shared})
	waitPending(t, m1, "a", 1)
	watched := waitUnlockedAsync(qctx, m1, "a", Exclusive) // a watch list in the file
	watchingCount(t, m1, 1)

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
		m2.State(opctx, "a")
		m2.WaitUnlocked(opctx, "a", Shared)
		m2.Check()
		m2.Close()
	} else if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrTableFull) {
		t.Fatalf("Open of a corrupted table: %v", err)
	}
	m1.Check()
	l1.Release()
	abort := time.AfterFunc(200*time.Millisecond, qcancel) // granted by then, or aborted
	if r := <-queued; r.Lock != nil {
		r.Lock.Release()
	}
	abort.Stop()
	<-watched
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
	skipFaultsUnderRace(t)
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
	done := BellLoops(m)
	require.Eventually(t, func() bool { return BellLoops(m) >= done+2 }, eventually, time.Millisecond,
		"the bell loop stopped after the truncation")
}

// Every operation of Managers whose file is truncated under them reports
// ErrCorrupt instead of dying of SIGBUS: the fast path and the latched path
// of Acquire, Request, a request parked in the queue at that moment,
// Release of fast and latched holds, Lost, a WaitUnlocked and a Watch
// parked at that moment, State, and Close (which must not wait
// for an operation the fault unwound). To 0 bytes every read faults; to
// 100 bytes the first page still reads (as zeros past the end).
func TestTruncatedUnderUsOperations(t *testing.T) {
	skipFaultsUnderRace(t)
	for _, size := range []int64{0, 100} {
		t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) {
			old := table.LatchGiveUp
			table.LatchGiveUp = 50 * time.Millisecond
			defer func() { table.LatchGiveUp = old }()
			path := tablePath(t)
			m := openM(t, path, &OpenOptions{})
			m2 := openM(t, path, &OpenOptions{})
			ctx, cancel := context.WithTimeout(context.Background(), eventually)
			defer cancel()

			fast, err := m.Acquire(ctx, "fast", RequestOptions{}) // a fast hold
			require.NoError(t, err)
			shared, err := m.Acquire(ctx, "shared", RequestOptions{Mode: Shared}) // a latched hold
			require.NoError(t, err)
			busy, err := m2.Acquire(ctx, "busy", RequestOptions{})
			require.NoError(t, err)
			parked := make(chan error, 1)
			go func() {
				l, err := m.Acquire(ctx, "busy", RequestOptions{})
				if err == nil {
					l.Release()
				}
				parked <- err
			}()
			require.Eventually(t, func() bool {
				s, err := m.Query(ctx)
				return err == nil && len(s.Pending) == 1
			}, eventually, time.Millisecond, "the request on busy never queued")
			unlockedErr := waitUnlockedAsync(ctx, m, "busy", Shared) // a watch parked at the truncation
			feed, err := m.Watch(ctx, "busy")
			require.NoError(t, err)
			<-feed
			watchingCount(t, m, 2)

			require.NoError(t, os.Truncate(path, size))

			select {
			case err := <-parked:
				require.ErrorIs(t, err, ErrCorrupt, "the request queued at the truncation")
			case <-ctx.Done():
				t.Fatal("the request queued at the truncation did not return")
			}
			select {
			case err := <-unlockedErr:
				require.ErrorIs(t, err, ErrCorrupt, "the WaitUnlocked parked at the truncation")
			case <-ctx.Done():
				t.Fatal("the WaitUnlocked parked at the truncation did not return")
			}
			for range feed { // closes: the watch met the fault
			}
			_, err = m.State(ctx, "busy")
			require.ErrorIs(t, err, ErrCorrupt)
			require.ErrorIs(t, m.WaitUnlocked(ctx, "busy", Exclusive), ErrCorrupt)
			_, err = m.Watch(ctx, "fresh-name")
			require.ErrorIs(t, err, ErrCorrupt)
			for _, o := range []RequestOptions{{}, {IfAvailable: true}, {Steal: true}, {Mode: Shared}} {
				for _, name := range []string{"fast", "fresh-name"} {
					_, err := m.Acquire(ctx, name, o)
					require.ErrorIs(t, err, ErrCorrupt, "Acquire %q %+v", name, o)
				}
			}
			called := false
			err = m2.Request(ctx, "fresh-name", RequestOptions{}, func(context.Context, *Lock) error {
				called = true
				return nil
			})
			require.ErrorIs(t, err, ErrCorrupt)
			require.False(t, called, "Request ran its callback without a grant")
			_ = fast.Lost() // reads the table to register: must not fault
			for _, l := range []*Lock{fast, shared, busy} {
				require.ErrorIs(t, l.Release(), ErrCorrupt, "Release %q", l.Name())
				// The table could not be updated: the Lock is still held
				// as far as its holder knows, and says so again.
				require.ErrorIs(t, l.Release(), ErrCorrupt, "second Release %q", l.Name())
			}
			_, err = m.Query(ctx)
			require.ErrorIs(t, err, ErrCorrupt)
			for _, mm := range []*Manager{m, m2} {
				closed := make(chan error, 1)
				go func() { closed <- mm.Close() }()
				select {
				case <-closed:
				case <-ctx.Done():
					t.Fatal("Close did not return after the truncation")
				}
			}
		})
	}
}
