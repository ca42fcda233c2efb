package manager

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The fixtures of the tests inside the package (the unit tests of
// unexported parts). They cannot import managertest, the kit of the other
// tests (which imports this package): these are its table and bounds.
const (
	quietPeriod = 150 * time.Millisecond // managertest.QuietPeriod
	eventually  = 10 * time.Second       // managertest.Eventually
)

var smallTable = &OpenOptions{MaxResources: 64, MaxRequests: 256, MaxAgents: 32, MaxNameLen: 64}

func tablePath(t testing.TB) string { return filepath.Join(t.TempDir(), "locks.tbl") }

// openM opens a Manager on path (opts nil: smallTable), closed at cleanup.
func openM(t testing.TB, path string, opts *OpenOptions) *Manager {
	t.Helper()
	if opts == nil {
		opts = smallTable
	}
	m, err := Open(path, opts)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

// ctxT is a context that ends after d, or at t's cleanup.
func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// check runs the invariant checker on the live table.
func check(t testing.TB, m *Manager) {
	t.Helper()
	require.NoError(t, m.Check())
}

// acquireReleased acquires name (exclusive) with m in a goroutine and
// releases it at once; the outcome comes on the channel.
func acquireReleased(ctx context.Context, m *Manager, name string) <-chan error {
	done := make(chan error, 1)
	go func() {
		l, err := m.Acquire(ctx, name, RequestOptions{})
		if err == nil {
			err = l.Release()
		}
		done <- err
	}()
	return done
}

// mustDone waits for done's outcome until ctx ends, and requires no error.
func mustDone(t testing.TB, ctx context.Context, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		require.NoError(t, err, what)
	case <-ctx.Done():
		t.Fatalf("%s: no outcome before %v", what, ctx.Err())
	}
}
