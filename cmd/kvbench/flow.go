package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/kvselect/kvselect/bench/flowsim"
)

// flowReport is what `kvbench flow -json` writes.
type flowReport struct {
	Config flowsim.Config `json:"config"`
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
// long prompts and one with short prompts, in the simulation (bench/flowsim:
// kvselect's flow.Controller and busy test on a virtual clock).
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
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if !(*overload >= 1) {
		return errors.New("-overload must be at least 1")
	}
	for i := range c.Classes {
		c.Classes[i].OutputTokens = *output
	}
	if err := c.Validate(); err != nil {
		return err
	}
	rep := flowReport{Config: c, OverloadFactor: *overload}
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
	if *jsonOut == "" {
		return nil
	}
	out, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*jsonOut), 0o755); err != nil {
		return err
	}
	return os.WriteFile(*jsonOut, append(out, '\n'), 0o644)
}

func flowTable(w io.Writer, rep *flowReport) {
	c := rep.Config
	a, b := c.Classes[0], c.Classes[1]
	fmt.Fprintf(w, "\n%d workers, max_num_batched_tokens %d, queue threshold %g; A: %g req/s × %d tokens, B: %g req/s × %d tokens, priority -1: %g req/s × %d tokens; %d output tokens; %s of arrivals (simulation)\n",
		c.Workers, c.MaxNumBatchedTokens, c.QueueThreshold, a.Rate, a.PromptTokens, b.Rate, b.PromptTokens, c.Classes[2].Rate, c.Classes[2].PromptTokens, a.OutputTokens, c.Duration)
	alone := rep.Alone.Tenant(b.Tenant)
	fmt.Fprintf(w, "%s alone (unloaded): TTFT p50 %.1f ms, p90 %.1f ms\n", b.Tenant, alone.TTFTP50, alone.TTFTP90)
	for _, part := range []struct {
		title string
		rs    []flowsim.Result
	}{{"saturated", rep.Results}, {fmt.Sprintf("overloaded (A × %g)", rep.OverloadFactor), rep.Overload}} {
		fmt.Fprintf(w, "\n%s\n", part.title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "flow control\ttenant\tprio\tsent\tdone\texpired\tshed\twait p50 ms\twait p90 ms\twait max ms\tTTFT p50 ms\tTTFT p90 ms\tTTFT p90 / alone\tutilisation\t")
		for _, r := range part.rs {
			for _, t := range r.Tenants {
				ratio := ""
				if t.Tenant == b.Tenant && alone.TTFTP90 > 0 {
					ratio = fmt.Sprintf("%.1f×", t.TTFTP90/alone.TTFTP90)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t%.3f\t\n", r.Mode, t.Tenant, t.Priority, t.Sent, t.Finished,
					t.Expired, t.Shed, t.WaitP50, t.WaitP90, t.WaitMax, t.TTFTP50, t.TTFTP90, ratio, r.Utilisation)
			}
		}
		tw.Flush()
	}
}
