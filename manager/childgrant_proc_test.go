package manager_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

// Child-side command of the child grant tests (see proc_test.go for the
// protocol):
//
//	kids NAME N  -> Request(NAME): "holding NAME TOKEN"; then N goroutines
//	                make exclusive child requests with fn's ctx: the first
//	                in says "inkid NAME TOKEN" and stays inside; once the
//	                other N-1 wait: "kidswaiting NAME N-1". Nothing returns
//	                (the test kills us).
func childGrantCommand(m *Manager, f []string) {
	switch f[0] {
	case "kids":
		name := f[1]
		n, _ := strconv.Atoi(f[2])
		go func() {
			err := m.Request(context.Background(), name, RequestOptions{}, func(c context.Context, l *Lock) error {
				say("holding %s %d", name, l.Token())
				for i := 0; i < n; i++ {
					go m.Request(c, name, RequestOptions{}, func(_ context.Context, kid *Lock) error {
						say("inkid %s %d", name, kid.Token())
						select {}
					})
				}
				for deadline := time.Now().Add(eventually); KidsWaiting(l) != n-1; time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						say("error %s %d children waiting, want %d", name, KidsWaiting(l), n-1)
						return nil
					}
				}
				say("kidswaiting %s %d", name, n-1)
				select {}
			})
			say("error %s %v", name, err)
		}()
	}
}

// A process SIGKILLed inside a child grant, with more children waiting:
// the survivors get the name as after any death, one at a time.
//
//	Q: kids x 3      -> holds x; one child inside; two children wait
//	P: acquire x     -> blocks
//	R: acquire x     -> blocks, queued after P
//	Q is SIGKILLed   -> P granted (a new token); R still blocked; x held once
//	P releases x     -> R granted
func TestChildGrantHolderKilled(t *testing.T) {
	path := tablePath(t)
	m := openM(t, path, nil)
	q := spawn(t, path, nil)
	q.Send("kids x 3")
	tok := tokenOf(q.Expect("holding x"))
	require.Equal(t, tok, tokenOf(q.Expect("inkid x")), "a child has its grant's token")
	q.Expect("kidswaiting x 2")
	require.Equal(t, 1, heldCount(t, m, "x"), "children hold nothing in the table")

	ctx := ctxT(t, eventually)
	p := acquireAsync(ctx, m, "x", RequestOptions{})
	waitPending(t, m, "x", 1)
	r := spawn(t, path, nil)
	r.Send("acquire x")
	waitPending(t, m, "x", 2)
	mustBlock(t, p, "P while Q and its children hold x")

	q.Kill()
	l := mustGrant(t, p, "P after Q was killed inside a child grant")
	require.Greater(t, l.Token(), tok)
	r.Quiet("acquired x", quietPeriod)
	s, err := m.Query(ctx)
	require.NoError(t, err)
	var holders []LockInfo
	for _, h := range s.Held {
		if h.Name == "x" {
			holders = append(holders, h)
		}
	}
	require.Len(t, holders, 1, "x held once: %+v", s.Held)
	require.Equal(t, m.ClientID(), holders[0].ClientID)
	check(t, m)
	require.NoError(t, l.Release())
	require.Greater(t, tokenOf(r.Expect("acquired x")), l.Token())
	r.Send("release x")
	r.Expect("released x")
	check(t, m)
}
