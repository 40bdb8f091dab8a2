package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kvselect/kvselect/bench/soak"
)

// runSoak is `kvbench soak`: kvselect replicas, mock workers and traffic on
// loopback under a seeded schedule of faults, every invariant checked
// (bench/soak). -short is the three-minute version CI runs.
func runSoak(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := soak.Defaults()
	fs := flag.NewFlagSet("kvbench soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	short := fs.Bool("short", false, "the compressed run CI does: 150s under faults after a 45s baseline, a fault every 4s, 8s expiry (flags given explicitly still win)")
	binaryFlags(fs, &c.KVSelect, &c.MockWorker)
	fs.StringVar(&c.Sim, "sim", os.Getenv("KVSELECT_LLMD_SIM"), "llm-d-inference-sim `binary` (default $KVSELECT_LLMD_SIM); -sims of them join the mock workers")
	sims := fs.Int("sims", -1, "llm-d-inference-sim workers (default 1 with a simulator binary, else 0)")
	fs.StringVar(&c.Out, "out", c.Out, "`directory` for soak.json, soak.svg and every process's log")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "length of the faulted phase")
	fs.DurationVar(&c.Baseline, "baseline", c.Baseline, "length of the fault-free phase of the same traffic first (0: none, no routing-quality ratio)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the traffic and the fault schedule")
	fs.IntVar(&c.Replicas, "replicas", c.Replicas, "kvselect replicas (replica sync between all; the last recovers its index from the others and is the one killed)")
	fs.IntVar(&c.Workers, "workers", c.Workers, "mock workers (the first half in the workers file, the rest registered over REST)")
	fs.IntVar(&c.ProxiedWorkers, "proxied-workers", c.ProxiedWorkers, "workers whose KV events pass the lossy proxy (the last ones)")
	fs.Float64Var(&c.ExtprocRate, "extproc-rate", c.ExtprocRate, "requests per second through the pickers (open loop)")
	fs.Float64Var(&c.RESTRate, "rest-rate", c.RESTRate, "REST booking cycles per second (open loop)")
	fs.IntVar(&c.Docs, "docs", c.Docs, "shared prompt prefixes")
	fs.DurationVar(&c.FaultEvery, "fault-every", c.FaultEvery, "mean gap between injected faults")
	fs.DurationVar(&c.SampleEvery, "sample-every", c.SampleEvery, "resource and hit-rate sampling interval")
	fs.DurationVar(&c.Expiry, "expiry", c.Expiry, "booking expiry given to kvselect (DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS; whole seconds)")
	fs.Float64Var(&c.MaxRSSSlope, "max-rss-slope", c.MaxRSSSlope, "largest RSS growth per replica over the last half, MiB per hour")
	fs.Float64Var(&c.MaxGoroutineSlope, "max-goroutine-slope", c.MaxGoroutineSlope, "largest goroutine growth per replica over the last half, per hour")
	fs.Float64Var(&c.MaxFDSlope, "max-fd-slope", c.MaxFDSlope, "largest open-fd growth per replica over the last half, per hour")
	fs.DurationVar(&c.JudgeAfter, "judge-slopes-after", c.JudgeAfter, "hold the slopes to their bounds only when the last half is at least this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.Sim == "" && os.Getenv("KVSELECT_REQUIRE_LLMD_SIM") != "" {
		return errors.New("KVSELECT_REQUIRE_LLMD_SIM is set but no llm-d-inference-sim binary is given (-sim or KVSELECT_LLMD_SIM)")
	}
	c.Sims = *sims
	if c.Sims < 0 {
		c.Sims = 0
		if c.Sim != "" {
			c.Sims = 1
		}
	}
	if *short {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		short := func(name string, p *time.Duration, v time.Duration) {
			if !set[name] {
				*p = v
			}
		}
		short("duration", &c.Duration, 150*time.Second)
		short("baseline", &c.Baseline, 45*time.Second)
		short("fault-every", &c.FaultEvery, 4*time.Second)
		short("sample-every", &c.SampleEvery, 3*time.Second)
		short("expiry", &c.Expiry, 8*time.Second)
	}
	_, err := soak.Run(ctx, c, stdout, stderr)
	return err
}
