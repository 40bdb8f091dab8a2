// Package flow compares flow control off (Dynamo's fcfs queue),
// request-count fairness and cost fairness on a saturated pool shared by a
// tenant with long prompts and one with short prompts: in the simulation
// (bench/flowsim: kvselect's flow.Controller and busy test on a virtual
// clock), saturated and overloaded, or with real processes (kvselect with
// --flow-control, mock workers whose chunked prefill stalls their decoding,
// every request through the picker over ext_proc with its tenant and
// priority headers), saturated only.
package flow

import (
	"context"
	"encoding/json"
	"errors"
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

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/flowsim"
	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
)

// Config is one comparison.
type Config struct {
	Mode string // "sim" or "real"
	// Sim is the traffic and the engine model, in both modes.
	Sim flowsim.Config
	// Overload multiplies tenant A's rate for the simulation's second
	// comparison: the queue grows to the TTL.
	Overload float64
	// Speedup divides every time of the real mode (arrivals, prefill,
	// decode); its figures are reported at the simulated scale.
	Speedup float64
	fleet.Binaries
	Out string // the real mode's logs
	report.Files
}

// Defaults is `make bench-flow`'s simulation.
func Defaults() Config {
	return Config{Mode: "sim", Sim: flowsim.DefaultConfig(), Overload: 1.3, Speedup: 2, Out: "bench/out/flow"}
}

// Validate checks the configuration before anything runs.
func (c *Config) Validate() error {
	switch {
	case !(c.Overload >= 1):
		return errors.New("-overload must be at least 1")
	case c.Mode != "sim" && c.Mode != "real":
		return fmt.Errorf("-mode %q: want sim or real", c.Mode)
	case !(c.Speedup > 0):
		return errors.New("-speedup must be positive")
	}
	return c.Sim.Validate()
}

// Report is what -json writes.
type Report struct {
	Mode    string         `json:"mode"` // sim or real
	Speedup float64        `json:"speedup,omitempty"`
	Config  flowsim.Config `json:"config"`
	// Alone is the measured tenant's traffic by itself: its unloaded figures.
	Alone   flowsim.Result   `json:"alone"`
	Results []flowsim.Result `json:"results"`
	// Overload is the same comparison with tenant A's rate multiplied by
	// the overload factor: the queue grows to the TTL.
	OverloadFactor float64          `json:"overload_factor"`
	Overload       []flowsim.Result `json:"overload"`
}

// Run runs the comparison in c.Mode, prints the table and writes c.Files.
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) (*Report, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var rep *Report
	var err error
	if c.Mode == "real" {
		rep, err = c.runReal(ctx, stderr)
	} else {
		rep, err = c.runSim(ctx)
	}
	if err != nil {
		return nil, err
	}
	rep.Table(stdout)
	return rep, c.Files.Write(rep, "", nil)
}

// runSim is the measured tenant alone, then every mode saturated and
// overloaded.
func (c *Config) runSim(ctx context.Context) (*Report, error) {
	s, b := c.Sim, c.Sim.Classes[1]
	rep := &Report{Mode: "sim", Config: s, OverloadFactor: c.Overload}
	var err error
	if rep.Alone, err = flowsim.Run(ctx, s.Alone(b.Tenant), "off"); err != nil {
		return nil, fmt.Errorf("%s alone: %w", b.Tenant, err)
	}
	over := s
	over.Classes = append([]flowsim.Class(nil), s.Classes...)
	over.Classes[0].Rate *= c.Overload
	for _, mode := range flowsim.Modes {
		r, err := flowsim.Run(ctx, s, mode)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", mode, err)
		}
		rep.Results = append(rep.Results, r)
		if r, err = flowsim.Run(ctx, over, mode); err != nil {
			return nil, fmt.Errorf("%s, overloaded: %w", mode, err)
		}
		rep.Overload = append(rep.Overload, r)
	}
	return rep, nil
}

// runReal is the measured tenant alone, then every mode saturated, each on
// fresh processes.
func (c *Config) runReal(ctx context.Context, stderr io.Writer) (*Report, error) {
	s, b := c.Sim, c.Sim.Classes[1]
	rep := &Report{Mode: "real", Speedup: c.Speedup, Config: s}
	fmt.Fprintf(stderr, "real: %s alone...\n", b.Tenant)
	var err error
	if rep.Alone, err = c.realRun(ctx, s.Alone(b.Tenant), "off"); err != nil {
		return nil, fmt.Errorf("%s alone: %w", b.Tenant, err)
	}
	for _, m := range flowsim.Modes {
		fmt.Fprintf(stderr, "real: flow control %s...\n", m)
		r, err := c.realRun(ctx, s, m)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m, err)
		}
		rep.Results = append(rep.Results, r)
	}
	return rep, nil
}

// Table prints the measured tenant alone, then each comparison.
func (rep *Report) Table(w io.Writer) {
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

// realRun starts kvselect with --flow-control mode ("off": Dynamo's queue)
// and queueing at s.QueueThreshold, s.Workers mock workers whose chunked
// prefill stalls their decoding (the simulation's engine model), replays s's
// arrivals through the picker and relays every routed request to its
// worker. A request's wait is the time to the picker's decision.
func (c *Config) realRun(ctx context.Context, s flowsim.Config, mode string) (flowsim.Result, error) {
	res := flowsim.Result{Mode: mode}
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return res, err
	}
	tag := "flow-" + mode
	if len(s.Classes) == 1 {
		tag = "flow-alone"
	}
	conf := filepath.Join(c.Out, tag+".yaml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("router:\n  router_queue_threshold: %g\n", s.QueueThreshold)), 0o644); err != nil {
		return res, err
	}
	maxLen := 0
	for _, cl := range s.Classes {
		maxLen = max(maxLen, cl.PromptTokens+cl.OutputTokens+16)
	}
	fl, err := fleet.Start(ctx, fleet.Config{Binaries: c.Binaries, Family: fleet.FamilyMock, Workers: s.Workers, Dir: c.Out, Prefix: tag,
		KVSelectArgs: flowArgs(conf, mode, time.Duration(float64(s.TTL)/c.Speedup)),
		Engine: fleet.Engine{PrefillPerToken: s.PrefillPerToken, DecodePerToken: s.DecodeStep, Speedup: c.Speedup,
			Extra: []string{"--max-model-len", strconv.Itoa(maxLen), "--max-num-batched-tokens", strconv.Itoa(s.MaxNumBatchedTokens),
				"--prefill-stalls-decode", "--prefill-slots", "1", "--decode-batch-slowdown", "0"}}})
	if err != nil {
		return res, err
	}
	defer fl.Stop()
	rl := fl.Relay()
	scale := func(d time.Duration) time.Duration { return time.Duration(float64(d) * c.Speedup) }
	arrivals := flowsim.Arrivals(s)
	outs := make([]flowsim.Outcome, len(arrivals))
	var mu sync.Mutex
	var firstErr error
	rnd := rand.New(rand.NewPCG(s.Seed, 2))
	begin := time.Now()
	var wg sync.WaitGroup
	for i, a := range arrivals {
		cl := s.Classes[a.Class]
		// Distinct prompts: the tenants share no prefix, as in the simulation.
		prompt := make([]uint32, cl.PromptTokens)
		for j := range prompt {
			prompt[j] = uint32(rnd.IntN(30000)) + 1
		}
		body, err := json.Marshal(relay.Completion{Model: fl.Model, Prompt: prompt, MaxTokens: cl.OutputTokens, Stream: true})
		if err != nil {
			return res, err
		}
		wg.Go(func() {
			if d := time.Until(begin.Add(time.Duration(float64(a.At) / c.Speedup))); d > 0 {
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
			if err != nil && !o.Shed && !o.Expired && firstErr == nil {
				firstErr = fmt.Errorf("request %d (%s): %w", i, cl.Tenant, err)
			}
			outs[i] = o
		})
	}
	wg.Wait()
	if firstErr != nil {
		return res, firstErr
	}
	if err := fl.KV.WaitNoBookings(ctx, 10*time.Second); err != nil {
		return res, err
	}
	res.Tenants, err = flowsim.Summarize(s, outs)
	return res, err
}

// flowArgs are kvselect's flags for one run: the queue TTL only with flow
// control on, since kvselect refuses it with --flow-control off.
func flowArgs(conf, mode string, ttl time.Duration) []string {
	args := []string{"--config", conf, "--flow-control", mode}
	if mode != "off" {
		args = append(args, "--flow-queue-ttl", ttl.String())
	}
	return args
}
