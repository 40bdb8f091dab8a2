package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/kvselect/kvselect/bench/flowsim"
	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
)

// flowReport is what `kvbench flow -json` writes.
type flowReport struct {
	Mode    string         `json:"mode"` // sim or real
	Speedup float64        `json:"speedup,omitempty"`
	Config  flowsim.Config `json:"config"`
	// Alone is the measured tenant's traffic by itself: its unloaded figures.
	Alone   flowsim.Result   `json:"alone"`
	Results []flowsim.Result `json:"results"`
	// Overload is the same comparison with tenant A's rate multiplied by
	// -overload: the queue grows to the TTL.
	OverloadFactor float64          `json:"overload_factor"`
	Overload       []flowsim.Result `json:"overload"`
}

// runFlow compares flow control off (Dynamo's fcfs queue), request-count
// fairness and cost fairness on a saturated pool shared by a tenant with
// long prompts and one with short prompts: in the simulation (bench/flowsim:
// kvselect's flow.Controller and busy test on a virtual clock) or with real
// processes (kvselect with --flow-control, mock workers, every request
// through the picker over ext_proc with its tenant and priority headers).
func runFlow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench flow", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := flowsim.DefaultConfig()
	a, b, shed := &c.Classes[0], &c.Classes[1], &c.Classes[2]
	fs.IntVar(&c.Workers, "workers", c.Workers, "`workers` in the pool")
	fs.IntVar(&c.MaxNumBatchedTokens, "max-num-batched-tokens", c.MaxNumBatchedTokens, "each worker's prefill chunk and busy-test capacity (`tokens`)")
	fs.Float64Var(&c.QueueThreshold, "queue-threshold", c.QueueThreshold, "DYN_ROUTER_QUEUE_THRESHOLD: a worker is busy above this `fraction` of max-num-batched-tokens in active prefill")
	fs.DurationVar(&c.PrefillPerToken, "prefill-per-token", c.PrefillPerToken, "prefill time per prompt token")
	fs.DurationVar(&c.DecodeStep, "decode-step", c.DecodeStep, "engine step time without prompt tokens")
	fs.DurationVar(&c.TTL, "ttl", c.TTL, "flow control's queue TTL (--flow-queue-ttl)")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "how long requests arrive (virtual time)")
	fs.Float64Var(&a.Rate, "a-rate", a.Rate, "tenant A's requests per second (Poisson)")
	fs.IntVar(&a.PromptTokens, "a-prompt", a.PromptTokens, "tenant A's prompt `tokens`")
	fs.Float64Var(&b.Rate, "b-rate", b.Rate, "tenant B's requests per second (Poisson)")
	fs.IntVar(&b.PromptTokens, "b-prompt", b.PromptTokens, "tenant B's prompt `tokens`")
	fs.Float64Var(&shed.Rate, "sheddable-rate", shed.Rate, "requests per second at priority -1 (sheddable)")
	output := fs.Int("output-tokens", a.OutputTokens, "output `tokens` of every request")
	overload := fs.Float64("overload", 1.3, "the second comparison multiplies tenant A's rate by this `factor`")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "random `seed` of the arrivals")
	jsonOut := fs.String("json", "", "write the results as JSON to this `file`")
	mode := fs.String("mode", "sim", "`sim` (bench/flowsim) or real (kvselect and mock worker processes; the saturated comparison only)")
	speedup := fs.Float64("speedup", 2, "real mode: every time (arrivals, prefill, decode) divided by this `factor`")
	var kvselectBin, workerBin string
	binaryFlags(fs, &kvselectBin, &workerBin)
	out := fs.String("out", "bench/out/flow", "real mode: `directory` for the processes' logs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case !(*overload >= 1):
		return errors.New("-overload must be at least 1")
	case *mode != "sim" && *mode != "real":
		return fmt.Errorf("-mode %q: want sim or real", *mode)
	case !(*speedup > 0):
		return errors.New("-speedup must be positive")
	}
	for i := range c.Classes {
		c.Classes[i].OutputTokens = *output
	}
	if err := c.Validate(); err != nil {
		return err
	}
	if *mode == "real" {
		rep := flowReport{Mode: "real", Speedup: *speedup, Config: c}
		real := flowReal{cfg: c, speedup: *speedup, kvselectBin: kvselectBin, workerBin: workerBin, out: *out}
		fmt.Fprintf(stderr, "real: %s alone...\n", b.Tenant)
		var err error
		if rep.Alone, err = real.run(ctx, c.Alone(b.Tenant), "off"); err != nil {
			return fmt.Errorf("%s alone: %w", b.Tenant, err)
		}
		for _, m := range flowsim.Modes {
			fmt.Fprintf(stderr, "real: flow control %s...\n", m)
			r, err := real.run(ctx, c, m)
			if err != nil {
				return fmt.Errorf("%s: %w", m, err)
			}
			rep.Results = append(rep.Results, r)
		}
		flowTable(stdout, &rep)
		return writeJSON(*jsonOut, rep)
	}
	rep := flowReport{Mode: "sim", Config: c, OverloadFactor: *overload}
	var err error
	if rep.Alone, err = flowsim.Run(ctx, c.Alone(b.Tenant), "off"); err != nil {
		return fmt.Errorf("%s alone: %w", b.Tenant, err)
	}
	over := c
	over.Classes = append([]flowsim.Class(nil), c.Classes...)
	over.Classes[0].Rate *= *overload
	for _, mode := range flowsim.Modes {
		r, err := flowsim.Run(ctx, c, mode)
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		rep.Results = append(rep.Results, r)
		if r, err = flowsim.Run(ctx, over, mode); err != nil {
			return fmt.Errorf("%s, overloaded: %w", mode, err)
		}
		rep.Overload = append(rep.Overload, r)
	}
	flowTable(stdout, &rep)
	return writeJSON(*jsonOut, rep)
}

// writeJSON writes v indented to path; nothing when path is empty.
func writeJSON(path string, v any) error {
	if path == "" {
		return nil
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(out, '\n'), 0o644)
}

func flowTable(w io.Writer, rep *flowReport) {
	c := rep.Config
	a, b := c.Classes[0], c.Classes[1]
	what := "simulation"
	if rep.Mode == "real" {
		what = fmt.Sprintf("real processes, times ÷ %g, reported at the simulated scale", rep.Speedup)
	}
	fmt.Fprintf(w, "\n%d workers, max_num_batched_tokens %d, queue threshold %g; A: %g req/s × %d tokens, B: %g req/s × %d tokens, priority -1: %g req/s × %d tokens; %d output tokens; %s of arrivals (%s)\n",
		c.Workers, c.MaxNumBatchedTokens, c.QueueThreshold, a.Rate, a.PromptTokens, b.Rate, b.PromptTokens, c.Classes[2].Rate, c.Classes[2].PromptTokens, a.OutputTokens, c.Duration, what)
	alone := rep.Alone.Tenant(b.Tenant)
	fmt.Fprintf(w, "%s alone (unloaded): TTFT p50 %.1f ms, p90 %.1f ms\n", b.Tenant, alone.TTFTP50, alone.TTFTP90)
	for _, part := range []struct {
		title string
		rs    []flowsim.Result
	}{{"saturated", rep.Results}, {fmt.Sprintf("overloaded (A × %g)", rep.OverloadFactor), rep.Overload}} {
		if len(part.rs) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s\n", part.title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "flow control\ttenant\tprio\tsent\tdone\texpired\tshed\twait p50 ms\twait p90 ms\twait max ms\tTTFT p50 ms\tTTFT p90 ms\tTTFT p90 / alone\tutilisation\t")
		for _, r := range part.rs {
			for _, t := range r.Tenants {
				ratio := ""
				if t.Tenant == b.Tenant && alone.TTFTP90 > 0 {
					ratio = fmt.Sprintf("%.1f×", t.TTFTP90/alone.TTFTP90)
				}
				util := "-"
				if rep.Mode == "sim" {
					util = fmt.Sprintf("%.3f", r.Utilisation)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t%s\t\n", r.Mode, t.Tenant, t.Priority, t.Sent, t.Finished,
					t.Expired, t.Shed, t.WaitP50, t.WaitP90, t.WaitMax, t.TTFTP50, t.TTFTP90, ratio, util)
			}
		}
		tw.Flush()
	}
}

// flowReal is the real-process run of one traffic.
type flowReal struct {
	cfg                    flowsim.Config
	speedup                float64
	kvselectBin, workerBin string
	out                    string
}

// run starts kvselect with --flow-control mode ("off": Dynamo's queue) and
// queueing at c.QueueThreshold, c.Workers mock workers whose chunked
// prefill stalls their decoding (the simulation's engine model), replays
// c's arrivals through the picker and relays every routed request to its
// worker. A request's wait is the time to the picker's decision.
func (p flowReal) run(ctx context.Context, c flowsim.Config, mode string) (flowsim.Result, error) {
	res := flowsim.Result{Mode: mode}
	if err := os.MkdirAll(p.out, 0o755); err != nil {
		return res, err
	}
	tag := "flow-" + mode
	if len(c.Classes) == 1 {
		tag = "flow-alone"
	}
	conf := filepath.Join(p.out, tag+".yaml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("router:\n  router_queue_threshold: %g\n", c.QueueThreshold)), 0o644); err != nil {
		return res, err
	}
	fl := &fleet{model: "mock-model", hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 1024}}}
	defer fl.stop()
	if err := fl.startKVSelect(ctx, p.out, tag+"-kvselect", p.kvselectBin, "--config", conf, "--flow-control", mode,
		"--flow-queue-ttl", (time.Duration(float64(c.TTL) / p.speedup)).String()); err != nil {
		return res, err
	}
	maxLen := 0
	for _, cl := range c.Classes {
		maxLen = max(maxLen, cl.PromptTokens+cl.OutputTokens+16)
	}
	for i := range c.Workers {
		if err := fl.startWorker(p.out, fmt.Sprintf("%s-worker-%d", tag, i+1), p.workerBin, i,
			"--max-model-len", strconv.Itoa(maxLen), "--max-num-batched-tokens", strconv.Itoa(c.MaxNumBatchedTokens),
			"--prefill-stalls-decode", "--prefill-slots", "1", "--decode-batch-slowdown", "0",
			"--prefill-time-per-token", c.PrefillPerToken.String(), "--decode-time-per-token", c.DecodeStep.String(),
			"--speedup", strconv.FormatFloat(p.speedup, 'g', -1, 64)); err != nil {
			return res, err
		}
	}
	if err := fl.waitWorkers(ctx, c.Workers, 60*time.Second); err != nil {
		return res, fmt.Errorf("%w (logs in %s)", err, p.out)
	}
	if err := fl.dialPicker(); err != nil {
		return res, err
	}
	rl := relay.Relay{Picker: envoysim.New(fl.conn), HTTP: fl.hc}
	scale := func(d time.Duration) time.Duration { return time.Duration(float64(d) * p.speedup) }
	arrivals := flowsim.Arrivals(c)
	outs := make([]flowsim.Outcome, len(arrivals))
	var mu sync.Mutex
	var firstErr error
	rnd := rand.New(rand.NewPCG(c.Seed, 2))
	begin := time.Now()
	var wg sync.WaitGroup
	for i, a := range arrivals {
		cl := c.Classes[a.Class]
		// Distinct prompts: the tenants share no prefix, as in the simulation.
		prompt := make([]uint32, cl.PromptTokens)
		for j := range prompt {
			prompt[j] = uint32(rnd.IntN(30000)) + 1
		}
		body, err := json.Marshal(map[string]any{"model": fl.model, "prompt": prompt, "max_tokens": cl.OutputTokens, "stream": true})
		if err != nil {
			return res, err
		}
		wg.Go(func() {
			if d := time.Until(begin.Add(time.Duration(float64(a.At) / p.speedup))); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return
				}
			}
			r, err := rl.Do(ctx, "/v1/completions", body,
				envoysim.Header{Key: "x-request-id", Value: fmt.Sprintf("flow-%d", i)},
				envoysim.Header{Key: extproc.HeaderFairnessID, Value: cl.Tenant},
				envoysim.Header{Key: extproc.HeaderPriority, Value: strconv.Itoa(cl.Priority)})
			o := flowsim.Outcome{Class: a.Class}
			switch {
			case err == nil && len(r.Events) == cl.OutputTokens:
				o.Finished, o.Wait, o.TTFT = true, scale(r.Pick), scale(r.TTFT)
			case r.Decision != nil && r.Decision.Immediate != nil && r.Decision.Immediate.Status == http.StatusTooManyRequests:
				body := string(r.Decision.Immediate.Body)
				o.Shed = strings.Contains(body, "sheddable")
				o.Expired = strings.Contains(body, "TTL")
				if !o.Shed && !o.Expired {
					err = fmt.Errorf("429 neither shed nor expired: %s", body)
				}
			case err == nil:
				err = fmt.Errorf("%d tokens streamed, want %d", len(r.Events), cl.OutputTokens)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil && !o.Shed && !o.Expired {
				firstErr = cmpErr(firstErr, fmt.Errorf("request %d (%s): %w", i, cl.Tenant, err))
			}
			outs[i] = o
		})
	}
	wg.Wait()
	if firstErr != nil {
		return res, firstErr
	}
	if err := fl.waitNoBookings(10 * time.Second); err != nil {
		return res, err
	}
	var err error
	res.Tenants, err = flowsim.Summarize(c, outs)
	return res, err
}
