package layout

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestIsExecutable(t *testing.T) {
	for _, tc := range []struct {
		name string
		head []byte
		want bool
	}{
		{"elf", []byte("\x7fELF\x02\x01\x01"), true},
		{"mach-o 64 little-endian", []byte{0xcf, 0xfa, 0xed, 0xfe, 7, 0, 0, 1}, true},
		{"mach-o universal", []byte{0xca, 0xfe, 0xba, 0xbe, 0, 0, 0, 2}, true},
		{"pe", []byte("MZ\x90\x00"), true},
		{"go source", []byte("package layout\n"), false},
		{"svg", []byte("<svg xmlns="), false},
		{"empty", nil, false},
		{"shorter than a magic", []byte{0x7f, 'E'}, false},
	} {
		if got := IsExecutable(tc.head); got != tc.want {
			t.Errorf("%s: IsExecutable(%q) = %v, want %v", tc.name, tc.head, got, tc.want)
		}
	}
}

// TestNoCompiledProgramIsTracked reads the first bytes of every file git
// tracks (`make test` runs it with the other layout rules).
func TestNoCompiledProgramIsTracked(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git command on PATH")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("not a git checkout (%v): nothing to check", err)
	}
	var tracked []string
	for _, name := range bytes.Split(out, []byte{0}) {
		if len(name) > 0 {
			tracked = append(tracked, string(name))
		}
	}
	if len(tracked) < 100 {
		t.Fatalf("git ls-files listed %d files; is %s the repository root?", len(tracked), root)
	}
	var compiled []string
	head := make([]byte, 4)
	for _, name := range tracked {
		f, err := os.Open(filepath.Join(root, name))
		if err != nil {
			continue // deleted in the work tree, not yet in the index
		}
		n, _ := io.ReadFull(f, head)
		f.Close()
		if IsExecutable(head[:n]) {
			compiled = append(compiled, name)
		}
	}
	if len(compiled) > 0 {
		t.Errorf("compiled programs are tracked (git rm --cached them and list them in .gitignore): %s",
			strings.Join(compiled, ", "))
	}
}
