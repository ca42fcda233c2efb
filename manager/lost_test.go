package manager_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

// Locks taken away by a steal, and the registry that tells their
// holders: Lost, the Request context, and Lock reuse across grants.

func TestRequestStolenCancelsCallback(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	inside := make(chan struct{})
	done := make(chan error, 1)
	fnErr := errors.New("callback saw cancellation")
	go func() {
		done <- m.Request(ctx, "s", RequestOptions{}, func(ctx context.Context, l *Lock) error {
			close(inside)
			<-ctx.Done()
			return fnErr
		})
	}()
	select {
	case <-inside:
	case <-ctx.Done():
		t.Fatal("callback never ran")
	}
	st, err := m.Acquire(ctx, "s", RequestOptions{Steal: true})
	require.NoError(t, err)
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrStolen)
		require.ErrorIs(t, err, fnErr)
	case <-ctx.Done():
		t.Fatal("Request did not return after its lock was stolen")
	}
	snap, err := m.Query(ctx)
	require.NoError(t, err)
	require.Len(t, snap.Held, 1, "the stealer's grant is untouched")
	check(t, m)
	require.NoError(t, st.Release())
}

// scanWithoutPause runs the bell loop's full scan back to back on another
// goroutine until the returned function is called (it waits for the scan).
func scanWithoutPause(m *Manager) (stop func()) {
	done := make(chan struct{})
	var scans sync.WaitGroup
	scans.Add(1)
	go func() {
		defer scans.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			ScanAll(m)
		}
	}()
	return func() {
		close(done)
		scans.Wait()
	}
}

// The bell loop's scan runs concurrently with Request recycling its Lock
// objects; it must never mark a live grant lost (a regression: a stale Lock
// pointer once made an uncontended Release report ErrStolen).
func TestScanNeverLosesRecycledLocks(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	stopScans := scanWithoutPause(m)
	var wg sync.WaitGroup
	n := 20000
	if raceEnabled {
		n = 3000
	}
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			fn := func(context.Context, *Lock) error { return nil }
			for i := 0; i < n; i++ {
				if err := m.Request(ctx, fmt.Sprint("r", g), RequestOptions{}, fn); err != nil {
					t.Errorf("Request: %v", err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	stopScans()
	check(t, m)
}

// Request recycles its Lock objects and releases an unregistered one without
// a CAS on its state word; a pooled Lock may have been registered with the
// bell loop in an earlier incarnation (its callback asked for Lost or the
// context's Done), or released by its callback. Mixed, with the bell loop
// scanning concurrently, no Request may fail and the table stays consistent.
func TestRequestReusesLocksAcrossRegistration(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	stopScans := scanWithoutPause(m)
	n := 3000
	if raceEnabled {
		n = 600
	}
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < n; i++ {
				kind := (i + g) % 3
				err := m.Request(ctx, fmt.Sprint("reuse", g%2), RequestOptions{}, func(fctx context.Context, l *Lock) error {
					switch kind {
					case 1: // registers l with the bell loop
						select {
						case <-l.Lost():
							return errors.New("lost while held")
						case <-fctx.Done():
							return errors.New("callback context done while held")
						default:
						}
					case 2: // releases l itself
						if err := l.Release(); err != nil {
							return err
						}
						if err := l.Release(); !errors.Is(err, ErrReleased) {
							return fmt.Errorf("second Release: %v", err)
						}
					}
					return nil
				})
				if err != nil {
					t.Errorf("Request %d (kind %d): %v", i, kind, err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	stopScans()
	check(t, m)
	for _, name := range []string{"reuse0", "reuse1"} {
		l, err := m.Acquire(ctx, name, RequestOptions{IfAvailable: true})
		require.NoError(t, err, "%s is left free", name)
		require.NoError(t, l.Release())
	}
}

// Lost and the Request context's Done, first called after the lock was
// already stolen, return closed channels (and do not deadlock).
func TestLostAfterTheFact(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	ctx := ctxT(t, eventually)
	done := make(chan error, 1)
	stolen := make(chan struct{})
	go func() {
		done <- m.Request(ctx, "late", RequestOptions{}, func(ctx context.Context, l *Lock) error {
			<-stolen
			<-ctx.Done() // first call after the steal
			<-l.Lost()
			return nil
		})
	}()
	waitHeld(t, m, "late")
	st, err := m.Acquire(ctx, "late", RequestOptions{Steal: true})
	require.NoError(t, err)
	close(stolen)
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrStolen)
	case <-ctx.Done():
		t.Fatal("callback never saw the steal")
	}
	require.NoError(t, st.Release())
	// Acquire form: Lost called late.
	l, err := m.Acquire(ctx, "late2", RequestOptions{})
	require.NoError(t, err)
	st, err = m.Acquire(ctx, "late2", RequestOptions{Steal: true})
	require.NoError(t, err)
	select {
	case <-l.Lost():
	case <-ctx.Done():
		t.Fatal("Lost called after the steal did not close")
	}
	require.ErrorIs(t, l.Release(), ErrStolen)
	require.NoError(t, st.Release())
	check(t, m)
}

func waitHeld(t testing.TB, m *Manager, name string) {
	deadline := time.Now().Add(eventually)
	for {
		s, err := m.Query(context.Background())
		require.NoError(t, err)
		for _, h := range s.Held {
			if h.Name == name {
				return
			}
		}
		require.True(t, time.Now().Before(deadline))
		time.Sleep(time.Millisecond)
	}
}
