//go:build linux

package bench

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/manager"
)

// BenchmarkLongWait: this process holds a name for 1 s while a child process
// waits for it; the child measures its own CPU time (getrusage RUSAGE_SELF:
// every thread, the Manager's background goroutines included) from the
// request to the grant. Reported: that CPU time as a percentage of one CPU
// over the wait, and the wait's wall time.
func BenchmarkLongWait(b *testing.B) {
	const hold = time.Second
	var pct, wallMS float64
	for i := 0; i < b.N; i++ {
		dir := b.TempDir()
		path := filepath.Join(dir, "long.tbl")
		ctlPath := filepath.Join(dir, "ctl")
		require.NoError(b, os.WriteFile(ctlPath, make([]byte, ctlSize), 0o600))
		m, err := manager.Open(path, nil)
		require.NoError(b, err)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		l, err := m.Acquire(ctx, "long", manager.RequestOptions{})
		require.NoError(b, err)
		c := startBenchChild(b, "longwait", ctlPath, benchArgs{Kind: kindShm, Table: path, Name: "long", Limit: 30 * time.Second}, -1)
		c.Send("wait")
		waitPending(b, m, "long", 1)
		time.Sleep(hold)
		require.NoError(b, l.Release())
		f := strings.Fields(c.Expect("waited"))
		wall, _ := strconv.ParseFloat(f[1], 64)
		cpu, _ := strconv.ParseFloat(f[2], 64)
		pct, wallMS = 100*cpu/wall, wall/1e6
		c.Wait()
		cancel()
		m.Close()
	}
	b.ReportMetric(pct, "cpu%")
	b.ReportMetric(wallMS, "wait-ms")
}
