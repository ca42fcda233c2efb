//go:build linux

package main

import (
	binenc "encoding/binary"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/table"
)

// TestExitStatusTable: the one exit-status table of docs/cli.md, per
// command per case, on real files: 64 usage, 65 not a table this build
// reads, 66 cannot open (missing, not a regular file, permission, unsafe
// location), 69 serve's address taken, 71 internal (no descriptor left).
// (1 busy/timeout: TestExecExitCodes and TestExecBusy...; 1 violations:
// TestDumpWaitsAndCycles; 76 lost: TestExecForwardsSignalsAndStolen.)
func TestExitStatusTable(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	garbage := filepath.Join(dir, "garbage.tbl")
	require.NoError(t, os.WriteFile(garbage, []byte(strings.Repeat("not a table ", 1000)), 0o600))
	// A table of another format version: a real table whose version word
	// is one more than this build's.
	other := filepath.Join(dir, "other.tbl")
	m := openManager(t, other)
	require.NoError(t, m.Close())
	b, err := os.ReadFile(other)
	require.NoError(t, err)
	binenc.NativeEndian.PutUint32(b[8:], table.FormatVersion+1)
	require.NoError(t, os.WriteFile(other, b, 0o600))
	missingDir := filepath.Join(dir, "missing", "t.tbl")

	// The commands that open a table, each on every kind of file.
	type fileCase struct {
		path string
		code int
		says string
	}
	files := []fileCase{
		{garbage, exitCorrupt, "is not a valid lock table"},
		{other, exitCorrupt, "format version"},
		{dir, exitNoTable, "is a directory, not a regular file"},
		{fifo, exitNoTable, "is a named pipe (FIFO), not a regular file"},
		{"/dev/null", exitNoTable, "is a character device, not a regular file"},
		{missingDir, exitNoTable, "directory " + filepath.Dir(missingDir) + " does not exist"},
	}
	cmds := map[string][]string{
		"dump":         {"dump"},
		"dump --json":  {"dump", "--json"},
		"dump --check": {"dump", "--check"},
		"exec":         {"exec", "x", "true"},
		"stress":       {"stress", "--duration", "100ms"},
		"demo":         {"demo", "--rounds", "1"},
	}
	for what, args := range cmds {
		for _, f := range files {
			r := shm(t, nil, append([]string{args[0], "--table", f.path}, args[1:]...)...)
			require.Equal(t, f.code, r.code, "%s on %s: %s", what, f.path, r.stderr)
			require.Contains(t, r.stderr, f.says, "%s on %s", what, f.path)
			require.NotContains(t, r.stderr, "shmlocks: shmlocks", "one prefix")
			require.NotContains(t, r.stderr, ".tmp", "no internal temporary file named")
		}
		// A missing table: dump cannot open it (66); the others create it.
		if args[0] == "dump" {
			r := shm(t, nil, append([]string{"dump", "--table", filepath.Join(dir, "none.tbl")}, args[1:]...)...)
			require.Equal(t, exitNoTable, r.code, "%s: %s", what, r.stderr)
		}
		// Usage errors.
		r := shm(t, nil, append([]string{args[0], "--bogus"}, args[1:]...)...)
		require.Equal(t, exitUsage, r.code, "%s --bogus: %s", what, r.stderr)
	}
	for _, args := range [][]string{{"serve", "--bogus"}, {"path", "x"}, {"version", "x"}, {"help", "x"}, {"nosuch"}, {"--bogus", "dump"}} {
		r := shm(t, nil, args...)
		require.Equal(t, exitUsage, r.code, "%q: %s", args, r.stderr)
	}

	// 66 without permission (as root: the command runs as nobody).
	own := filepath.Join(dir, "own.tbl")
	m = openManager(t, own)
	m.Close()
	require.NoError(t, os.Chmod(own, 0o600))
	for _, args := range [][]string{{"dump"}, {"dump", "--check"}, {"exec", "x", "true"}} {
		code, stderr := runAsOther(t, append([]string{args[0], "--table", own}, args[1:]...))
		require.Equal(t, exitNoTable, code, "%q without permission: %s", args, stderr)
		require.Contains(t, stderr, "permission denied")
	}

	// 69: serve's address is taken.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	r := shm(t, nil, "serve", "--metrics", ln.Addr().String(), "--table", own)
	require.Equal(t, exitUnavailable, r.code, r.stderr)
	require.Contains(t, r.stderr, "cannot listen on "+ln.Addr().String())

	// 71: the system refuses (no file descriptor left for the table). The
	// dynamic loader and the Go runtime need a few descriptors of their
	// own first (they fail otherwise, with their own statuses): the limit
	// rises until the command runs far enough to be refused by the system.
	for _, args := range [][]string{{"dump"}, {"exec", "x", "true"}} {
		refused := false
		for n := 3; n <= 16 && !refused; n++ {
			cmd := exec.Command("sh", "-c", `ulimit -n "$0" && exec "$@"`, strconv.Itoa(n), binary, args[0], "--table", own)
			cmd.Args = append(cmd.Args, args[1:]...)
			cmd.Env = cleanEnv()
			out, err := cmd.CombinedOutput()
			require.Error(t, err, "%q ran with %d descriptors before any refusal: %s", args, n, out)
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "%q: %s", args, out)
			if strings.Contains(string(out), "too many open files") && !strings.Contains(string(out), "fatal error") {
				require.Equal(t, exitOSErr, ee.ExitCode(), "%q with %d descriptors: %s", args, n, out)
				refused = true
			}
		}
		require.True(t, refused, "%q: never refused for want of a descriptor", args)
	}
}

// runAsOther runs the binary with args as another user (nobody) when
// this test runs as root; else as this user with the table made unreadable.
func runAsOther(t *testing.T, args []string) (int, string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = cleanEnv()
	if os.Getuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		// nobody must reach the binary and the file (not read it): the
		// test's directories are 0700.
		for _, p := range []string{binary, args[2]} {
			for d := filepath.Dir(p); d != "/" && d != "."; d = filepath.Dir(d) {
				fi, err := os.Stat(d)
				require.NoError(t, err)
				if fi.Mode().Perm()&0o001 == 0 {
					require.NoError(t, os.Chmod(d, fi.Mode().Perm()|0o001))
				}
			}
		}
	} else {
		require.NoError(t, os.Chmod(args[2], 0))
		defer os.Chmod(args[2], 0o600)
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil {
		require.ErrorAs(t, err, &ee, "%s", out)
		return ee.ExitCode(), string(out)
	}
	return 0, string(out)
}
