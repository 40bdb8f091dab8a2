package deploy

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// dockerfile returns the instructions of deploy/Dockerfile, continuation
// lines joined.
func dockerfile(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if s, more := strings.CutSuffix(line, "\\"); more {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		out = append(out, cur.String())
		cur.Reset()
	}
	return out
}

// TestImageRecipe runs the build stage's `go build` exactly as the Dockerfile
// writes it (there is no Docker engine on this machine) and checks what the
// runtime stage relies on: a static binary that runs on a base without libc,
// started as a non-root user.
func TestImageRecipe(t *testing.T) {
	ins := dockerfile(t)
	var build, user, entry string
	var stages []string
	for _, in := range ins {
		switch {
		case strings.HasPrefix(in, "FROM "):
			stages = append(stages, in)
		case strings.HasPrefix(in, "RUN ") && strings.Contains(in, "go build"):
			build = strings.TrimPrefix(in, "RUN ")
		case strings.HasPrefix(in, "USER "):
			user = strings.TrimPrefix(in, "USER ")
		case strings.HasPrefix(in, "ENTRYPOINT "):
			entry = in
		}
	}
	if len(stages) != 2 || !strings.Contains(stages[1], "distroless/static") {
		t.Fatalf("want a build stage and a distroless/static runtime stage, got %q", stages)
	}
	if user == "" || strings.HasPrefix(user, "0") || strings.HasPrefix(user, "root") {
		t.Fatalf("USER %q: the image must not run as root", user)
	}
	if entry != `ENTRYPOINT ["/kvselect"]` {
		t.Fatalf("entrypoint %q", entry)
	}
	if !strings.Contains(build, "CGO_ENABLED=0") || !strings.Contains(build, "-o /out/kvselect ./cmd/kvselect") {
		t.Fatalf("build recipe %q: want a static build of ./cmd/kvselect into /out/kvselect", build)
	}
	if !strings.Contains(build, "-tags vtprotobuf") {
		t.Fatalf("build recipe %q: want -tags vtprotobuf (the picker's generated message encoders)", build)
	}

	// Run it from the repository root, as the Dockerfile's WORKDIR /src holds
	// the whole context, with /out mapped to a temporary directory and the
	// ARG substituted.
	out := t.TempDir()
	cmd := strings.ReplaceAll(build, "/out/", out+"/")
	cmd = strings.ReplaceAll(cmd, "${VERSION}", "v0.0.0-imagetest")
	sh := exec.Command("sh", "-c", cmd)
	sh.Dir = ".."
	if b, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, b)
	}
	bin := filepath.Join(out, "kvselect")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the binary asks for a dynamic loader: it would not start on distroless/static")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Fatalf("the binary links %v", libs)
	}
	v, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !regexp.MustCompile(`^kvselect v0\.0\.0-imagetest `).Match(v) {
		t.Fatalf("--version: %q %v", v, err)
	}
}

// TestDockerignoreKeepsTheBuildInputs: everything ./cmd/kvselect compiles
// from must survive the context filter.
func TestDockerignoreKeepsTheBuildInputs(t *testing.T) {
	b, err := os.ReadFile("Dockerfile.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{end}}", "../cmd/kvselect").Output()
	if err != nil {
		t.Fatal(err)
	}
	root, _ := filepath.Abs("..")
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue // module cache
		}
		for _, pat := range strings.Split(string(b), "\n") {
			pat = strings.TrimSpace(pat)
			if pat == "" || strings.HasPrefix(pat, "#") {
				continue
			}
			if rel == pat || strings.HasPrefix(rel, pat+"/") || (strings.HasPrefix(pat, "**/") && strings.Contains("/"+rel+"/", "/"+strings.TrimPrefix(pat, "**/")+"/")) {
				t.Errorf("package dir %s is excluded by %q", rel, pat)
			}
		}
	}
}
