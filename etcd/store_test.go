package etcd

import (
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/shmlocks/shmlocks/internal/seam"
	"github.com/shmlocks/shmlocks/manager"
)

// TestStore: the record store of a feature (seam.Store) on etcd. A record
// is published only while the writer's grant is held (a stolen grant:
// ErrStolen, nothing written; a closed Manager: ErrClosed); PublishRelease
// also releases the grant, and the Release that follows returns nil
// without asking etcd, also when the transaction's answer was lost (the
// release finds its own delete in the key's history, not a steal); Load
// cuts a long record to max+1 bytes; Range reads every record and reports
// a key that is not a store key; Query never sees the records.
func TestStore(t *testing.T) {
	c := startCluster(t, 1)
	ctx := ctxT(t, 30*time.Second)
	admin := c.client(t)
	cli := c.client(t)
	fkv := newFaultKV(cli)
	m, b := openOn(t, cli, "/store", &Options{CallTimeout: time.Second})
	other, _ := openOn(t, c.client(t), "/store", nil)

	if _, err := b.Store("Bad/"); !errors.Is(err, manager.ErrNotSupported) {
		t.Fatalf("Store(Bad/): %v, want ErrNotSupported", err)
	}
	st, err := b.Store("feat")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Load("k1", 100); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load of no record: %v, want fs.ErrNotExist", err)
	}
	l, err := m.Acquire(ctx, "n", manager.RequestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Publish(l, "k1", []byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	if rec, err := st.Load("k1", 100); err != nil || string(rec) != "0123456789" {
		t.Fatalf("Load: %q %v", rec, err)
	}
	if rec, err := st.Load("k1", 4); err != nil || string(rec) != "01234" {
		t.Fatalf("Load cut to max+1: %q %v", rec, err)
	}
	snap, err := other.Query(ctx)
	if err != nil || len(snap.Held) != 1 || snap.Held[0].Name != "n" || len(snap.Pending) != 0 {
		t.Fatalf("Query with a record under the prefix: %+v %v", snap, err)
	}

	// Stolen: nothing is written.
	s, err := other.Acquire(ctx, "n", manager.RequestOptions{Steal: true})
	if err != nil {
		t.Fatal(err)
	}
	waitClosed(t, l.Lost(), "Lost of the stolen grant")
	if err := st.Publish(l, "k1", []byte("stale")); !errors.Is(err, manager.ErrStolen) {
		t.Fatalf("Publish of a stolen grant: %v, want ErrStolen", err)
	}
	if rec, _ := st.Load("k1", 100); string(rec) != "0123456789" {
		t.Fatalf("the record after a refused Publish: %q", rec)
	}
	l.Release()
	s.Release()

	// PublishRelease: the grant is gone with the publish; the next request
	// is granted; Release returns nil. Then the same with the answer lost,
	// and with the transaction failed before it reached etcd.
	for _, f := range []fault{pass, failAfter, failBefore} {
		l, err := m.Acquire(ctx, "n", manager.RequestOptions{})
		if err != nil {
			t.Fatal(err)
		}
		next := make(chan error, 1)
		go func() {
			nl, err := other.Acquire(ctx, "n", manager.RequestOptions{})
			if err == nil {
				err = nl.Release()
			}
			next <- err
		}()
		waitPendingOn(t, other, "n", 1)
		fired := false
		fkv.setRule(func(tx *txnCall) fault {
			if !fired && len(tx.then) == 2 && tx.then[0].IsPut() && tx.then[1].IsDelete() {
				fired = true
				return f
			}
			return pass
		})
		rec := fmt.Sprintf("rec%d", f)
		err = st.(seam.PublishReleaser).PublishRelease(l, "k2", []byte(rec))
		fkv.setRule(nil)
		if (f == pass) != (err == nil) {
			t.Fatalf("fault %d: PublishRelease: %v", f, err)
		}
		calls := fkv.reads.Load()
		if err := l.Release(); err != nil {
			t.Fatalf("fault %d: Release after PublishRelease: %v, want nil (our own delete)", f, err)
		}
		if n := fkv.reads.Load() - calls; f == pass && n != 0 {
			t.Fatalf("Release after a PublishRelease made %d calls", n)
		}
		select {
		case err := <-next:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("fault %d: the next request was not granted", f)
		}
		if f == failBefore {
			rec = fmt.Sprintf("rec%d", failAfter) // not applied: the last round's record stays
		}
		if got, err := st.Load("k2", 100); err != nil || string(got) != rec {
			t.Fatalf("fault %d: the record: %q %v, want %q", f, got, err, rec)
		}
	}

	// Range: every record, and a stray key reported.
	if _, err := admin.Put(ctx, "/store/"+storeDir+"feat/bad key", "x"); err != nil {
		t.Fatal(err)
	}
	var keys []string
	err = st.Range(100, func(k string, rec []byte) error {
		keys = append(keys, k)
		return nil
	})
	sort.Strings(keys)
	if strings.Join(keys, ",") != "k1,k2" || err == nil || !strings.Contains(err.Error(), "unexpected key") {
		t.Fatalf("Range: %q %v", keys, err)
	}

	// A closed Manager publishes nothing.
	l, err = m.Acquire(ctx, "n", manager.RequestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if err := st.Publish(l, "k1", []byte("late")); !errors.Is(err, manager.ErrClosed) {
		t.Fatalf("Publish after Close: %v, want ErrClosed", err)
	}
}

// waitPendingOn waits until m's Query shows k pending requests on name.
func waitPendingOn(t *testing.T, m *manager.Manager, name string, k int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		snap, err := m.Query(ctxT(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, p := range snap.Pending {
			if p.Name == name {
				n++
			}
		}
		if n == k {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pending on %q, want %d", n, name, k)
		}
		time.Sleep(time.Millisecond)
	}
}
