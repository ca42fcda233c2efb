// Command modproxy writes a file-system Go module proxy (GOPROXY=file://DIR)
// serving this repository's modules, root and nested, at one version, made
// from the working tree as a release would tag it: `make release-check`
// then builds an outside module against it (docs/release.md). Not a tool
// for users; it knows only the layout of this repository.
//
//	go run ./internal/modproxy -version v0.1.0 -out DIR [-root .]
//
// Each module's zip holds the files under its directory that `go mod
// download` of a tagged commit would give: no nested module's files, no
// .git, only regular files, under MODULE@VERSION/ (golang.org/x/mod/zip's
// rules, without depending on it).
package main

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// modules are this repository's modules: directory, module path.
var modules = []struct{ dir, path string }{
	{".", "github.com/shmlocks/shmlocks"},
	{"etcd", "github.com/shmlocks/shmlocks/etcd"},
	{"prom", "github.com/shmlocks/shmlocks/prom"},
}

func main() {
	version := flag.String("version", "", "the version to serve every module at (vX.Y.Z)")
	out := flag.String("out", "", "the proxy directory to write")
	root := flag.String("root", ".", "the repository's working tree")
	flag.Parse()
	if !strings.HasPrefix(*version, "v") || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: modproxy -version vX.Y.Z -out DIR [-root DIR]")
		os.Exit(64)
	}
	for _, m := range modules {
		if err := write(*out, filepath.Join(*root, m.dir), m.path, *version); err != nil {
			fmt.Fprintf(os.Stderr, "modproxy: %s: %v\n", m.path, err)
			os.Exit(1)
		}
	}
}

// write adds module mod, whose files are in dir, at version v to the proxy at out.
func write(out, dir, mod, v string) error {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	if !bytes.Contains(gomod, []byte("module "+mod+"\n")) {
		return fmt.Errorf("%s/go.mod does not declare module %s", dir, mod)
	}
	at := filepath.Join(out, filepath.FromSlash(mod), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	info, _ := json.Marshal(struct {
		Version string
		Time    time.Time
	}{v, time.Now().UTC().Truncate(time.Second)})
	var zbuf bytes.Buffer
	if err := zipModule(&zbuf, dir, mod+"@"+v); err != nil {
		return err
	}
	for name, b := range map[string][]byte{v + ".info": info, v + ".mod": gomod, v + ".zip": zbuf.Bytes(), "list": []byte(v + "\n")} {
		if err := os.WriteFile(filepath.Join(at, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// gitFiles lists the files git does not ignore under dir (tracked or
// not), relative to dir; nil when git cannot tell (then every file counts).
func gitFiles(dir string) map[string]bool {
	out, err := exec.Command("git", "-C", dir, "ls-files", "-co", "--exclude-standard", "-z", ".").Output()
	if err != nil {
		return nil
	}
	files := map[string]bool{}
	for _, f := range strings.Split(string(out), "\x00") {
		if f != "" {
			files[f] = true
		}
	}
	return files
}

// zipModule writes the module zip of the files under dir with prefix:
// built binaries and other ignored files left in the working tree stay out.
func zipModule(w *bytes.Buffer, dir, prefix string) error {
	z := zip.NewWriter(w)
	keep := gitFiles(dir)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "." {
				return nil
			}
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "vendor" {
				return filepath.SkipDir // .git, .ci, editors' folders: not in a module zip we serve
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // a nested module: its own zip
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		// go.work belongs to development, never to a module.
		if rel == "go.work" || rel == "go.work.sum" || keep != nil && !keep[rel] {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f, err := z.Create(path.Join(prefix, rel))
		if err != nil {
			return err
		}
		_, err = f.Write(b)
		return err
	})
	if err != nil {
		return err
	}
	return z.Close()
}
