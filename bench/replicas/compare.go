package replicas

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
)

// mode is one way of running the two replicas.
type mode struct {
	name         string
	sync, single bool
}

// modes are compared side by side: replica sync off, on, and every client
// on one replica (the reference).
var modes = []mode{{"sync off", false, false}, {"sync on", true, false}, {"one replica", false, true}}

func modeOf(r Result) mode {
	for _, m := range modes {
		if m.sync == r.Sync && m.single == r.Single {
			return m
		}
	}
	return mode{name: "?"}
}

// Compare runs every mode runs times (run i seeded c.Seed+i), in turn,
// naming each on progress.
func Compare(ctx context.Context, c Config, runs int, progress io.Writer) ([]Result, error) {
	var all []Result
	for run := range runs {
		for _, m := range modes {
			cfg := c
			cfg.Sync, cfg.Single, cfg.Seed = m.sync, m.single, c.Seed+uint64(run)
			fmt.Fprintf(progress, "run %d, %s...\n", run+1, m.name)
			r, err := Run(ctx, cfg)
			if err != nil {
				return all, err
			}
			all = append(all, r)
		}
	}
	return all, nil
}

// Table prints every run, then each mode's mean.
func Table(w io.Writer, all []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tbookings\thot share\treq max/mean\treq CV\tpeak req\tload max/mean\tload CV\t")
	row := func(label string, r Result) {
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.2f\t%.3f\t%d\t%.2f\t%.3f\t\n", label, r.Bookings, r.HotShare,
			r.RequestsMaxOverMean, r.RequestsCV, r.PeakRequests, r.LoadMaxOverMean, r.LoadCV)
	}
	for _, r := range all {
		row(modeOf(r).name, r)
	}
	for _, mode := range modes {
		var m Result
		n := 0.0
		for _, r := range all {
			if modeOf(r) != mode {
				continue
			}
			n++
			m.Bookings += r.Bookings
			m.HotShare += r.HotShare
			m.RequestsMaxOverMean += r.RequestsMaxOverMean
			m.RequestsCV += r.RequestsCV
			m.PeakRequests = max(m.PeakRequests, r.PeakRequests)
			m.LoadMaxOverMean += r.LoadMaxOverMean
			m.LoadCV += r.LoadCV
		}
		m.Bookings = int64(float64(m.Bookings) / n)
		m.HotShare /= n
		m.RequestsMaxOverMean /= n
		m.RequestsCV /= n
		m.LoadMaxOverMean /= n
		m.LoadCV /= n
		row(mode.name+" (mean)", m)
	}
	return tw.Flush()
}
