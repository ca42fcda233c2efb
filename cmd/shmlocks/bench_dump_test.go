package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/table"
)

// BenchmarkDump10k: with 10,000 locks held, what `shmlocks dump` costs on
// its read-only mapping: reading the state (gatherDump: Snapshot, agents,
// the wait-for graph, /proc for the commands) and rendering it as the
// plain view or as --json.
func BenchmarkDump10k(b *testing.B) {
	const held = 10_000
	path := filepath.Join(b.TempDir(), "dump.tbl")
	opts := &manager.OpenOptions{MaxResources: 16384, MaxRequests: 32768, MaxAgents: 16, MaxNameLen: 64}
	holder, err := manager.Open(path, opts)
	require.NoError(b, err)
	defer holder.Close()
	ctx := context.Background()
	for i := 0; i < held; i++ {
		_, err := holder.Acquire(ctx, fmt.Sprintf("held/%05d", i), manager.RequestOptions{Mode: manager.Mode(i % 2)})
		require.NoError(b, err)
	}
	ro, err := table.OpenReadOnly(path)
	require.NoError(b, err)
	defer ro.Close()
	now := time.Now()
	b.Run("Gather", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if st, err := gatherDump(ro, path, now); err != nil || len(st.Held) != held {
				b.Fatal(err)
			}
		}
	})
	st, err := gatherDump(ro, path, now)
	require.NoError(b, err)
	b.Run("Plain", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := renderDump(io.Discard, st, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("JSON", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := writeDumpJSON(io.Discard, st, false); err != nil {
				b.Fatal(err)
			}
		}
	})
}
