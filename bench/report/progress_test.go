package report

import (
	"bytes"
	"strings"
	"testing"
)

// TestProgressOffATerminal: a buffer is no terminal, so many updates make a
// plain final line, no carriage returns.
func TestProgressOffATerminal(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(&buf, "phase")
	for i := 1; i <= 1000; i++ {
		p.Update(i, 1000)
	}
	out := buf.String()
	if strings.Contains(out, "\r") || strings.Count(out, "\n") != 1 || !strings.Contains(out, "phase: 1000/1000 (100%)") {
		t.Errorf("progress off a terminal printed %q, want one plain final line", out)
	}
}
