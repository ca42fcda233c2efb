// Command filemap draws the house: which source file of a package uses a
// name declared in which other file of the same package, and which package
// imports which. It prints, per package, the files in levels (a file uses
// only files of lower levels, except for the back arrows it lists), and the
// totals that docs/design.md's "File map" section quotes.
//
//	go run ./internal/filemap [-v] ./manager ./table ...
//
// An arrow a → b means that a (a non-test .go file) uses a package-level
// name, a method or a struct field declared in b (a method's receiver type
// does not count: declaring a method is not using the type's file). Files are ordered so that
// as few arrows as possible point up (a greedy feedback-arc-set order, ties
// broken by name); an arrow that still points up is a back arrow. A file's
// level is one more than the highest level it uses through forward arrows.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

type listed struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Export     string
	Imports    []string
	Standard   bool
}

func main() {
	verbose := flag.Bool("v", false, "print every file with its level and arrows")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: filemap [-v] packages...")
		os.Exit(2)
	}
	if err := run(flag.Args(), *verbose, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "filemap:", err)
		os.Exit(1)
	}
}

func goList(args ...string) ([]listed, error) {
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

func run(patterns []string, verbose bool, w io.Writer) error {
	deps, err := goList(append([]string{"-export", "-deps"}, patterns...)...)
	if err != nil {
		return err
	}
	export := map[string]string{}
	for _, p := range deps {
		export[p.ImportPath] = p.Export
	}
	targets, err := goList(patterns...)
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := export[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	bw := bufio.NewWriter(w)
	defer bw.Flush()
	var tot struct{ files, lines, arrows, back, levels int }
	for _, p := range targets {
		s, err := analyse(fset, imp, p)
		if err != nil {
			return err
		}
		tot.files += len(s.files)
		tot.lines += s.lines
		tot.arrows += s.arrows
		tot.back += len(s.back)
		if s.levels > tot.levels {
			tot.levels = s.levels
		}
		var local []string
		for _, i := range p.Imports {
			if !strings.Contains(strings.SplitN(i, "/", 2)[0], ".") {
				continue // standard library
			}
			local = append(local, i)
		}
		fmt.Fprintf(bw, "%s: %d files, %d lines, %d levels, %d arrows, %d back\n",
			p.ImportPath, len(s.files), s.lines, s.levels, s.arrows, len(s.back))
		if len(local) > 0 {
			fmt.Fprintf(bw, "  imports %s\n", strings.Join(local, " "))
		}
		if s.most != "" {
			fmt.Fprintf(bw, "  most used: %s (by %d of %d siblings; it uses %d)\n",
				s.most, s.usedBy[s.most], len(s.files)-1, len(s.uses[s.most]))
		}
		if verbose {
			for _, f := range s.order {
				var us []string
				for u := range s.uses[f] {
					us = append(us, u)
				}
				sort.Strings(us)
				fmt.Fprintf(bw, "  L%d %-22s -> %s\n", s.level[f], f, strings.Join(us, " "))
			}
		}
		for _, t := range s.types {
			fmt.Fprintf(bw, "  type %s\n", t)
		}
		if verbose {
			for _, b := range s.back {
				fmt.Fprintf(bw, "  back: %s\n", b)
			}
		}
	}
	fmt.Fprintf(bw, "total: %d files, %d lines, %d arrows, %d back, deepest %d levels\n",
		tot.files, tot.lines, tot.arrows, tot.back, tot.levels)
	return nil
}

type summary struct {
	files  []string
	lines  int
	uses   map[string]map[string]bool
	usedBy map[string]int
	order  []string
	level  map[string]int
	levels int
	arrows int
	back   []string
	most   string
	types  []string
}

func analyse(fset *token.FileSet, imp types.Importer, p listed) (*summary, error) {
	s := &summary{uses: map[string]map[string]bool{}, usedBy: map[string]int{}, level: map[string]int{}}
	var files []*ast.File
	for _, name := range p.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
		s.files = append(s.files, name)
		s.uses[name] = map[string]bool{}
		s.lines += fset.File(f.Pos()).LineCount()
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
	conf := types.Config{Importer: imp, Error: func(error) {}}
	pkg, _ := conf.Check(p.ImportPath, fset, files, info)
	if pkg == nil {
		return nil, fmt.Errorf("type-checking %s failed", p.ImportPath)
	}
	fileOf := func(pos token.Pos) string { return filepath.Base(fset.Position(pos).Filename) }
	add := func(from token.Pos, obj types.Object) {
		if obj == nil || obj.Pkg() != pkg || !obj.Pos().IsValid() {
			return
		}
		// package-level names, methods and fields only (not locals)
		if obj.Parent() != nil && obj.Parent() != pkg.Scope() {
			return
		}
		a, b := fileOf(from), fileOf(obj.Pos())
		if a != b {
			if _, ok := s.uses[b]; ok {
				s.uses[a][b] = true
			}
		}
	}
	// A method's receiver names its type: that is where the method is
	// declared, not a use of the file that declares the type.
	recv := map[token.Pos]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil {
				ast.Inspect(fd.Recv, func(n ast.Node) bool {
					if id, ok := n.(*ast.Ident); ok {
						recv[id.Pos()] = true
					}
					return true
				})
			}
		}
	}
	for id, obj := range info.Uses {
		if !recv[id.Pos()] {
			add(id.Pos(), obj)
		}
	}
	for sel, x := range info.Selections {
		add(sel.Sel.Pos(), x.Obj())
	}
	for a, us := range s.uses {
		s.arrows += len(us)
		for b := range us {
			s.usedBy[b]++
		}
		_ = a
	}
	for f, n := range s.usedBy {
		if s.most == "" || n > s.usedBy[s.most] || n == s.usedBy[s.most] && f < s.most {
			s.most = f
		}
	}
	s.order = fasOrder(s.files, s.uses)
	pos := map[string]int{}
	for i, f := range s.order {
		pos[f] = i
	}
	// the order lists users last: a file is placed after every file it uses
	// through a forward arrow.
	for _, f := range s.order {
		lv := 0
		for u := range s.uses[f] {
			if pos[u] < pos[f] {
				if s.level[u]+1 > lv {
					lv = s.level[u] + 1
				}
			} else {
				s.back = append(s.back, f+" -> "+u)
			}
		}
		s.level[f] = lv
		if lv+1 > s.levels {
			s.levels = lv + 1
		}
	}
	sort.Strings(s.back)
	// the big types: fields, methods and the files their methods are in
	for _, name := range pkg.Scope().Names() {
		tn, ok := pkg.Scope().Lookup(name).(*types.TypeName)
		if !ok {
			continue
		}
		named, ok := tn.Type().(*types.Named)
		if !ok {
			continue
		}
		st, ok := named.Underlying().(*types.Struct)
		if !ok || st.NumFields() < 12 {
			continue
		}
		in := map[string]bool{}
		for i := 0; i < named.NumMethods(); i++ {
			in[fileOf(named.Method(i).Pos())] = true
		}
		s.types = append(s.types, fmt.Sprintf("%s: %d fields, %d methods in %d files",
			name, st.NumFields(), named.NumMethods(), len(in)))
	}
	return s, nil
}

// fasOrder orders files so that few arrows point from a file to one placed
// after it (Eades, Lin and Smyth's greedy heuristic): files that use nothing
// left come first, files nothing left uses come last, else the file whose
// (used by - uses) is largest goes first.
func fasOrder(files []string, uses map[string]map[string]bool) []string {
	left := map[string]bool{}
	for _, f := range files {
		left[f] = true
	}
	out := func(f string) int { // f uses
		n := 0
		for u := range uses[f] {
			if left[u] {
				n++
			}
		}
		return n
	}
	in := func(f string) int { // f is used by
		n := 0
		for g := range left {
			if uses[g][f] {
				n++
			}
		}
		return n
	}
	sorted := func() []string {
		var l []string
		for f := range left {
			l = append(l, f)
		}
		sort.Strings(l)
		return l
	}
	var head, tail []string
	for len(left) > 0 {
		changed := true
		for changed {
			changed = false
			for _, f := range sorted() {
				if out(f) == 0 { // uses nothing left: a base
					head = append(head, f)
					delete(left, f)
					changed = true
				}
			}
			for _, f := range sorted() {
				if in(f) == 0 { // used by nothing left: a top
					tail = append([]string{f}, tail...)
					delete(left, f)
					changed = true
				}
			}
		}
		if len(left) == 0 {
			break
		}
		best, score := "", 0
		for _, f := range sorted() {
			if d := in(f) - out(f); best == "" || d > score {
				best, score = f, d
			}
		}
		head = append(head, best)
		delete(left, best)
	}
	return append(head, tail...)
}
