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

func TestCDF(t *testing.T) {
	l := CDF("x", []float64{3, 1, 2, 4}, 100)
	if len(l.X) != 4 || l.X[0] != 1 || l.X[3] != 4 || l.Y[0] != 0.25 || l.Y[3] != 1 {
		t.Errorf("CDF = %+v", l)
	}
	if l := CDF("x", make([]float64, 1000), 10); len(l.X) > 11 || l.Y[len(l.Y)-1] != 1 {
		t.Errorf("thinned CDF has %d points, ends at %v", len(l.X), l.Y[len(l.Y)-1])
	}
}
