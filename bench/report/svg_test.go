package report

import (
	"strings"
	"testing"
)

// A line chart draws its marks inside the x range, with their labels.
func TestLineChartMarks(t *testing.T) {
	var b strings.Builder
	c := Chart{Title: "rss", Lines: []Line{{Name: "a", X: []float64{0, 10}, Y: []float64{1, 2}}},
		Marks: []Mark{{X: 5, Label: "worker-3 kill -9"}, {X: 50, Label: "outside"}}}
	if err := RenderChart(&b, c, 400, 200); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(b.String(), "stroke-dasharray"); got != 1 || !strings.Contains(b.String(), "worker-3 kill -9") {
		t.Fatalf("%d marks drawn in\n%s", got, b.String())
	}
}
