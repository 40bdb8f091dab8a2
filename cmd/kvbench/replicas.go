package main

// kvbench replicas: the load-spreading experiment of bench/replicas, run with
// replica sync off, with it on, and with every client on one replica (the
// reference), side by side.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/kvselect/kvselect/bench/replicas"
	"github.com/kvselect/kvselect/bench/report"
)

func runReplicas(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench replicas", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c replicas.Config
	fs.IntVar(&c.Workers, "workers", 8, "workers (one of them holds the hot prefix)")
	fs.IntVar(&c.PrefixBlocks, "prefix-blocks", 32, "blocks of the hot prefix every prompt shares")
	fs.IntVar(&c.SuffixBlocks, "suffix-blocks", 8, "blocks of each prompt's unique tail")
	fs.IntVar(&c.Clients, "clients", 8, "closed-loop clients per replica")
	fs.DurationVar(&c.Duration, "duration", 3*time.Second, "measured time per mode")
	fs.DurationVar(&c.Prefill, "prefill", 2*time.Millisecond, "mean time from booking to prefill complete")
	fs.DurationVar(&c.Decode, "decode", 8*time.Millisecond, "mean time from prefill complete to free")
	fs.Uint64Var(&c.Seed, "seed", 1, "random seed")
	runs := fs.Int("runs", 3, "runs per mode; the table shows each and the mean")
	jsonOut := fs.String("json", "", "also write the results as JSON to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var all []replicas.Result
	for run := range *runs {
		for _, m := range modes {
			cfg := c
			cfg.Sync, cfg.Single, cfg.Seed = m.sync, m.single, c.Seed+uint64(run)
			fmt.Fprintf(stderr, "run %d, %s...\n", run+1, m.name)
			r, err := replicas.Run(ctx, cfg)
			if err != nil {
				return err
			}
			all = append(all, r)
		}
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tbookings\thot share\treq max/mean\treq CV\tpeak req\tload max/mean\tload CV\t")
	row := func(label string, r replicas.Result) {
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.2f\t%.3f\t%d\t%.2f\t%.3f\t\n", label, r.Bookings, r.HotShare,
			r.RequestsMaxOverMean, r.RequestsCV, r.PeakRequests, r.LoadMaxOverMean, r.LoadCV)
	}
	for _, r := range all {
		row(modeOf(r).name, r)
	}
	for _, mode := range modes {
		var m replicas.Result
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
	if err := tw.Flush(); err != nil {
		return err
	}
	if *jsonOut != "" {
		return report.WriteJSON(*jsonOut, all)
	}
	return nil
}

type mode struct {
	name         string
	sync, single bool
}

var modes = []mode{{"sync off", false, false}, {"sync on", true, false}, {"one replica", false, true}}

func modeOf(r replicas.Result) mode {
	for _, m := range modes {
		if m.sync == r.Sync && m.single == r.Single {
			return m
		}
	}
	return mode{name: "?"}
}
