// Package report presents what the harnesses measure: tables (Mooncake
// replay results side by side, Columns for any runs), the -json and -svg
// files (Files), SVG charts and progress bars, for every kvbench
// subcommand and the peer comparison in bench/peer.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/kvselect/kvselect/bench/mooncake"
)

// Table writes one column per result. With two or more results it adds a column
// with the ratio of the first to the second (first faster = ratio above 1).
func Table(w io.Writer, rs ...mooncake.Result) error {
	if len(rs) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	ratio := len(rs) >= 2
	row := func(name string, vals []string, r string) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, v := range vals {
			fmt.Fprintf(tw, "%s\t", v)
		}
		if ratio {
			fmt.Fprintf(tw, "%s\t", r)
		}
		fmt.Fprintln(tw)
	}
	col := func(f func(mooncake.Result) string) []string {
		out := make([]string, len(rs))
		for i, r := range rs {
			out[i] = f(r)
		}
		return out
	}
	names := col(func(r mooncake.Result) string { return r.Target })
	hdr := ""
	if ratio {
		hdr = fmt.Sprintf("%s vs %s", rs[0].Target, rs[1].Target)
	}
	row("", names, hdr)
	faster := func(a, b float64) string { // a, b: lower is better
		if a == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1fx", b/a)
	}
	higher := func(a, b float64) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1fx", a/b)
	}
	r0, r1 := rs[0], rs[min(1, len(rs)-1)]
	row("requests (lookups)", col(func(r mooncake.Result) string { return fmt.Sprint(r.Lookups) }), "")
	row("block events", col(func(r mooncake.Result) string { return fmt.Sprint(r.BlockEvents) }), "")
	row("combined ops/s", col(func(r mooncake.Result) string { return fmt.Sprintf("%.0f", r.OpsPerSec) }), higher(r0.OpsPerSec, r1.OpsPerSec))
	row("block ops/s", col(func(r mooncake.Result) string { return fmt.Sprintf("%.0f", r.BlockOpsPerSec) }), higher(r0.BlockOpsPerSec, r1.BlockOpsPerSec))
	row("lookup p50 ns", col(func(r mooncake.Result) string { return fmt.Sprint(r.LookupP50) }), faster(float64(r0.LookupP50), float64(r1.LookupP50)))
	row("lookup p90 ns", col(func(r mooncake.Result) string { return fmt.Sprint(r.LookupP90) }), faster(float64(r0.LookupP90), float64(r1.LookupP90)))
	row("lookup p99 ns", col(func(r mooncake.Result) string { return fmt.Sprint(r.LookupP99) }), faster(float64(r0.LookupP99), float64(r1.LookupP99)))
	row("lookup max ns", col(func(r mooncake.Result) string { return fmt.Sprint(r.LookupMax) }), "")
	row("event apply ns/block", col(func(r mooncake.Result) string { return fmt.Sprintf("%.1f", r.EventNsPerBlock) }), faster(r0.EventNsPerBlock, r1.EventNsPerBlock))
	row("matched workers (sum)", col(func(r mooncake.Result) string { return fmt.Sprint(r.MatchSum) }), "")
	return tw.Flush()
}

// Columns prints, on tw, a table with a column per item of cols: row adds a
// line named name whose cells are cell(item).
func Columns[T any](tw *tabwriter.Writer, cols []T) (row func(name string, cell func(T) string)) {
	return func(name string, cell func(T) string) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, c := range cols {
			fmt.Fprintf(tw, "%s\t", cell(c))
		}
		fmt.Fprintln(tw)
	}
}

// WriteJSON writes v as indented JSON to path, creating its directory.
func WriteJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
