// Command tokenrefresh is seed 001's cross-tab token refresh, with processes
// for browser tabs: several processes call an API with a shared access
// token; when it expires they all get 401 at once, and the refresh token
// that renews it is single-use: spent twice, the session ends.
//
//   - A call first waits until no refresh is running (WaitUnlocked on
//     "auth": the seed's waitForUnlock), without taking anything.
//   - On 401, every caller asks coalesce.Group.Do("token-refresh", refresh):
//     one caller, in one process, runs refresh for all the callers that
//     overlap in time, in every process; the others get its result.
//   - refresh holds "auth" (so calls wait), re-reads the stored token first
//     (a caller that came after a refresh finished finds a new token there
//     and spends nothing), and stores the new pair itself before it
//     returns. That order is what makes a single-use token safe with
//     Coalesce: if the leader dies after storing the pair but before Do
//     published its result, the caller that leads next re-reads the new
//     pair and does not spend the old refresh token again.
//
// The auth server is an HTTP server in the parent process, on loopback; it
// expires the access token after every 10th call and counts refreshes and
// logouts (a refresh token presented twice). The run prints them: as many
// refreshes as expiries, and no logout.
//
//	go run ./examples/tokenrefresh
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/shmlocks/shmlocks/coalesce"
	"github.com/shmlocks/shmlocks/manager"
)

const (
	procs       = 4  // "tabs"
	goroutines  = 2  // concurrent calls per tab
	callsEach   = 10 // successful calls per goroutine
	expireEvery = 10 // the server expires the access token after this many calls
	roleEnv     = "TOKENREFRESH_TAB"
	totalCalls  = procs * goroutines * callsEach
)

type tokens struct{ Access, Refresh string }

func main() {
	var err error
	if os.Getenv(roleEnv) != "" {
		err = tab(os.Args[1], os.Args[2])
	} else {
		err = run()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tokenrefresh:", err)
		os.Exit(1)
	}
}

// server is the auth server: one valid access token at a time.
type server struct {
	mu                      sync.Mutex
	gen                     int // the current pair is "a<gen>", "r<gen>"
	expired                 bool
	calls, expiries         int
	refreshes, logouts, bad int
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch r.URL.Path {
	case "/api":
		if s.expired || r.Header.Get("Authorization") != "a"+strconv.Itoa(s.gen) {
			http.Error(w, "token expired", http.StatusUnauthorized)
			return
		}
		s.calls++
		if s.calls%expireEvery == 0 && s.calls < totalCalls {
			s.expired = true
			s.expiries++
		}
	case "/refresh":
		if r.Header.Get("Authorization") != "r"+strconv.Itoa(s.gen) {
			s.logouts++ // a spent refresh token: the session ends
			http.Error(w, "refresh token already used: logged out", http.StatusForbidden)
			return
		}
		s.gen++
		s.expired = false
		s.refreshes++
		json.NewEncoder(w).Encode(tokens{"a" + strconv.Itoa(s.gen), "r" + strconv.Itoa(s.gen)})
	default:
		http.NotFound(w, r)
	}
}

func run() error {
	dir, err := os.MkdirTemp("", "tokenrefresh-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &server{}
	go http.Serve(ln, srv)
	if err := store(dir, tokens{"a0", "r0"}); err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var cmds []*exec.Cmd
	for i := 0; i < procs; i++ {
		cmd := exec.CommandContext(ctx, exe, dir, "http://"+ln.Addr().String())
		cmd.Env = append(os.Environ(), roleEnv+"="+strconv.Itoa(i))
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		cmds = append(cmds, cmd)
	}
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			return err
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	fmt.Printf("%d tabs made %d calls; the token expired %d times and was refreshed %d times; logouts: %d\n",
		procs, srv.calls, srv.expiries, srv.refreshes, srv.logouts)
	if srv.refreshes != srv.expiries || srv.logouts != 0 {
		return errors.New("a refresh token was spent more than once")
	}
	return nil
}

// tab is one process: goroutines making calls, refreshing on 401.
func tab(dir, url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := manager.Open(filepath.Join(dir, "app.locks"), nil)
	if err != nil {
		return err
	}
	defer m.Close()
	g := coalesce.New(m)
	errs := make(chan error, goroutines)
	for i := 0; i < goroutines; i++ {
		go func() { errs <- calls(ctx, m, g, dir, url) }()
	}
	for i := 0; i < goroutines; i++ {
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}

func calls(ctx context.Context, m *manager.Manager, g *coalesce.Group, dir, url string) error {
	for ok := 0; ok < callsEach; {
		// Do not call while a refresh runs (the seed's waitForUnlock).
		if err := m.WaitUnlocked(ctx, "auth", manager.Shared); err != nil {
			return err
		}
		tok, err := load(dir)
		if err != nil {
			return err
		}
		status, err := post(ctx, url+"/api", tok.Access, nil)
		if err != nil {
			return err
		}
		if status == http.StatusOK {
			ok++
			continue
		}
		// 401: one refresh for every caller that overlaps, in every tab.
		_, _, err = g.Do(ctx, "token-refresh", func(ctx context.Context) ([]byte, error) {
			return nil, refresh(ctx, m, dir, url, tok.Access)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// refresh renews the pair if failed is still the stored access token.
func refresh(ctx context.Context, m *manager.Manager, dir, url, failed string) error {
	return m.Request(ctx, "auth", manager.RequestOptions{}, func(ctx context.Context, _ *manager.Lock) error {
		cur, err := load(dir)
		if err != nil {
			return err
		}
		if cur.Access != failed {
			return nil // renewed since our call failed: nothing to spend
		}
		var next tokens
		status, err := post(ctx, url+"/refresh", cur.Refresh, &next)
		if err != nil {
			return err
		}
		if status != http.StatusOK {
			return fmt.Errorf("refresh: HTTP %d", status)
		}
		return store(dir, next) // before Do publishes: see the package comment
	})
}

func post(ctx context.Context, url, auth string, out any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", auth)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode == http.StatusOK {
		err = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode, err
}

// The token store every tab shares (localStorage in the seed): a file,
// replaced whole by rename.
func load(dir string) (tokens, error) {
	var t tokens
	b, err := os.ReadFile(filepath.Join(dir, "tokens.json"))
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	return t, err
}

func store(dir string, t tokens) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, fmt.Sprintf("tokens.%d.tmp", os.Getpid()))
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "tokens.json"))
}
