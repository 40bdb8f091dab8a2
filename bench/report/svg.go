package report

import (
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Chart is one panel of grouped bars: for every metric a group of bars, one
// per series (a policy, a front), in series order.
type Chart struct {
	Title  string
	Unit   string // shown after the title
	Groups []string
	Series []string
	// Values[g][s] is the bar of group g and series s.
	Values [][]float64
	// LowerIsBetter is shown in the title as a hint.
	LowerIsBetter bool
	// ClipOutliers caps the axis at four times the median bar, so that one
	// pathological series (a policy that piles everything on one worker) does
	// not flatten the others; clipped bars are marked with their value.
	ClipOutliers bool
	// Lines, when set, makes the panel a line chart instead of bars: one
	// line per entry, in series colours, over a shared x axis (XLabel
	// names it). Groups and Values are then unused.
	Lines  []Line
	XLabel string
	// LogX draws the line chart's x axis on a log scale (latency CDFs).
	LogX bool
	// Marks are events on a line chart's x axis (a fault injected at that
	// moment), drawn as thin vertical lines with their label on hover.
	Marks []Mark
}

// Mark is one event on a line chart's x axis.
type Mark struct {
	X     float64
	Label string
}

// Line is one series of a line chart.
type Line struct {
	Name string
	X, Y []float64
}

// palette is colour-blind friendly (Okabe–Ito).
var palette = []string{"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"}

// WriteSVG writes charts stacked vertically as one standalone SVG file,
// creating its directory.
func WriteSVG(path, title string, charts ...Chart) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := RenderSVG(f, title, charts...); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// RenderSVG renders charts as one SVG document.
func RenderSVG(w io.Writer, title string, charts ...Chart) error {
	const (
		width   = 900
		panelH  = 260
		top     = 50
		left    = 70
		right   = 20
		legendH = 24
	)
	height := top + len(charts)*(panelH+legendH+30) + 10
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="28" font-size="18" font-weight="bold">%s</text>`+"\n", left, esc(title))
	y0 := top
	for _, c := range charts {
		renderPanel(&b, c, left, y0, width-left-right, panelH)
		renderLegend(&b, c, left, y0+panelH+20)
		y0 += panelH + legendH + 30
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// RenderChart renders one chart as an SVG element of the given size, its
// legend under the plot: for pages that lay charts out themselves.
func RenderChart(w io.Writer, c Chart, width, height int) error {
	const left, right, legendH = 60, 10, 24
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	renderPanel(&b, c, left, 0, width-left-right, height-legendH-8)
	renderLegend(&b, c, left, height-10)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// renderLegend draws a chart's series (or lines) names with their colours
// in a row starting at x, baseline y.
func renderLegend(b *strings.Builder, c Chart, x, y int) {
	names := c.Series
	if c.Lines != nil {
		names = make([]string, len(c.Lines))
		for i, l := range c.Lines {
			names[i] = l.Name
		}
	}
	for s, name := range names {
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/>`, x, y-10, palette[s%len(palette)])
		fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`+"\n", x+16, y, esc(name))
		x += 24 + 7*len(name)
	}
}

func renderPanel(b *strings.Builder, c Chart, x, y, w, h int) {
	if c.Lines != nil {
		renderLines(b, c, x, y, w, h)
		return
	}
	title := c.Title
	if c.Unit != "" {
		title += " (" + c.Unit + ")"
	}
	if c.LowerIsBetter {
		title += " — lower is better"
	} else {
		title += " — higher is better"
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="14">%s</text>`+"\n", x, y+14, esc(title))
	plotTop, plotH := y+24, h-50
	maxV := 0.0
	for _, g := range c.Values {
		for _, v := range g {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				maxV = max(maxV, v)
			}
		}
	}
	if c.ClipOutliers {
		var vs []float64
		for _, g := range c.Values {
			for _, v := range g {
				if v > 0 && !math.IsInf(v, 0) {
					vs = append(vs, v)
				}
			}
		}
		if len(vs) > 0 {
			slices.Sort(vs)
			maxV = min(maxV, 4*vs[len(vs)/2])
		}
	}
	if maxV == 0 {
		maxV = 1
	}
	maxV *= 1.1 // headroom for the value labels above the bars
	// Axis and three grid lines.
	for i := 0; i <= 4; i++ {
		gy := plotTop + plotH - i*plotH/4
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ddd"/>`, x, gy, x+w, gy)
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end" fill="#555">%s</text>`+"\n", x-6, gy+4, num(maxV*float64(i)/4))
	}
	ng := max(len(c.Groups), 1)
	groupW := w / ng
	ns := max(len(c.Series), 1)
	barW := max(2, (groupW-20)/ns)
	for g, name := range c.Groups {
		gx := x + g*groupW + 10
		for s := range c.Series {
			if g >= len(c.Values) || s >= len(c.Values[g]) {
				continue
			}
			v := c.Values[g][s]
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				v = 0
			}
			clipped := v > maxV
			bh := int(min(v, maxV) / maxV * float64(plotH))
			bx := gx + s*barW
			if clipped {
				fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle" font-size="10">▲%s</text>`, bx+barW/2, plotTop-2, num(v))
			}
			fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
				bx, plotTop+plotH-bh, barW-2, bh, palette[s%len(palette)], esc(c.Series[s]), esc(name), num(c.Values[g][s]))
			if !clipped {
				// The value on the bar, so the chart reads without hovering.
				fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle" font-size="11">%s</text>`+"\n", bx+(barW-2)/2, plotTop+plotH-bh-4, num(c.Values[g][s]))
			}
		}
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", gx+ns*barW/2, plotTop+plotH+16, esc(name))
	}
}

// renderLines draws a line chart panel.
func renderLines(b *strings.Builder, c Chart, x, y, w, h int) {
	title := c.Title
	if c.Unit != "" {
		title += " (" + c.Unit + ")"
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="14">%s</text>`+"\n", x, y+14, esc(title))
	plotTop, plotH := y+24, h-50
	fx := func(v float64) float64 { return v }
	if c.LogX {
		fx = func(v float64) float64 { return math.Log10(max(v, 1e-9)) }
	}
	x0, x1, maxY := math.Inf(1), math.Inf(-1), 0.0
	for _, l := range c.Lines {
		for i := range l.X {
			if c.LogX && l.X[i] <= 0 {
				continue
			}
			x0, x1, maxY = min(x0, fx(l.X[i])), max(x1, fx(l.X[i])), max(maxY, l.Y[i])
		}
	}
	if x1 <= x0 {
		x0, x1 = 0, 1
	}
	if maxY == 0 {
		maxY = 1
	}
	for i := 0; i <= 4; i++ {
		gy := plotTop + plotH - i*plotH/4
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ddd"/>`, x, gy, x+w, gy)
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end" fill="#555">%s</text>`+"\n", x-6, gy+4, num(maxY*float64(i)/4))
		xv := x0 + (x1-x0)*float64(i)/4
		if c.LogX {
			xv = math.Pow(10, xv)
		}
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle" fill="#555">%s</text>`+"\n", x+i*w/4, plotTop+plotH+16, num(xv))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end" fill="#555">%s</text>`+"\n", x+w, plotTop+plotH+30, esc(c.XLabel))
	for _, m := range c.Marks {
		if m.X < x0 || m.X > x1 || c.LogX {
			continue
		}
		px := float64(x) + (m.X-x0)/(x1-x0)*float64(w)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#D55E00" stroke-opacity="0.35" stroke-dasharray="3,3"><title>%s</title></line>`+"\n",
			px, plotTop, px, plotTop+plotH, esc(m.Label))
	}
	for s, l := range c.Lines {
		pts := make([]string, 0, len(l.X))
		for i := range l.X {
			if c.LogX && l.X[i] <= 0 {
				continue
			}
			px := float64(x) + (fx(l.X[i])-x0)/(x1-x0)*float64(w)
			py := float64(plotTop+plotH) - l.Y[i]/maxY*float64(plotH)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, py))
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"><title>%s</title></polyline>`+"\n",
			palette[s%len(palette)], strings.Join(pts, " "), esc(l.Name))
	}
}

// CDF is the empirical distribution of vs as a line: x the sorted values,
// y the fraction at or below each, thinned to at most points points.
func CDF(name string, vs []float64, points int) Line {
	sorted := slices.Clone(vs)
	slices.Sort(sorted)
	l := Line{Name: name}
	n := len(sorted)
	if n == 0 {
		return l
	}
	step := max(1, n/max(points, 2))
	for i := 0; i < n; i += step {
		l.X, l.Y = append(l.X, sorted[i]), append(l.Y, float64(i+1)/float64(n))
	}
	if l.X[len(l.X)-1] != sorted[n-1] || l.Y[len(l.Y)-1] != 1 {
		l.X, l.Y = append(l.X, sorted[n-1]), append(l.Y, 1)
	}
	return l
}

func num(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

func esc(s string) string { return html.EscapeString(s) }
