// Package reporttest checks, in the harnesses' tests, the files bench/report
// writes.
package reporttest

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"testing"
)

// CheckSVG fails t unless path is well-formed XML that mentions want.
func CheckSVG(t testing.TB, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(b))
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", path, err)
		}
	}
	if !bytes.Contains(b, []byte(want)) {
		t.Fatalf("%s lacks %q", path, want)
	}
}

// ReadJSON reads the report a run's -json wrote.
func ReadJSON[T any](t testing.TB, path string) T {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}
