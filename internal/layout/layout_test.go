package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/kvselect/kvselect"

// listModule runs `go list -deps -json` over the whole module from its root:
// its packages and everything they import, the standard library included.
func listModule(t *testing.T) []Package {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Dir,GoFiles,Imports,Deps", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p Package
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages; is the module root %s?", len(pkgs), root)
	}
	return pkgs
}

// TestTheModuleKeepsItsLayout is the rule book of the folders: run it after
// moving code, and read its message when it fails.
func TestTheModuleKeepsItsLayout(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	l := Layout{Module: module}
	pkgs := listModule(t)
	kinds := map[Kind]int{}
	for _, p := range pkgs {
		kinds[l.KindOf(p.ImportPath)]++
	}
	// The rules only mean something while each kind has members.
	for k, min := range map[Kind]int{Core: 9, Front: 2, Adapter: 6, Server: 1} {
		if kinds[k] < min {
			t.Errorf("%d packages of kind %d, want at least %d: has the layout moved without this test?", kinds[k], k, min)
		}
	}
	if broken := l.Check(pkgs); len(broken) > 0 {
		t.Errorf("the layout rules are broken (internal/layout's package doc lists them):\n%s", strings.Join(broken, "\n"))
	}
}

// TestCheckReportsEachRule breaks every rule in a made-up module.
func TestCheckReportsEachRule(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "core.go")
	if err := os.WriteFile(src, []byte(`package selection

import "time"

func f() {
	go func() {}()
	t := time.NewTicker(time.Second)
	_ = t
	_ = time.Now
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	m := func(rel string) string { return "example.com/m/" + rel }
	pkgs := []Package{
		{ImportPath: m("selection"), Dir: dir, GoFiles: []string{"core.go"},
			Imports: []string{"fmt", "os", "net/url", "example.com/lib", m("selection/index"), m("internal/zmqdial")},
			Deps:    []string{"fmt", "os", "net", "net/url", "example.com/lib", m("selection/index"), m("internal/zmqdial")}},
		{ImportPath: "net/url", Imports: []string{"strings"}, Deps: []string{"strings"}},
		{ImportPath: "example.com/lib", Imports: []string{"net/http"}, Deps: []string{"net", "net/http"}},
		{ImportPath: m("selection/index"), Imports: []string{"sort"}, Deps: []string{"sort"}},
		{ImportPath: m("internal/zmqdial"), Imports: []string{"net"}, Deps: []string{"net"}},
		{ImportPath: m("extproc"), Imports: []string{m("selection"), m("engines/kvlisten"), m("httpadmin")}},
		{ImportPath: m("replicas/mesh"), Imports: []string{m("httpadmin"), m("engines/kvlisten"), m("replicas/recovery")}},
		{ImportPath: m("cmd/tool"), Imports: []string{m("extproc"), m("replicas/mesh")}},
		{ImportPath: m("server"), Imports: []string{m("extproc"), m("replicas/mesh")}},
	}
	got := Layout{Module: "example.com/m"}.Check(pkgs)
	want := []string{
		"core.go:6:2: example.com/m/selection starts a goroutine",
		"core.go:7:7: example.com/m/selection uses time.NewTicker",
		"example.com/m/selection imports os: the selection core does no I/O",
		"example.com/m/selection imports example.com/m/internal/zmqdial: the selection core imports nothing outside selection/",
		"example.com/m/selection imports example.com/lib, which pulls in net: the selection core does no I/O",
		"example.com/m/extproc imports example.com/m/engines/kvlisten: a front imports no adapter",
		"example.com/m/extproc imports example.com/m/httpadmin: a front imports no adapter, front or server",
		"example.com/m/replicas/mesh imports example.com/m/httpadmin: an adapter imports no front",
		"example.com/m/replicas/mesh imports example.com/m/engines/kvlisten: an adapter imports no adapter of another folder",
		"example.com/m/cmd/tool imports example.com/m/extproc and example.com/m/replicas/mesh: only server/ wires",
		"example.com/m/extproc imports example.com/m/httpadmin and example.com/m/engines/kvlisten: only server/ wires",
		"example.com/m/replicas/mesh imports example.com/m/httpadmin and example.com/m/engines/kvlisten: only server/ wires",
	}
	joined := strings.Join(got, "\n")
	for _, w := range want {
		if !strings.Contains(joined, w) {
			t.Errorf("no report containing %q in:\n%s", w, joined)
		}
	}
	for _, line := range got {
		if strings.Contains(line, "example.com/m/server ") || strings.Contains(line, "time.Now") || strings.Contains(line, "replicas/recovery") {
			t.Errorf("allowed use reported: %s", line)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d reports, want %d:\n%s", len(got), len(want), joined)
	}
}
