//go:build linux

package main

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmlocks/shmlocks/internal/proctest"
)

// The docs say only what is true: every command line of README.md and
// docs/cli.md (in code blocks and inline code) that can run on a fresh
// machine is run here, as written, with the binary as shmlocks and
// ./shmlocks, a table of the test's own ($SHMLOCKS_TABLE) and the scripts
// the examples name; it must succeed (or end as docExit says). A line
// that is not run is a synopsis (placeholders), a mention of a command in
// prose, or in docNotRun with the reason; a docNotRun line no longer in
// the docs fails the test, so the list stays true too.

// docNotRun are the command lines not run, and why.
var docNotRun = map[string]string{
	"make test": "it is CI itself (this test runs inside it)",
	"make run":  "it builds ./shmlocks into the checkout and runs on the user's own default table",
	"make lib":  "it writes lib/ into the checkout; make test builds it and runs the C and Python tests on it (lang-build, test-lang)",
	"./shmlocks stress --procs 8 --chaos 5 --duration 30s":                                                                   "30 s: longer than the test's budget (TestStressChaosLong runs chaos for 10 s)",
	"shmlocks stress --chaos 50 --duration 240s --procs 10 --seed 1":                                                         "240 s: longer than the test's budget",
	"shmlocks exec --table /srv/locks/app.tbl --mode 0660 deploy ./deploy.sh":                                                "needs /srv/locks, made by the sudo line before it for a group 'team'",
	"shmlocks exec -n job sh -c 'store --fence \"$SHMLOCKS_TOKEN\" ...'":                                                     "store is the reader's own program",
	"shmlocks dump --watch 12:00:01 sorted by longest wait (w/h/n/s sort, q quits) every 1s /tmp/shmlocks-1000/shmlocks.tbl": "the live view's first line (output, not a command)",
	"shmlocks dump: unknown option --bogus":                                                                                  "an error message quoted",
}

// docMentions are commands named in prose without the options they need.
var docMentions = []string{"shmlocks exec", "shmlocks serve", "shmlocks stress --chaos"}

// docExit are lines whose expected status is not 0, and why.
var docExit = map[string]int{
	// job is free: exec exits 0, so [ $? = 75 ] is false and the line 1.
	`shmlocks exec -n -E 75 job ./job.sh; [ $? = 75 ] && echo "already running"`: 1,
}

// docLongRunning are the lines that run until stopped: each must print
// its first line, and exit 0 on SIGTERM.
var docLongRunning = regexp.MustCompile(`^(\./)?shmlocks (serve |dump --watch)`)

// docPlaceholder marks a synopsis: an option list or a metavariable.
var docPlaceholder = regexp.MustCompile(`\[|\b(COMMAND|CMD|NAME|ARGS|STRING|PATH|ADDR|DUR|DURATION|OCTAL|SECONDS)\b`)

// docDuration finds a stress run's --duration, in seconds.
var docDuration = regexp.MustCompile(`--duration (\d+)s`)

// docLines returns the command lines of a markdown file: lines of code
// blocks (fenced or indented) that start with shmlocks, ./shmlocks or
// make, and inline code that starts with shmlocks; comments dropped,
// spaces collapsed.
func docLines(t *testing.T, file string) []string {
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	s := string(b)
	var out []string
	add := func(l string) {
		l = strings.Join(strings.Fields(l), " ")
		if !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	for _, m := range regexp.MustCompile("`((?:[A-Z_]+=\\S+ )*(?:\\./)?shmlocks [^`]+)`").FindAllStringSubmatch(s, -1) {
		add(m[1])
	}
	start := regexp.MustCompile(`^((?:[A-Z_]+=\S+ )*(?:\./)?shmlocks |make )`)
	fence := false
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "```") {
			fence = !fence
			continue
		}
		if t := strings.TrimSpace(l); (fence || strings.HasPrefix(l, "    ")) && start.MatchString(t) {
			add(regexp.MustCompile(`\s+#\s.*$`).ReplaceAllString(t, ""))
		}
	}
	return out
}

func TestDocsCommandLines(t *testing.T) {
	if slices.Contains(buildFlags, "-race") {
		// Its stress runs take half a minute of a race-enabled binary:
		// make docs runs it on the plain build (make test does).
		t.Skip("run without the race detector: make docs")
	}
	root := filepath.Join("..", "..")
	var lines []string
	for _, f := range []string{"README.md", filepath.Join("docs", "cli.md")} {
		for _, l := range docLines(t, filepath.Join(root, f)) {
			if !slices.Contains(lines, l) {
				lines = append(lines, l)
			}
		}
	}
	for l := range docNotRun {
		require.Contains(t, lines, l, "docNotRun names a line the docs no longer have")
	}

	// A fresh machine: the binary on PATH and as ./shmlocks, a table of
	// our own with something on it, the scripts the examples run.
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	require.NoError(t, os.Mkdir(bin, 0o755))
	require.NoError(t, os.Symlink(binary, filepath.Join(bin, "shmlocks")))
	work := filepath.Join(dir, "work")
	require.NoError(t, os.Mkdir(work, 0o755))
	require.NoError(t, os.Symlink(binary, filepath.Join(work, "shmlocks")))
	for _, s := range []string{"job.sh", "deploy.sh"} {
		require.NoError(t, os.WriteFile(filepath.Join(work, s), []byte("#!/bin/sh\necho ran\n"), 0o755))
	}
	env := append(cleanEnv(), "PATH="+bin+":"+os.Getenv("PATH"), envTable+"="+filepath.Join(dir, "docs.tbl"))
	setup := exec.Command(binary, "exec", "--table", filepath.Join(dir, "docs.tbl"), "setup", "true")
	setup.Env = env
	out, err := setup.CombinedOutput()
	require.NoError(t, err, "%s", out)

	ran := 0
	for _, l := range lines {
		if _, ok := docNotRun[l]; ok || slices.Contains(docMentions, l) || docPlaceholder.MatchString(l) {
			continue
		}
		if m := docDuration.FindStringSubmatch(l); m != nil && len(m[1]) > 1 || m != nil && m[1] > "5" {
			t.Fatalf("%q: a run of %ss: shorten it to 5s at most, or add it to docNotRun with the reason", l, m[1])
		}
		if strings.Contains(l, "stress") && testing.Short() && !strings.Contains(l, "--help") {
			t.Logf("not run with -short (a stress run of seconds): %q", l)
			continue
		}
		ran++
		t.Run(l, func(t *testing.T) {
			if docLongRunning.MatchString(l) {
				runLongDocLine(t, l, work, env)
				return
			}
			cmd := exec.Command("sh", "-c", l)
			cmd.Dir, cmd.Env = work, env
			out, err := cmd.CombinedOutput()
			code := 0
			if err != nil {
				var ee *exec.ExitError
				require.ErrorAs(t, err, &ee, "%s", out)
				code = ee.ExitCode()
			}
			require.Equal(t, docExit[l], code, "%q:\n%s", l, out)
			if !strings.Contains(l, "--help") {
				require.NotContains(t, string(out), "usage:", "%q", l)
			}
		})
	}
	require.Positive(t, ran)
}

// runLongDocLine runs a line that serves or watches until stopped: it must
// print its first line (serve: a scrape of its /metrics answers), then end
// with status 0 on SIGTERM.
func runLongDocLine(t *testing.T, l, work string, env []string) {
	cmd := exec.Command("sh", "-c", "exec "+l)
	cmd.Dir, cmd.Env = work, env
	p := proctest.Start(t, cmd, proctest.Options{CaptureStderr: true, Within: 30 * time.Second})
	first := p.Next()
	if m := regexp.MustCompile(`metrics on (http://\S+)`).FindStringSubmatch(first); m != nil {
		resp, err := http.Get(m[1])
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, proctest.ExitCode(p.Wait()), "%q: %s", l, p.Stderr())
}
