package filewatch

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestChanged(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	write := func(path, data string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	base := time.Now().Add(-time.Hour)
	write(a, "one", base)
	write(b, "one", base)
	start := time.Now()
	w := New(time.Second, start, a, b)
	steps := []struct {
		name   string
		change func()
		at     time.Duration // since start
		want   bool
	}{
		{"nothing changed", func() {}, 2 * time.Second, false},
		{"a rewritten, within the interval", func() { write(a, "two", base.Add(time.Second)) }, 2500 * time.Millisecond, false},
		{"interval over", func() {}, 3 * time.Second, true},
		{"reported once", func() {}, 5 * time.Second, false},
		{"same size, new time", func() { write(b, "uno", base.Add(2*time.Second)) }, 7 * time.Second, true},
		{"removed", func() { os.Remove(a) }, 9 * time.Second, true},
		{"still missing", func() {}, 11 * time.Second, false},
		{"back", func() { write(a, "two", base.Add(time.Second)) }, 13 * time.Second, true},
	}
	for _, s := range steps {
		s.change()
		if got := w.Changed(start.Add(s.at)); got != s.want {
			t.Errorf("%s: Changed = %v, want %v", s.name, got, s.want)
		}
	}
}
