//go:build unix

package main

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/manager"
)

// startServe runs `shmlocks serve` on a loopback port chosen by the kernel
// and returns the metrics URL; the server is stopped with SIGTERM (and must
// exit 0) at cleanup.
func startServe(t *testing.T, args ...string) string {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	cmd := exec.CommandContext(ctx, binary, append([]string{"serve", "--metrics", "127.0.0.1:0"}, args...)...)
	cmd.Env = cleanEnv()
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	m := regexp.MustCompile(`metrics on (http://127\.0\.0\.1:[0-9]+/metrics)`).FindStringSubmatch(line)
	require.NotNil(t, m, "first line: %q", line)
	t.Cleanup(func() {
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, cmd.Wait(), "SIGTERM stops serve with status 0")
	})
	return m[1]
}

// scrape GETs url (bounded) and returns the body.
func scrape(t *testing.T, url string) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/plain; version=0.0.4; charset=utf-8", resp.Header.Get("Content-Type"))
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// A real scrape over loopback of a live table: the held and pending
// requests of this process's two agents, by name, with the limits.
func TestServeMetrics(t *testing.T) {
	path, _, _ := liveTable(t)
	url := startServe(t, "--table", path)
	body := scrape(t, url)
	for _, line := range []string{
		"shmlocks_table_up 1",
		"shmlocks_table_agents 2",
		"shmlocks_table_agents_dead 0",
		`shmlocks_table_requests{state="held"} 2`,
		`shmlocks_table_requests{state="waiting"} 1`,
		"shmlocks_table_names_limit 4096",
		`shmlocks_lock_holders{name="jobs",mode="exclusive"} 1`,
		`shmlocks_lock_holders{name="config",mode="shared"} 1`,
		`shmlocks_lock_waiting{name="jobs",mode="shared"} 1`,
	} {
		require.Contains(t, body, "\n"+line+"\n")
	}
	require.Regexp(t, `\nshmlocks_lock_longest_wait_seconds\{name="jobs"\} [0-9.e-]+\n`, body)

	// --names=false: no name label anywhere.
	body = scrape(t, startServe(t, "--table", path, "--names=false"))
	require.Contains(t, body, "shmlocks_table_up 1\n")
	require.NotContains(t, body, "name=")
}

// A table that does not exist yet is served as down and picked up when it
// appears; a table replaced by another file is re-opened.
func TestServeLazyTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "later.tbl")
	url := startServe(t, "--table", path)
	require.Contains(t, scrape(t, url), "\nshmlocks_table_up 0\n")

	m, err := manager.Open(path, &manager.OpenOptions{MaxAgents: 8})
	require.NoError(t, err)
	body := scrape(t, url)
	require.Contains(t, body, "\nshmlocks_table_up 1\n")
	require.Contains(t, body, "\nshmlocks_table_agents_limit 8\n")
	require.NoError(t, m.Close())

	require.NoError(t, os.Remove(path))
	m, err = manager.Open(path, &manager.OpenOptions{MaxAgents: 9})
	require.NoError(t, err)
	defer m.Close()
	require.Contains(t, scrape(t, url), "\nshmlocks_table_agents_limit 9\n", "the new file is re-opened")
}

func TestServeUsage(t *testing.T) {
	r := shm(t, nil, "serve")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "--metrics ADDR is required")
	r = shm(t, nil, "serve", "--metrics", "256.0.0.1:bad")
	require.Equal(t, exitUsage, r.code, r.stderr)
	r = shm(t, nil, "serve", "--help")
	require.Equal(t, exitOK, r.code)
	require.True(t, strings.Contains(r.stdout, "shmlocks_lock_holders"))
}
