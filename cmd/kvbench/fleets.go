package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvselect/kvselect/bench/benchflag"
	"github.com/kvselect/kvselect/bench/demo"
	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/health"
	"github.com/kvselect/kvselect/bench/ngf"
	"github.com/kvselect/kvselect/bench/observe"
	"github.com/kvselect/kvselect/bench/soak"
	"github.com/kvselect/kvselect/bench/suite"
	"github.com/kvselect/kvselect/bench/text"
	"github.com/kvselect/kvselect/bench/vsepp"
	"github.com/kvselect/kvselect/bench/workload"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// demoFlags are the demo's flags, which observe shares.
func demoFlags(fs *flag.FlagSet, c *demo.Config) {
	c.Spec.Register(fs)
	c.Slice.Register(fs)
	fs.Float64Var(&c.Compress, "compress", c.Compress, "replay the trace this many `times` faster than recorded")
	fs.Float64Var(&c.Rate, "rate", 0, "send the trace's requests evenly spaced at this many `per second` instead of at their (compressed) times: a steady stream without the trace's bursts (0: the trace's times)")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "most requests in flight")
	fs.IntVar(&c.BlockTokens, "block-tokens", c.BlockTokens, "prompt `tokens` per trace block (the trace's blocks are 512 tokens; smaller keeps the demo quick)")
	fs.IntVar(&c.MaxOutput, "max-output", c.MaxOutput, "cap on output `tokens` per request (the trace's lengths scaled like the prompts, then capped: every streamed chunk is an ext_proc round trip)")
	fs.BoolVar(&c.Quiet, "quiet", false, "no progress bars")
}

// demoCmd is `kvbench demo` (bench/demo).
func demoCmd(fs *flag.FlagSet, _ []string) func(context.Context, io.Writer, io.Writer) error {
	c := demo.Defaults()
	demoFlags(fs, &c)
	c.Spec.RegisterFamily(fs)
	benchflag.Alias(fs, "engines", "engine-family")
	fs.IntVar(&c.Engine.MaxNumSeqs, "max-num-seqs", c.Engine.MaxNumSeqs, "llm-d-inference-sim's --max-num-seqs: requests an engine runs at once, the rest wait in its queue")
	fs.StringVar(&c.Gateway, "gateway", "", "also replay the trace through this `gateway` beside envoysim: "+demo.GatewayNGINX+" (NGINX running NGINX Gateway Fabric's epp.js and shim; needs -ngf-shim-dir, nginx and its njs module)")
	fs.StringVar(&c.NGFShimDir, "ngf-shim-dir", os.Getenv(ngf.EnvShimDir), "`folder` holding NGINX Gateway Fabric's ngf-epp-shim, epp.js and nginx.example.conf (default $"+ngf.EnvShimDir+")")
	fs.BoolVar(&c.ExtProcTLS, "extproc-tls", false, "serve kvselect's ext_proc picker over TLS (self-signed); envoysim and NGF's shim reach it without verifying the certificate")
	fs.BoolVar(&c.GatewayFloor, "gateway-floor", false, "with -gateway, also run the floor picker (kvbench floor-picker: round-robin, only what the protocol requires) through envoysim and through the gateway: the TTFT the gateway's path adds to a picker that does nothing")
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		var err error
		if c.FloorPicker, err = floorCommand(c.GatewayFloor); err != nil {
			return err
		}
		_, err = demo.Run(ctx, c, stdout, stderr)
		return err
	}
}

// observeCmd is `kvbench observe` (bench/observe).
func observeCmd(fs *flag.FlagSet, _ []string) func(context.Context, io.Writer, io.Writer) error {
	c := observe.Defaults()
	demoFlags(fs, &c.Demo)
	fs.StringVar(&c.Prometheus, "prometheus", c.Prometheus, "Prometheus `binary` (Debian: apt install prometheus)")
	fs.StringVar(&c.Chromium, "chromium", c.Chromium, "Chromium `binary` for the status page and the screenshots (Debian: apt install chromium)")
	fs.StringVar(&c.Dashboard, "dashboard", c.Dashboard, "Grafana dashboard `file` whose queries are checked")
	fs.StringVar(&c.Alerts, "alerts", c.Alerts, "Prometheus rules `file` loaded into the Prometheus")
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		_, err := observe.Run(ctx, c, stdout, stderr)
		return err
	}
}

// vsEPPCmd is `kvbench vs-epp` (bench/vsepp).
func vsEPPCmd(fs *flag.FlagSet, args []string) func(context.Context, io.Writer, io.Writer) error {
	config := vsEPPFlags(fs, args)
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		c, err := config()
		if err != nil {
			return err
		}
		_, err = vsepp.Run(ctx, c, stdout, stderr)
		return err
	}
}

// vsEPPFlags defines vs-epp's flags on fs and returns the configuration
// they give once args are parsed.
func vsEPPFlags(fs *flag.FlagSet, args []string) func() (vsepp.Config, error) {
	c := vsepp.Defaults()
	c.Spec.Register(fs)
	c.Spec.RegisterFamily(fs)
	benchflag.Alias(fs, "engines", "workers")
	c.RegisterEPP(fs)
	c.Slice.Register(fs)
	fs.StringVar(&c.Prompts, "prompts", c.Prompts, "`form` of the prompts: "+vsepp.PromptsTokens+" (token ids) or "+vsepp.PromptsText+" (a text per trace block; kvselect runs --tokenize pool, the EPP renders through an engine, which needs -engine-family "+string(fleet.FamilySim)+")")
	kvselectArgs := fs.String("kvselect-args", "", "extra kvselect `flags`, space-separated (e.g. --enable-pprof)")
	eppArgs := fs.String("epp-args", "", "extra endpoint picker `flags`, space-separated")
	fs.StringVar(&c.Loop, "loop", c.Loop, "`traffic`: open (arrivals at the trace's times / -compress, or at -rate) or closed (-concurrency clients back to back)")
	fs.Float64Var(&c.Compress, "compress", c.Compress, "open loop: replay the trace this many `times` faster than recorded (at 20x, four engines and the load generator saturate one core)")
	fs.Float64Var(&c.Rate, "rate", c.Rate, "open loop: arrivals per `second` at a fixed pace instead of the trace's times")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "closed loop: `clients`; open loop: most requests in flight")
	fs.IntVar(&c.BlockTokens, "block-tokens", c.BlockTokens, "prompt `tokens` per trace block (the trace's blocks are 512 tokens)")
	fs.IntVar(&c.Engine.MaxNumSeqs, "max-num-seqs", c.Engine.MaxNumSeqs, "requests an engine runs at once; the rest wait in its queue (small, so that piling requests on one engine costs TTFT)")
	fs.IntVar(&c.MaxOutput, "max-output", c.MaxOutput, "cap on output `tokens` per request")
	pickers := fs.String("pickers", strings.Join(c.Pickers, ","), "pickers to run, comma-separated: kvselect (its default policy), kvselect-latency (--policy predicted-latency), kvselect-kvcost (--policy kv-cost, Dynamo's cost), kvselect-prefix (--policy longest-prefix), epp (its sample configuration's weights), epp-tuned (llm-d-router's precise-prefix perf-test scorers), floor (kvbench floor-picker: only what the protocol requires, round-robin; the cost under every picker's)")
	transports := fs.String("transports", "plain", "ext_proc `transports`, comma-separated: plain, tls (each picker serves a self-signed certificate; the client does not verify it)")
	fs.DurationVar(&c.Idle, "idle", c.Idle, "idle window before traffic, to measure each picker's idle CPU")
	fs.DurationVar(&c.Saturate, "saturate", c.Saturate, "saturating closed loop after the trace, picker only (0 skips it)")
	fs.IntVar(&c.SaturateStreams, "saturate-streams", c.SaturateStreams, "concurrent streams of the saturating loop")
	fs.BoolVar(&c.Pin, "pin", c.Pin, "pin the picker to CPU 0 and this process with the engines to CPU 1 (taskset; needs 2 CPUs)")
	fs.BoolVar(&c.Quiet, "quiet", false, "no progress bars")
	fs.DurationVar(&c.GoodputTTFT, "goodput-ttft", c.GoodputTTFT, "goodput counts requests whose TTFT is at most this (`duration`)")
	fs.DurationVar(&c.GoodputITL, "goodput-itl", c.GoodputITL, "goodput counts requests whose mean inter-token latency is at most this (`duration`)")
	fs.DurationVar(&c.Profile, "profile", 0, "take a CPU profile of kvselect over this much of the trace run (`duration`) into <out>/<picker>-<transport>/cpu.pprof, and its heap after the run into heap.pprof; needs -kvselect-args --enable-pprof")
	var sp sharedPrefixFlags
	sp.register(fs)
	return func() (vsepp.Config, error) {
		c.KVSelectArgs, c.EPPArgs = strings.Fields(*kvselectArgs), strings.Fields(*eppArgs)
		c.Pickers, c.Transports = benchflag.Split(*pickers), benchflag.Split(*transports)
		c.Args = strings.Join(args, " ")
		var err error
		if c.FloorPicker, err = floorCommand(slices.Contains(c.Pickers, vsepp.PickerFloor)); err != nil {
			return c, err
		}
		err = applySharedPrefix(fs, &sp, &c)
		return c, err
	}
}

// floorCommand is the command that serves the floor picker when a run
// needs it: this binary's floor-picker subcommand.
func floorCommand(needed bool) ([]string, error) {
	if !needed {
		return nil, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("the floor picker runs this binary: %w", err)
	}
	return []string{exe, "floor-picker"}, nil
}

// applySharedPrefix turns vs-epp's shared_prefix flags into c's workload:
// the generator paces the requests (-rate moves into it) and sends its exact
// token lengths (trace blocks of 512 tokens), and -requests caps it only
// when given.
func applySharedPrefix(fs *flag.FlagSet, sp *sharedPrefixFlags, c *vsepp.Config) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	gen, err := sp.resolve(c.Rate, func(name string) bool { return set[name] })
	if err != nil || gen == nil {
		return err
	}
	c.SharedPrefix, c.Rate, c.Compress, c.BlockTokens = gen, 0, 1, workload.BlockTokens
	if !set["requests"] {
		c.Requests = 0
	}
	return nil
}

// textCmd is `kvbench text` (bench/text).
func textCmd(fs *flag.FlagSet, _ []string) func(context.Context, io.Writer, io.Writer) error {
	c := text.Defaults()
	c.Spec.Register(fs)
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "`sessions` in flight; each sends its turns one after another")
	fs.IntVar(&c.MaxOutput, "max-output", c.MaxOutput, "output `tokens` per request")
	fs.DurationVar(&c.TokenizeTimeout, "tokenize-timeout", c.TokenizeTimeout, "kvselect --tokenize-timeout in the pool phase")
	phases := fs.String("phases", strings.Join(c.Phases, ","), "comma-separated `phases`: tokens, pool, text, round-robin; pool-warm (the workload twice on one fleet, the second pass reported: a warm tokenize cache); pool-completions and pool-forward (the conversations as completions prompts, without and with --tokenize-forward-ids)")
	extra := fs.String("kvselect-args", "", "more kvselect `flags` for every phase, space-separated")
	fs.Uint64Var(&c.Load.Seed, "seed", c.Load.Seed, "workload `seed`")
	fs.IntVar(&c.Load.Sessions, "sessions", c.Load.Sessions, "chat `sessions`")
	fs.IntVar(&c.Load.SystemPrompts, "system-prompts", c.Load.SystemPrompts, "distinct long system `prompts`")
	fs.IntVar(&c.Load.Documents, "documents", c.Load.Documents, "distinct `documents` quoted into user turns")
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		c.Phases, c.KVSelectArgs = benchflag.Split(*phases), strings.Fields(*extra)
		_, err := text.Run(ctx, c, stdout, stderr)
		return err
	}
}

// healthCmd is `kvbench health` (bench/health).
func healthCmd(fs *flag.FlagSet, _ []string) func(context.Context, io.Writer, io.Writer) error {
	c := health.Defaults()
	c.Spec.Register(fs)
	fs.Float64Var(&c.Rate, "rate", c.Rate, "requests per second through the picker (open loop)")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "most routed requests in flight")
	fs.IntVar(&c.PromptTokens, "prompt-tokens", c.PromptTokens, "prompt `tokens` per request (random ids, so no prefix is shared)")
	fs.IntVar(&c.MaxTokens, "max-tokens", c.MaxTokens, "output `tokens` per request")
	fs.DurationVar(&c.Healthy, "healthy", c.Healthy, "first phase: every worker healthy")
	fs.DurationVar(&c.Fault, "fault", c.Fault, "second phase: -fail-worker answers every request 500")
	fs.DurationVar(&c.Recover, "recover", c.Recover, "third phase: the worker healthy again")
	fs.IntVar(&c.FailWorker, "fail-worker", c.FailWorker, "worker `id` (1..workers) that fails in the second phase; 0: none")
	fs.Float64Var(&c.DirectRate, "direct-rate", c.DirectRate, "requests per second sent straight to the workers, bypassing kvselect (open loop, spread over -direct-workers)")
	fs.IntVar(&c.DirectWorkers, "direct-workers", c.DirectWorkers, "the direct traffic goes to workers 1..`n`")
	intervals := fs.String("engine-metrics-interval", "200ms", "kvselect's --engine-metrics-interval; a comma-separated `list` runs each on fresh processes (0 disables scraping)")
	fs.DurationVar(&c.EjectBase, "eject-base", c.EjectBase, "kvselect's --eject-base (first ejection's length)")
	extra := fs.String("kvselect-args", "", "more kvselect `flags`, space-separated")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seeds the prompts")
	c.Files.RegisterJSON(fs)
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		var err error
		if c.Intervals, err = benchflag.Durations(*intervals); err != nil {
			return fmt.Errorf("-engine-metrics-interval %w", err)
		}
		c.KVSelectArgs = strings.Fields(*extra)
		_, err = health.Measure(ctx, c, stdout, stderr)
		return err
	}
}

// soakCmd is `kvbench soak` (bench/soak); -short is the three-minute run CI
// does.
func soakCmd(fs *flag.FlagSet, _ []string) func(context.Context, io.Writer, io.Writer) error {
	c := soak.Defaults()
	short := fs.Bool("short", false, "the compressed run CI does: 150s under faults after a 45s baseline, a fault every 4s, 8s expiry (flags given explicitly still win)")
	bins := fleet.Binaries{}
	bins.Register(fs)
	bins.RegisterSim(fs)
	sims := fs.Int("sims", -1, "llm-d-inference-sim workers joining the mock workers (default 1 with a simulator binary, else 0)")
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
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		c.KVSelect, c.MockWorker, c.Sim, c.Sims = bins.KVSelect, bins.MockWorker, bins.Sim, *sims
		if c.Sim == "" && os.Getenv(peerproc.EnvRequireSim) != "" {
			return errors.New("KVSELECT_REQUIRE_LLMD_SIM is set but no llm-d-inference-sim binary is given (-sim-bin or KVSELECT_LLMD_SIM)")
		}
		if c.Sims < 0 {
			c.Sims = 0
			if c.Sim != "" {
				c.Sims = 1
			}
		}
		if *short {
			set := map[string]bool{}
			fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
			c.Shorten(func(name string) bool { return set[name] })
		}
		_, err := soak.Run(ctx, c, stdout, stderr)
		return err
	}
}

// suiteCmd is `kvbench suite` (bench/suite).
func suiteCmd(fs *flag.FlagSet, args []string) func(context.Context, io.Writer, io.Writer) error {
	c := suite.Config{Base: vsepp.Defaults(), Families: []fleet.Family{fleet.FamilySim, fleet.FamilyMock},
		Workloads: slices.Clone(suite.Workloads), LadderRate: []float64{20, 40, 60}, Repeat: 3}
	c.Base.Out, c.Base.Idle, c.Base.Saturate = "bench/out/suite", 2*time.Second, 2*time.Second
	c.Base.Requests = 500
	c.Base.Spec.Register(fs)
	c.Base.Binaries.RegisterSim(fs)
	c.Base.RegisterEPP(fs)
	families := fs.String("families", "llmd-sim,mock", "engine `families`, comma-separated: llmd-sim (llm-d-inference-sim), mock (kvselect's mock workers)")
	workloads := fs.String("workloads", strings.Join(c.Workloads, ","), "`workloads`, comma-separated: "+strings.Join(suite.Workloads, ", "))
	var shapeNames []string
	for _, s := range suite.Shapes {
		shapeNames = append(shapeNames, fmt.Sprintf("%s (--max-num-seqs %d, prefill %v a token)", s.Name, s.MaxNumSeqs, s.PrefillPerToken))
	}
	shapes := fs.String("shapes", suite.Shapes[0].Name+","+suite.Shapes[1].Name, "engine `shapes`, comma-separated: "+strings.Join(shapeNames, ", "))
	fs.IntVar(&c.Requests, "requests", 0, "requests per cell (0: the conversation cells' 500 and the generated workloads' whole traces)")
	ladder := fs.String("ladder-rates", "20,40,60", "the ladder workload's arrival `rates` (requests per second), one cell each")
	fs.IntVar(&c.Repeat, "repeat", c.Repeat, "`runs` of the first cell, for the run-to-run spread")
	cells := fs.String("cells", "", "the `cells` to run instead of -families × -shapes × -workloads, comma-separated: family/shape/workload, the ladder's as family/shape/ladder@rate (e.g. llmd-sim/seqs4/conversation,mock/seqs16-slow/ladder@40)")
	pickers := fs.String("pickers", "kvselect,kvselect-kvcost,kvselect-prefix,epp,epp-tuned", "pickers, as kvbench vs-epp -pickers")
	kvselectArgs := fs.String("kvselect-args", "", "extra kvselect `flags`, space-separated, for every cell")
	fs.DurationVar(&c.Base.Idle, "idle", c.Base.Idle, "idle window before each run's traffic")
	fs.DurationVar(&c.Base.Saturate, "saturate", c.Base.Saturate, "saturating loop after each run (0 skips it)")
	fs.BoolVar(&c.Base.Pin, "pin", c.Base.Pin, "pin each picker to CPU 0, the engines and load to CPU 1")
	fs.DurationVar(&c.Base.GoodputTTFT, "goodput-ttft", c.Base.GoodputTTFT, "goodput's TTFT objective (`duration`)")
	fs.DurationVar(&c.Base.GoodputITL, "goodput-itl", c.Base.GoodputITL, "goodput's inter-token latency objective (`duration`)")
	fs.BoolVar(&c.Quiet, "quiet", false, "no progress bars")
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		c.Families = nil
		for _, f := range benchflag.Split(*families) {
			c.Families = append(c.Families, fleet.Family(f))
		}
		c.Workloads, c.Shapes, c.Cells = benchflag.Split(*workloads), benchflag.Split(*shapes), benchflag.Split(*cells)
		c.Base.Pickers, c.Base.KVSelectArgs = benchflag.Split(*pickers), strings.Fields(*kvselectArgs)
		var err error
		if c.Base.FloorPicker, err = floorCommand(slices.Contains(c.Base.Pickers, vsepp.PickerFloor)); err != nil {
			return err
		}
		c.LadderRate = nil
		for _, r := range benchflag.Split(*ladder) {
			v, err := strconv.ParseFloat(r, 64)
			if err != nil || !(v > 0) {
				return fmt.Errorf("-ladder-rates: %q is not a positive rate", r)
			}
			c.LadderRate = append(c.LadderRate, v)
		}
		c.Args = strings.Join(args, " ")
		_, err = suite.Run(ctx, c, stdout, stderr)
		return err
	}
}
