// Package examples_test builds every example program and runs it, so the
// examples a user copies keep working.
package examples_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// examples: each program's folder and the lines its output must hold, in
// order (other lines may come between them).
var examples = []struct {
	dir  string
	want []string
}{
	{"fairlock", []string{
		`parent holds "printer" (token 1)`,
		`4 workers queued; releasing`,
		`worker 0 got "printer" (token 2)`,
		`worker 1 got "printer" (token 3)`,
		`worker 2 got "printer" (token 4)`,
		`worker 3 got "printer" (token 5)`,
	}},
	{"tokenrefresh", []string{
		`4 tabs made 80 calls; the token expired 7 times and was refreshed 7 times; logouts: 0`,
	}},
}

func TestExamples(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool on PATH to build the examples")
	}
	bin := t.TempDir()
	for _, ex := range examples {
		t.Run(ex.dir, func(t *testing.T) {
			exe := filepath.Join(bin, ex.dir)
			if out, err := exec.Command(goTool, "build", "-o", exe, "./"+ex.dir).CombinedOutput(); err != nil {
				t.Fatalf("build: %v\n%s", err, out)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, exe).CombinedOutput()
			if err != nil {
				t.Fatalf("run: %v\n%s", err, out)
			}
			rest := string(out)
			for _, w := range ex.want {
				i := strings.Index(rest, w+"\n")
				if i < 0 {
					t.Fatalf("output lacks %q (in this order); got:\n%s", w, out)
				}
				rest = rest[i+len(w)+1:]
			}
		})
	}
}
