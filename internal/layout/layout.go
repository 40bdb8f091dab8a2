// Package layout states the rules the repository's folders stand for and
// checks them against the import graph `go list` reports (the test in this
// package runs the check on the whole module):
//
//   - selection/... decides: it imports no package that does I/O (net,
//     net/http, os, os/exec, ZMQ, gRPC, Prometheus), nothing of this module
//     outside selection/, and its code starts no goroutine and no timer;
//   - the fronts (httpadmin, extproc) translate: they import no adapter and
//     no other front;
//   - the adapters (engines/..., replicas/..., discovery/...) do the I/O: they
//     import no front and no adapter of another folder;
//   - only server/ imports fronts and adapters together;
//   - git tracks no compiled program (IsExecutable; the test reads every
//     tracked file's first bytes).
//
// It has no code of its own beyond the rules; nothing imports it.
package layout

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
)

// Package is what the rules read of one package: `go list -json` fields.
type Package struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Deps       []string
}

// Kind is a package's place in the layout.
type Kind int

// Kinds of packages.
const (
	Other   Kind = iota
	Core         // selection/...
	Front        // httpadmin, extproc
	Adapter      // engines/..., replicas/..., discovery/...
	Server       // server
)

// Layout classifies the packages of one module.
type Layout struct {
	Module string // the module path
}

func (l Layout) rel(path string) (string, bool) {
	if path == l.Module {
		return ".", true
	}
	r, ok := strings.CutPrefix(path, l.Module+"/")
	return r, ok
}

func under(rel, dir string) bool { return rel == dir || strings.HasPrefix(rel, dir+"/") }

// KindOf places a package path.
func (l Layout) KindOf(path string) Kind {
	rel, ok := l.rel(path)
	switch {
	case !ok:
		return Other
	case under(rel, "selection"):
		return Core
	case rel == "httpadmin" || rel == "extproc":
		return Front
	case under(rel, "engines") || under(rel, "replicas") || under(rel, "discovery"):
		return Adapter
	case rel == "server":
		return Server
	}
	return Other
}

// adapterGroup is an adapter's top folder (engines, replicas, discovery).
func (l Layout) adapterGroup(path string) string {
	rel, _ := l.rel(path)
	group, _, _ := strings.Cut(rel, "/")
	return group
}

// ioPackages are what the core must not import, directly or through a
// dependency: a package path, and with a trailing "/..." everything under it
// too (net/url and net/netip parse strings and are allowed). os is checked on
// direct imports only: the standard library's fmt imports it.
var ioPackages = []string{
	"net", "net/http/...", "os/exec",
	"github.com/go-zeromq/zmq4/...",
	"google.golang.org/grpc/...",
	"github.com/prometheus/client_golang/...",
}

func isIO(path string) bool {
	for _, p := range ioPackages {
		base, tree := strings.CutSuffix(p, "/...")
		if path == base || (tree && strings.HasPrefix(path, base+"/")) {
			return true
		}
	}
	return false
}

// timers are the time functions that make a clock of one's own.
var timers = []string{"NewTicker", "NewTimer", "After", "AfterFunc", "Sleep", "Tick"}

// Check returns one line per broken rule, naming the package and the
// offending import (or source position).
func (l Layout) Check(pkgs []Package) []string {
	byPath := make(map[string]*Package, len(pkgs))
	for i := range pkgs {
		byPath[pkgs[i].ImportPath] = &pkgs[i]
	}
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	for _, p := range pkgs {
		kind := l.KindOf(p.ImportPath)
		var fronts, adapters []string
		for _, imp := range p.Imports {
			ik := l.KindOf(imp)
			switch kind {
			case Core:
				if imp == "os" || isIO(imp) {
					add("%s imports %s: the selection core does no I/O", p.ImportPath, imp)
				} else if _, internal := l.rel(imp); internal && ik != Core {
					add("%s imports %s: the selection core imports nothing outside selection/", p.ImportPath, imp)
				}
			case Front:
				if ik == Adapter || ik == Server || (ik == Front && imp != p.ImportPath) {
					add("%s imports %s: a front imports no adapter, front or server", p.ImportPath, imp)
				}
			case Adapter:
				if ik == Front || ik == Server {
					add("%s imports %s: an adapter imports no front or server", p.ImportPath, imp)
				} else if ik == Adapter && l.adapterGroup(imp) != l.adapterGroup(p.ImportPath) {
					add("%s imports %s: an adapter imports no adapter of another folder", p.ImportPath, imp)
				}
			}
			switch ik {
			case Front:
				fronts = append(fronts, imp)
			case Adapter:
				adapters = append(adapters, imp)
			}
		}
		if kind != Server && len(fronts) > 0 && len(adapters) > 0 {
			add("%s imports %s and %s: only server/ wires fronts and adapters together", p.ImportPath, fronts[0], adapters[0])
		}
		if kind == Core {
			out = append(out, l.indirectIO(p, byPath)...)
			out = append(out, checkSource(p)...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// indirectIO reports the core's imports from outside the module (the
// standard library, third-party modules) that are no I/O package themselves
// but pull one in, naming the first. An import from this module needs no
// such report: a core package answers for its own imports, and any other is
// refused outright.
func (l Layout) indirectIO(p Package, byPath map[string]*Package) []string {
	var out []string
	for _, imp := range p.Imports {
		if _, internal := l.rel(imp); internal || imp == "os" || isIO(imp) {
			continue
		}
		d := byPath[imp]
		if d == nil {
			continue // not listed: Check was given the module's packages only
		}
		for _, dep := range d.Deps {
			if isIO(dep) {
				out = append(out, fmt.Sprintf("%s imports %s, which pulls in %s: the selection core does no I/O", p.ImportPath, imp, dep))
				break
			}
		}
	}
	return out
}

// checkSource reports go statements and timer calls in the package's
// non-test files: the core starts no goroutine and keeps no clock of its own.
func checkSource(p Package) []string {
	var out []string
	fset := token.NewFileSet()
	for _, name := range p.GoFiles {
		path := filepath.Join(p.Dir, name)
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", path, err))
			continue
		}
		timeName := importName(f, "time")
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				out = append(out, fmt.Sprintf("%s: %s starts a goroutine: the selection core starts none", fset.Position(n.Pos()), p.ImportPath))
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok && timeName != "" && id.Name == timeName && slices.Contains(timers, n.Sel.Name) {
					out = append(out, fmt.Sprintf("%s: %s uses time.%s: the selection core keeps no clock of its own", fset.Position(n.Pos()), p.ImportPath, n.Sel.Name))
				}
			}
			return true
		})
	}
	return out
}

// importName is the name f refers to path by, "" when f does not import it.
func importName(f *ast.File, path string) string {
	for _, imp := range f.Imports {
		if strings.Trim(imp.Path.Value, `"`) != path {
			continue
		}
		if imp.Name != nil {
			return imp.Name.Name
		}
		return filepath.Base(path)
	}
	return ""
}
