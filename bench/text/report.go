package text

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// Table prints one row per phase.
func (rep *Report) Table(w io.Writer) {
	fmt.Fprintf(w, "\n%d chat sessions (%d requests) over %d mock workers, each phase from empty caches:\n\n", rep.Sessions, rep.Requests, rep.Workers)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\thit rate\tTTFT p50 ms\tTTFT p90 ms\tpick p50 µs\tpick p99 µs\ttokenize p50 µs\ttokenize p99 µs\tcache-hit p50 µs\ttokenize cache\tfallbacks\terrors\t")
	for _, ph := range rep.Phases {
		fb := 0.0
		for _, v := range ph.Fallbacks {
			fb += v
		}
		tok := "-\t-\t-\t-\t-"
		if ph.Tokenized != nil {
			hit := "-"
			if ph.Tokenized["cache"] > 0 {
				hit = fmt.Sprintf("%.0f", ph.TokenizeHitP50Us)
			}
			tok = fmt.Sprintf("%.0f\t%.0f\t%s\t%.1f%%\t%.0f", ph.TokenizeP50Us, ph.TokenizeP99Us, hit, 100*ph.TokenizeCache, fb)
		}
		fmt.Fprintf(tw, "%s\t%.1f%%\t%.1f\t%.1f\t%.0f\t%.0f\t%s\t%d\t\n", ph.Name, 100*ph.HitRate, ph.TTFTP50Ms, ph.TTFTP90Ms,
			ph.PickP50Us, ph.PickP99Us, tok, ph.Errors)
	}
	tw.Flush()
}
