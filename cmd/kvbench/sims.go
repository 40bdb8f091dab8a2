package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/kvselect/kvselect/bench/benchflag"
	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/flow"
	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/pd"
	"github.com/kvselect/kvselect/bench/replicas"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/routesim"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// routeCmd is `kvbench route`: the policies of selection/scheduler on the
// Mooncake trace over simulated workers (bench/routesim).
func routeCmd(fs *flag.FlagSet, _ []string) func(context.Context, io.Writer, io.Writer) error {
	def := routesim.DefaultConfig()
	c := routesim.Config{Workers: def.Workers, Speedup: def.Speedup, PrefillPerToken: def.PrefillPerToken, DecodePerToken: def.DecodePerToken,
		DecodeInterference: def.DecodeInterference, Seed: def.Seed, BypassWorkers: routesim.DefaultBypassWorkers,
		ScrapeInterval: routesim.DefaultScrapeInterval, RetryAfter: routesim.DefaultRetryAfter}
	trace := mooncake.Slice{Trace: mooncake.DefaultTrace}
	trace.Register(fs)
	fs.IntVar(&c.Workers, "workers", c.Workers, "simulated `workers`")
	capacities := fs.String("capacity", "16384,4096", "KV pool per worker in trace blocks (512 tokens); a comma-separated `list` runs each")
	fs.Float64Var(&c.Speedup, "speedup", c.Speedup, "replay the trace this many `times` faster (offered load)")
	benchflag.Timing(fs, &c.PrefillPerToken, &c.DecodePerToken, "")
	fs.Float64Var(&c.DecodeInterference, "decode-interference", c.DecodeInterference, "prefill slowdown per 1,000 context tokens being decoded on the worker (`fraction`)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "random `seed` for the random policy and tie-breaking")
	policies := fs.String("policies", strings.Join(routesim.Policies(), ","), "comma-separated `policies` to compare: registered selection policies ("+
		strings.Join(scheduler.Names(), ", ")+") and "+routesim.ApproxPolicy+" (kv-cost without KV events)")
	bypass := fs.String("bypass", "0", "fraction of requests that skip kvselect and go straight to one of the first -bypass-workers workers; a comma-separated `list` runs each")
	fs.IntVar(&c.BypassWorkers, "bypass-workers", c.BypassWorkers, "workers the bypass traffic is spread over (the first `n`)")
	metrics := fs.String("engine-metrics", "off", "report the engines' waiting/running counts and KV usage to kvselect every -scrape-interval: off, on, or `off,on` to run both")
	fs.DurationVar(&c.ScrapeInterval, "scrape-interval", c.ScrapeInterval, "virtual time between two engine-metrics scrapes")
	ec := selection.DefaultEngineConfig()
	reqWeights := fs.String("engine-request-weight", strconv.FormatFloat(ec.RequestWeight, 'g', -1, 64),
		"blocks charged per engine request no booking accounts for; a comma-separated `list` runs each (engine metrics on)")
	kvWeights := fs.String("engine-kv-usage-weight", strconv.FormatFloat(ec.KVUsageWeight, 'g', -1, 64),
		"blocks charged per unit of KV usage; a comma-separated `list` runs each (engine metrics on)")
	fs.IntVar(&ec.QueueDepthThreshold, "engine-queue-depth-threshold", ec.QueueDepthThreshold, "waiting requests that saturate a rank (< 0: off)")
	fs.Float64Var(&ec.KVCacheUtilThreshold, "engine-kv-util-threshold", ec.KVCacheUtilThreshold, "KV usage that saturates a rank (< 0: off)")
	saturated := fs.String("engine-when-saturated", "route", "kvselect's --when-saturated with engine metrics on: route (the cheapest saturated rank) or reject (429, retried after -retry-after)")
	fs.DurationVar(&c.RetryAfter, "retry-after", c.RetryAfter, "virtual delay before a request refused as overloaded (429) is offered again")
	var files report.Files
	files.Register(fs)
	quiet := fs.Bool("quiet", false, "no progress bar")
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		s := routesim.Sweep{Config: c, Engine: ec, Policies: benchflag.Split(*policies)}
		var err error
		if err = routesim.KnownPolicies(s.Policies); err != nil {
			return err
		}
		if s.Capacities, err = benchflag.Ints(*capacities); err != nil {
			return fmt.Errorf("-capacity: %w", err)
		}
		if s.Bypasses, err = benchflag.Floats(*bypass, 1); err != nil {
			return fmt.Errorf("-bypass: %w", err)
		}
		if s.RequestWeights, err = benchflag.Floats(*reqWeights, 0); err != nil {
			return fmt.Errorf("-engine-request-weight: %w", err)
		}
		if s.KVUsageWeights, err = benchflag.Floats(*kvWeights, 0); err != nil {
			return fmt.Errorf("-engine-kv-usage-weight: %w", err)
		}
		if *saturated != "route" && *saturated != "reject" {
			return fmt.Errorf("-engine-when-saturated %q: want route or reject", *saturated)
		}
		s.Engine.RejectSaturated = *saturated == "reject"
		for _, m := range strings.Split(*metrics, ",") {
			if m = strings.TrimSpace(m); m != "off" && m != "on" {
				return fmt.Errorf("-engine-metrics: %q is not off or on", m)
			}
			s.EngineMetrics = append(s.EngineMetrics, m == "on")
		}
		reqs, err := trace.Load()
		if err != nil {
			return err
		}
		if *quiet {
			stderr = nil
		}
		rep, err := routesim.Compare(ctx, s, trace.Trace, reqs, stderr)
		if err != nil {
			return err
		}
		if err := rep.Table(stdout); err != nil {
			return err
		}
		return files.Write(rep, fmt.Sprintf("kvbench route: %d workers, %d requests", c.Workers, len(reqs)), rep.Charts)
	}
}

// pdCmd is `kvbench pd` (bench/pd).
func pdCmd(fs *flag.FlagSet, _ []string) func(context.Context, io.Writer, io.Writer) error {
	c := pd.Defaults()
	s := &c.Sim
	fs.StringVar(&c.Mode, "mode", c.Mode, "`sim` (the discrete-event simulation, bench/pdsim) or real (kvselect and mock worker processes)")
	fs.IntVar(&c.PrefillWorkers, "prefill-workers", c.PrefillWorkers, "prefill `workers` of the P/D fleets (the aggregated fleet has prefill+decode workers)")
	fs.IntVar(&c.DecodeWorkers, "decode-workers", c.DecodeWorkers, "decode `workers` of the P/D fleets")
	fs.IntVar(&s.Sessions, "sessions", s.Sessions, "chat `sessions`")
	fs.IntVar(&s.Turns, "turns", s.Turns, "requests per session; each repeats the conversation so far")
	fs.IntVar(&s.FirstTokens, "first-tokens", s.FirstTokens, "prompt `tokens` of a session's first request")
	fs.IntVar(&s.FollowUpTokens, "follow-up-tokens", s.FollowUpTokens, "new prompt `tokens` of every later request")
	fs.IntVar(&s.OutputTokens, "output-tokens", s.OutputTokens, "output `tokens` per request")
	fs.IntVar(&s.BlockSize, "block-size", s.BlockSize, "KV block size in tokens")
	fs.Float64Var(&s.Rate, "rate", s.Rate, "sessions starting per second (Poisson)")
	fs.DurationVar(&s.ThinkTime, "think-time", s.ThinkTime, "time between a session's requests")
	benchflag.Timing(fs, &s.PrefillPerToken, &s.DecodePerToken, "the decode step without prefill interference")
	fs.DurationVar(&s.TransferPerBlock, "transfer-per-block", s.TransferPerBlock, "time to move one KV block from the prefill worker to the decode worker")
	fs.IntVar(&s.ChunkTokens, "chunk-tokens", s.ChunkTokens, "prefill chunk (vLLM's max_num_batched_tokens): a step carries at most this many prompt tokens")
	fs.Uint64Var(&s.Seed, "seed", s.Seed, "random `seed` of the traffic and the services")
	fs.IntVar(&s.EffISLThreshold, "eff-isl-threshold", s.EffISLThreshold, "conditional P/D: prefill locally only below this many uncached `tokens` (DYN_ROUTER_CONDITIONAL_DISAGG_EFF_ISL_THRESHOLD)")
	fs.Float64Var(&s.EffISLRatioThreshold, "eff-isl-ratio-threshold", s.EffISLRatioThreshold, "conditional P/D: ... and below this uncached share of the prompt (DYN_ROUTER_CONDITIONAL_DISAGG_EFF_ISL_RATIO_THRESHOLD)")
	realFlags(fs, &c.Binaries, &c.Speedup, &c.Out, "(arrivals, prefill, decode, transfer)")
	c.Files.RegisterJSON(fs)
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		_, err := pd.Run(ctx, c, stdout, stderr)
		return err
	}
}

// flowCmd is `kvbench flow` (bench/flow).
func flowCmd(fs *flag.FlagSet, _ []string) func(context.Context, io.Writer, io.Writer) error {
	c := flow.Defaults()
	s := &c.Sim
	a, b, shed := &s.Classes[0], &s.Classes[1], &s.Classes[2]
	fs.IntVar(&s.Workers, "workers", s.Workers, "`workers` in the pool")
	fs.IntVar(&s.MaxNumBatchedTokens, "max-num-batched-tokens", s.MaxNumBatchedTokens, "each worker's prefill chunk and busy-test capacity (`tokens`)")
	fs.Float64Var(&s.QueueThreshold, "queue-threshold", s.QueueThreshold, "DYN_ROUTER_QUEUE_THRESHOLD: a worker is busy above this `fraction` of max-num-batched-tokens in active prefill")
	benchflag.Timing(fs, &s.PrefillPerToken, &s.DecodeStep, "the decode step: an engine step without prompt tokens")
	fs.DurationVar(&s.TTL, "ttl", s.TTL, "flow control's queue TTL (--flow-queue-ttl)")
	fs.DurationVar(&s.Duration, "duration", s.Duration, "how long requests arrive (virtual time)")
	fs.Float64Var(&a.Rate, "a-rate", a.Rate, "tenant A's requests per second (Poisson)")
	fs.IntVar(&a.PromptTokens, "a-prompt", a.PromptTokens, "tenant A's prompt `tokens`")
	fs.Float64Var(&b.Rate, "b-rate", b.Rate, "tenant B's requests per second (Poisson)")
	fs.IntVar(&b.PromptTokens, "b-prompt", b.PromptTokens, "tenant B's prompt `tokens`")
	fs.Float64Var(&shed.Rate, "sheddable-rate", shed.Rate, "requests per second at priority -1 (sheddable)")
	output := fs.Int("output-tokens", a.OutputTokens, "output `tokens` of every request")
	fs.Float64Var(&c.Overload, "overload", c.Overload, "the second comparison multiplies tenant A's rate by this `factor`")
	fs.Uint64Var(&s.Seed, "seed", s.Seed, "random `seed` of the arrivals")
	fs.StringVar(&c.Mode, "mode", c.Mode, "`sim` (bench/flowsim) or real (kvselect and mock worker processes; the saturated comparison only)")
	realFlags(fs, &c.Binaries, &c.Speedup, &c.Out, "(arrivals, prefill, decode)")
	c.Files.RegisterJSON(fs)
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		for i := range s.Classes {
			s.Classes[i].OutputTokens = *output
		}
		_, err := flow.Run(ctx, c, stdout, stderr)
		return err
	}
}

// realFlags are the -mode real settings of pd and flow.
func realFlags(fs *flag.FlagSet, b *fleet.Binaries, speedup *float64, out *string, times string) {
	fs.Float64Var(speedup, "speedup", *speedup, "real mode: every time "+times+" divided by this `factor`")
	b.Register(fs)
	fs.StringVar(out, "out", *out, "real mode: `directory` for the processes' logs")
}

// replicasCmd is `kvbench replicas`: the load-spreading experiment of
// bench/replicas with replica sync off, on, and every client on one
// replica (the reference), side by side.
func replicasCmd(fs *flag.FlagSet, _ []string) func(context.Context, io.Writer, io.Writer) error {
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
	var files report.Files
	files.RegisterJSON(fs)
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		all, err := replicas.Compare(ctx, c, *runs, stderr)
		if err != nil {
			return err
		}
		if err := replicas.Table(stdout, all); err != nil {
			return err
		}
		return files.Write(all, "", nil)
	}
}
