package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvselect/kvselect/bench/benchflag"
	"github.com/kvselect/kvselect/bench/scale"
)

// scaleCmd is `kvbench scale` (bench/scale): selection, ingest and replica
// mesh costs as the fleet grows, in process.
func scaleCmd(fs *flag.FlagSet, _ []string) func(context.Context, io.Writer, io.Writer) error {
	c := scale.Defaults()
	ints := func(v []int) string { return strings.Trim(strings.Join(strings.Fields(fmt.Sprint(v)), ","), "[]") }
	floats := func(v []float64) string { return strings.Trim(strings.Join(strings.Fields(fmt.Sprint(v)), ","), "[]") }
	ranks := fs.String("ranks", ints(c.Ranks), "selection curve: comma-separated fleet sizes in engine `ranks`")
	engines := fs.String("ingest-engines", ints(c.IngestEngines), "ingest: comma-separated fleet sizes in engine `ranks`")
	replicaCounts := fs.String("replicas", ints(c.Replicas), "replica mesh: comma-separated replica `counts`")
	rates := fs.String("fleet-rates", floats(c.FleetRates), "replica mesh: comma-separated fleet `requests/s`, spread over the replicas")
	parts := fs.String("parts", strings.Join(c.Parts, ","), "comma-separated `parts` to run: selection, ingest, replicas")
	fs.IntVar(&c.RanksPerWorker, "ranks-per-worker", c.RanksPerWorker, "data_parallel_size of every registered worker")
	fs.IntVar(&c.RanksPerGroup, "ranks-per-group", c.RanksPerGroup, "`ranks` sharing one system prompt group")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "KV block size in `tokens`")
	fs.IntVar(&c.CacheBlocks, "cache-blocks", c.CacheBlocks, "each rank's prefix cache in `blocks`")
	fs.IntVar(&c.SystemTokens, "system-tokens", c.SystemTokens, "system prompt `tokens` (a multiple of the block size)")
	fs.IntVar(&c.QuestionTokens, "question-tokens", c.QuestionTokens, "question `tokens` after the system prompt (a multiple of the block size)")
	fs.IntVar(&c.QuestionsPerGroup, "questions-per-group", c.QuestionsPerGroup, "distinct `questions` per group")
	fs.IntVar(&c.OutputTokens, "output-tokens", c.OutputTokens, "generated `tokens` per request (stored as blocks as they fill)")
	fs.Float64Var(&c.HotShare, "hot-share", c.HotShare, "`fraction` of requests on the one system prompt every rank serves")
	fs.IntVar(&c.Requests, "requests", c.Requests, "selection curve: timed `requests` per fleet size")
	fs.IntVar(&c.Warmup, "warmup", c.Warmup, "selection curve: untimed `requests` first")
	fs.IntVar(&c.InFlight, "in-flight", c.InFlight, "selection curve: `bookings` kept open while timing")
	fs.Float64Var(&c.RequestRate, "request-rate", c.RequestRate, "ingest: `requests/s` each engine serves")
	fs.Float64Var(&c.IngestSeconds, "ingest-seconds", c.IngestSeconds, "ingest: `seconds` of engine traffic")
	fs.DurationVar(&c.StepInterval, "step", c.StepInterval, "ingest: engine step; one event batch per engine and step")
	fs.DurationVar(&c.ReplicaDuration, "replica-duration", c.ReplicaDuration, "replica mesh: measured time per (replicas, rate)")
	fs.IntVar(&c.ReplicaRanks, "replica-ranks", c.ReplicaRanks, "replica mesh: engine `ranks` of each replica's fleet")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "random `seed`")
	out := fs.String("out", "", "write scale.json and the curves' SVGs into this `dir`")
	from := fs.String("from", "", "run nothing: print the tables of, and with -out redraw the curves of, this scale.json `file`")
	var prof benchflag.CPUProfile
	prof.Register(fs)
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		var err error
		if c.Ranks, err = benchflag.Ints(*ranks); err != nil {
			return fmt.Errorf("-ranks: %w", err)
		}
		if c.IngestEngines, err = benchflag.Ints(*engines); err != nil {
			return fmt.Errorf("-ingest-engines: %w", err)
		}
		if c.Replicas, err = benchflag.Ints(*replicaCounts); err != nil {
			return fmt.Errorf("-replicas: %w", err)
		}
		if c.FleetRates, err = benchflag.Floats(*rates, 0); err != nil {
			return fmt.Errorf("-fleet-rates: %w", err)
		}
		c.Parts = benchflag.Split(*parts)
		if *from != "" {
			b, err := os.ReadFile(*from)
			if err != nil {
				return fmt.Errorf("-from: %w", err)
			}
			var rep scale.Report
			if err := json.Unmarshal(b, &rep); err != nil {
				return fmt.Errorf("-from %s: %w", *from, err)
			}
			return show(&rep, stdout, *out)
		}
		stop, err := prof.Start()
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		rep, err := scale.Run(ctx, c, stderr)
		stop()
		if err != nil {
			return err
		}
		return show(rep, stdout, *out)
	}
}

// show prints rep's tables and, with dir set, writes its files there.
func show(rep *scale.Report, stdout io.Writer, dir string) error {
	if err := rep.Table(stdout); err != nil {
		return err
	}
	if dir != "" {
		return rep.WriteFiles(dir)
	}
	return nil
}
