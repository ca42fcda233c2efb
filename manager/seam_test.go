package manager_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/seam"

	. "github.com/shmlocks/shmlocks/manager"
)

// What the Manager hands the packages built on it (internal/seam): reserved
// names only from a marked ctx; a table store whose Publish writes only
// while its lock is held by a live Manager; ErrNotSupported on a backend
// without a store, ErrClosed once closed or for a zero Manager.
func TestSeamTable(t *testing.T) {
	path := tablePath(t)
	m, m2 := openM(t, path, nil), openM(t, path, nil)
	ctx := ctxT(t, eventually)

	_, err := m.Acquire(ctx, "-r", RequestOptions{})
	require.ErrorIs(t, err, ErrNotSupported)
	l, err := m.Acquire(seam.Reserved(ctx), "-r", RequestOptions{})
	require.NoError(t, err)
	require.NoError(t, l.Release())

	b, err := seam.Open(m, "feat")
	require.NoError(t, err)
	require.Equal(t, smallTable.MaxNameLen, b.MaxNameLen)
	require.ErrorIs(t, b.Validate(ctx, "-r"), ErrNotSupported)
	require.NoError(t, b.Validate(ctx, "r"))
	st := b.Store
	_, err = st.Load("k", 100)
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.NoError(t, st.Range(100, func(string, []byte) error { return errors.New("no record yet") }))

	l = mustGrant(t, acquireAsync(ctx, m, "guard", RequestOptions{}), "guard")
	require.NoError(t, st.Publish(l, "k", []byte("one")))
	rec, err := st.Load("k", 100)
	require.NoError(t, err)
	require.Equal(t, "one", string(rec))
	rec, err = st.Load("k", 1)
	require.NoError(t, err)
	require.Equal(t, "on", string(rec), "cut to max+1")
	require.Error(t, st.Publish(l, "../k", []byte("x")), "a key that is not a file name")

	// Another Manager's Lock, or a lost one, publishes nothing.
	s, err := m2.Acquire(ctx, "guard", RequestOptions{Steal: true})
	require.NoError(t, err)
	require.ErrorIs(t, st.Publish(s, "k", []byte("m2's")), ErrNotSupported)
	require.ErrorIs(t, st.Publish(l, "k", []byte("two")), ErrStolen)
	require.NoError(t, s.Release())
	l = mustGrant(t, acquireAsync(ctx, m, "guard", RequestOptions{}), "guard")
	require.NoError(t, l.Release())
	require.ErrorIs(t, st.Publish(l, "k", []byte("two")), ErrReleased)
	l = mustGrant(t, acquireAsync(ctx, m, "guard", RequestOptions{}), "guard")
	require.NoError(t, m.Close())
	require.ErrorIs(t, st.Publish(l, "k", []byte("two")), ErrClosed)
	rec, err = st.Load("k", 100)
	require.NoError(t, err)
	require.Equal(t, "one", string(rec), "no write without the lock")
	temps, _ := filepath.Glob(filepath.Join(path+".feat", "*"+seam.TempInfix+"*"))
	require.Empty(t, temps, "a refused write leaves no temporary file")

	var keys []string
	require.NoError(t, st.Range(100, func(k string, rec []byte) error { keys = append(keys, k+"="+string(rec)); return nil }))
	require.Equal(t, []string{"k=one"}, keys)
	require.NoError(t, os.WriteFile(filepath.Join(path+".feat", "junk"), nil, 0o600))
	require.ErrorContains(t, st.Range(100, func(string, []byte) error { return nil }), "unexpected file")

	_, err = seam.Open(m, "feat")
	require.ErrorIs(t, err, ErrClosed)
	_, err = seam.Open(&Manager{}, "feat")
	require.ErrorIs(t, err, ErrClosed)
	_, err = seam.Open((*Manager)(nil), "feat")
	require.ErrorIs(t, err, ErrClosed)
}

func TestSeamBackend(t *testing.T) {
	m := NewBackendManager(newFake())
	_, err := seam.Open(m, "feat")
	require.ErrorIs(t, err, ErrNotSupported)
	require.ErrorContains(t, err, "feat")
	ps := &storeFake{fakeBackend: newFake(), store: &recordsFake{}}
	m = NewBackendManager(ps)
	b, err := seam.Open(m, "feat")
	require.NoError(t, err)
	require.Equal(t, "feat", ps.feature)
	require.Equal(t, seam.Store(ps.store), b.Store)
	require.Equal(t, 8, b.MaxNameLen)
	require.NoError(t, m.Close())
	_, err = seam.Open(m, "feat")
	require.ErrorIs(t, err, ErrClosed)
}

// storeFake is a backend with a record store (seam.StoreProvider).
type storeFake struct {
	*fakeBackend
	feature string
	store   *recordsFake
}

// recordsFake stands for a backend's store (nothing is called on it).
type recordsFake struct{ seam.Store }

func (f *storeFake) Store(feature string) (seam.Store, error) {
	f.feature = feature
	return f.store, nil
}
