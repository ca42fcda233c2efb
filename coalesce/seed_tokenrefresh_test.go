package coalesce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/proctest"
	"github.com/shmlocks/shmlocks/manager"
)

// The cross-process token refresh of seed 001 (001_5328c2199c867afb.txt):
// several processes (browser tabs there) whose goroutines call an API with
// an access token; when it expires they all get 401 at once and must
// refresh it. The refresh token is single-use: spent twice, the session
// ends (the user is logged out). Requests must not run while the refresh
// does.
//
//	API call:  Request(shared "api") { call with the stored access token }
//	on 401:    Do("token-refresh", fn) — one caller's fn runs, in one
//	           process, for all callers that overlap, in every process:
//	             fn: Request(exclusive "api") {       // waits for calls in flight,
//	                   stored token still the one     // and calls wait for it
//	                   that failed? refresh it, store both new tokens
//	                   else: someone refreshed meanwhile: use the stored one }
//	then retry the call with the token Do returned.
//
// The "server" and the shared storage (localStorage there) are files; the
// server counts refreshes in a file of its own and records a reused refresh
// token as a logout.

type tokenPair struct {
	Access, Refresh string
	Expired         bool
}

func readTokens(path string) tokenPair {
	var t tokenPair
	b, err := os.ReadFile(path)
	if err == nil {
		json.Unmarshal(b, &t)
	}
	return t
}

func writeTokens(path string, t tokenPair) error {
	b, _ := json.Marshal(t)
	tmp := fmt.Sprintf("%s.%d.%d", path, os.Getpid(), time.Now().UnixNano())
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// tokenServer is the auth server of the scenario.
type tokenServer struct{ dir string }

func (s tokenServer) state() string { return filepath.Join(s.dir, "server.json") }

// call is an API call: 200 (true) or 401.
func (s tokenServer) call(access string) bool {
	t := readTokens(s.state())
	if t.Expired || t.Access != access {
		appendLine(filepath.Join(s.dir, "unauthorized"), "401 "+access)
		return false
	}
	return true
}

// unauthorized returns how many calls the server has answered with a 401.
func (s tokenServer) unauthorized() int {
	b, _ := os.ReadFile(filepath.Join(s.dir, "unauthorized"))
	return strings.Count(string(b), "\n")
}

var errLoggedOut = errors.New("refresh token already used: logged out")

// refresh spends refresh token rt (single use) for a new pair.
func (s tokenServer) refresh(rt string) (tokenPair, error) {
	t := readTokens(s.state())
	if rt != t.Refresh {
		appendLine(filepath.Join(s.dir, "events"), "loggedout "+rt)
		return tokenPair{}, errLoggedOut
	}
	var n int
	fmt.Sscanf(t.Refresh, "r%d", &n)
	nt := tokenPair{Access: fmt.Sprintf("a%d", n+1), Refresh: fmt.Sprintf("r%d", n+1)}
	if err := writeTokens(s.state(), nt); err != nil {
		return tokenPair{}, err
	}
	appendLine(filepath.Join(s.dir, "refreshes"), fmt.Sprintf("refresh %s -> %s by %d", rt, nt.Refresh, os.Getpid()))
	return nt, nil
}

// apiClient is one process's client of the scenario.
type apiClient struct {
	m   *manager.Manager
	g   *Group
	srv tokenServer
	// want401: the 401s the server will have answered once every call of
	// this round met one. A flight's fn waits for them (bounded) before
	// it refreshes, so that the round's callers overlap with it however
	// the machine schedules them: the test is about coalescing them.
	want401 int
}

func (c apiClient) store() string { return filepath.Join(c.srv.dir, "store.json") }

// do makes one API call, refreshing the token on a 401; it reports whether
// it met a 401 and whether its own fn ran the refresh flight.
func (c apiClient) do(ctx context.Context) (got401, ranFn bool, err error) {
	var tok string
	var ok bool
	call := func(access string) error {
		return c.m.Request(ctx, "api", manager.RequestOptions{Mode: manager.Shared}, func(context.Context, *manager.Lock) error {
			if access == "" {
				access = readTokens(c.store()).Access
			}
			tok, ok = access, c.srv.call(access)
			return nil
		})
	}
	if err := call(""); err != nil || ok {
		return false, false, err
	}
	res, _, err := c.g.Do(ctx, "token-refresh", func(ctx context.Context) ([]byte, error) {
		ranFn = true
		for deadline := time.Now().Add(10 * time.Second); c.srv.unauthorized() < c.want401 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		var access string
		err := c.m.Request(ctx, "api", manager.RequestOptions{}, func(context.Context, *manager.Lock) error {
			st := readTokens(c.store())
			if st.Access != tok {
				access = st.Access // refreshed while we waited for the lock
				return nil
			}
			nt, err := c.srv.refresh(st.Refresh)
			if err != nil {
				return err
			}
			access = nt.Access
			return writeTokens(c.store(), nt)
		})
		return []byte(access), err
	})
	if err != nil {
		return true, ranFn, err
	}
	if err := call(string(res)); err != nil {
		return true, ranFn, err
	}
	if !ok {
		return true, ranFn, fmt.Errorf("401 again with the refreshed token %q", res)
	}
	return true, ranFn, nil
}

// childRefreshRound runs "refreshround K G DIR WANT401" in a child: G
// goroutines make one API call each -> "refreshdone K n401=N fnruns=F
// failed=E".
func childRefreshRound(grp *Group, m *manager.Manager, f []string) {
	k, dir := f[1], f[3]
	var g, want int
	fmt.Sscan(f[2], &g)
	fmt.Sscan(f[4], &want)
	go func() {
		c := apiClient{m: m, g: grp, srv: tokenServer{dir: dir}, want401: want}
		var resMu sync.Mutex
		n401, runs, failed := 0, 0, 0
		var wg sync.WaitGroup
		for i := 0; i < g; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				got, ran, err := c.do(ctx)
				resMu.Lock()
				defer resMu.Unlock()
				if got {
					n401++
				}
				if ran {
					runs++
				}
				if err != nil {
					failed++
					say("refreshfail %v", err)
				}
			}()
		}
		wg.Wait()
		say("refreshdone %s n401=%d fnruns=%d failed=%d", k, n401, runs, failed)
	}()
}

// Three processes x 8 goroutines; the access token expires 5 times: the
// refresh runs exactly once per expiry, nobody is logged out, every call
// succeeds, and the refresh flights ran fn fewer times than calls met a 401.
func TestSeedTokenRefresh(t *testing.T) {
	procs, goroutines, expiries := 3, 8, 5
	path := tablePath(t)
	m := openM(t, path)
	dir := t.TempDir()
	srv := tokenServer{dir: dir}
	require.NoError(t, writeTokens(srv.state(), tokenPair{Access: "a0", Refresh: "r0"}))
	require.NoError(t, writeTokens(filepath.Join(dir, "store.json"), tokenPair{Access: "a0", Refresh: "r0"}))
	var cs []*proctest.Child
	for i := 0; i < procs; i++ {
		cs = append(cs, spawn(t, path))
	}
	total401, totalRuns := 0, 0
	for k := 1; k <= expiries; k++ {
		st := readTokens(srv.state())
		st.Expired = true // the access token expires
		require.NoError(t, writeTokens(srv.state(), st))
		for _, c := range cs {
			c.Send("refreshround %d %d %s %d", k, goroutines, dir, k*procs*goroutines)
		}
		for _, c := range cs {
			f := parseFields(c.Expect(fmt.Sprintf("refreshdone %d", k)))
			require.Equal(t, "0", f["failed"], "child %d round %d", c.Pid, k)
			total401 += atoi(f["n401"])
			totalRuns += atoi(f["fnruns"])
		}
		require.Len(t, counterLines(t, filepath.Join(dir, "refreshes"), "refresh"), k, "one refresh per expiry")
	}
	require.Empty(t, counterLines(t, filepath.Join(dir, "events"), "loggedout"), "a refresh token spent twice")
	require.Equal(t, expiries*procs*goroutines, total401, "every call of a round met the expired token")
	require.Less(t, totalRuns, total401, "coalesced: fewer refresh flights than 401s")
	t.Logf("%d expiries: %d calls met a 401, %d ran the flight's fn, %d refreshes", expiries, total401, totalRuns, expiries)
	checkAll(t, m)
}
