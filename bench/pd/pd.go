// Package pd compares aggregated serving, always-remote prefill/decode
// disaggregation and conditional P/D on long-prompt, short-output chat
// sessions: in the simulation (bench/pdsim), or with real processes —
// kvselect's picker with conditional disaggregation from a config file, mock
// workers with their prefill/decode roles and llm-d's sidecar exchange,
// chunked prefill that stalls decoding and the KV transfer time, every
// request relayed as Envoy would, the decisions read from kvselect's
// metrics.
package pd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/pdsim"
	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/stats"
	"github.com/kvselect/kvselect/envoysim"
)

// Config is one comparison.
type Config struct {
	Mode string // "sim" or "real"
	// Sim is the traffic and the engine model, in both modes.
	Sim pdsim.Config
	// PrefillWorkers and DecodeWorkers make the P/D fleets; the aggregated
	// fleet has as many workers in all.
	PrefillWorkers, DecodeWorkers int
	// Speedup divides every time of the real mode (arrivals, prefill,
	// decode, transfer); its figures are reported at the simulated scale.
	Speedup float64
	fleet.Binaries
	Out string // the real mode's logs
	report.Files
}

// Defaults is `make bench-pd`'s simulation: two prefill and four decode
// workers, conditional P/D at Dynamo's thresholds.
func Defaults() Config {
	c := pdsim.DefaultConfig()
	c.EffISLThreshold, c.EffISLRatioThreshold = 2048, 0.7
	return Config{Mode: "sim", Sim: c, PrefillWorkers: 2, DecodeWorkers: 4, Speedup: 2, Out: "bench/out/pd"}
}

// Validate checks the configuration before anything runs.
func (c *Config) Validate() error {
	switch {
	case c.Mode != "sim" && c.Mode != "real":
		return fmt.Errorf("-mode %q: want sim or real", c.Mode)
	case c.PrefillWorkers < 1 || c.DecodeWorkers < 1:
		return errors.New("-prefill-workers and -decode-workers must be at least 1")
	case !(c.Speedup > 0):
		return errors.New("-speedup must be positive")
	}
	return nil
}

// Report is what -json writes.
type Report struct {
	Mode    string         `json:"mode"` // sim or real
	Config  pdsim.Config   `json:"config"`
	Speedup float64        `json:"speedup,omitempty"` // real: every time divided by it
	Results []pdsim.Result `json:"results"`
}

// Run runs the three fleets in c.Mode, prints the table and writes c.Files.
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) (*Report, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rep := &Report{Mode: c.Mode, Config: c.Sim}
	for _, s := range pdsim.Setups(c.PrefillWorkers, c.DecodeWorkers) {
		fmt.Fprintf(stderr, "%s: %s...\n", c.Mode, s.Name)
		var r pdsim.Result
		var err error
		if c.Mode == "sim" {
			r, err = pdsim.Run(ctx, c.Sim, s)
		} else {
			rep.Speedup = c.Speedup
			r, err = c.runReal(ctx, s)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		rep.Results = append(rep.Results, r)
	}
	rep.Table(stdout)
	return rep, c.Files.Write(rep, "", nil)
}

// Table prints one row per fleet.
func (rep *Report) Table(w io.Writer) {
	c := rep.Config
	what := "simulation"
	if rep.Mode == "real" {
		what = fmt.Sprintf("real processes, times ÷ %g", rep.Speedup)
	}
	fmt.Fprintf(w, "\n%d sessions × %d requests (%d-token first prompt; each follow-up repeats it, the %d output tokens and %d new tokens), %g sessions/s; %s\n\n",
		c.Sessions, c.Turns, c.FirstTokens, c.OutputTokens, c.FollowUpTokens, c.Rate, what)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "fleet\tTTFT p50 ms\tTTFT p90 ms\tITL p50 ms\tITL p90 ms\tITL p99 ms\toutput tok/s\treq/s\tremote\tlocal\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t%.2f\t%d\t%d\t\n", r.Setup.Name, r.TTFTP50Ms, r.TTFTP90Ms,
			r.ITLP50Ms, r.ITLP90Ms, r.ITLP99Ms, r.OutputTokensPS, r.RequestsPS, r.RemotePrefills, r.LocalPrefills)
	}
	tw.Flush()
}

// runReal starts kvselect (conditional disaggregation from a config file)
// and setup's mock workers with their roles, chunked prefill that stalls
// decoding, and the KV transfer time, replays the sessions through the
// picker and reads the decisions from kvselect's metrics.
func (p *Config) runReal(ctx context.Context, s pdsim.Setup) (pdsim.Result, error) {
	res := pdsim.Result{Setup: s}
	fl, err := p.startRealFleet(ctx, s)
	if err != nil {
		return res, err
	}
	defer fl.Stop()
	before, err := fl.KV.Metrics(ctx)
	if err != nil {
		return res, err
	}
	got, err := p.replayReal(ctx, fl)
	res.Requests = got.requests
	if err != nil {
		return res, err
	}
	// Every booking, decode and prefill, went with its response.
	if err := fl.KV.WaitNoBookings(ctx, 10*time.Second); err != nil {
		return res, err
	}
	if err := realDecisions(ctx, fl, s, before, &res); err != nil {
		return res, err
	}
	// Times are reported at the simulated scale (× speedup), comparable
	// with the simulation's.
	scale := func(samples []time.Duration, q float64) float64 {
		return float64(stats.Quantile(samples, q).Microseconds()) * p.Speedup / 1000
	}
	res.TTFTP50Ms, res.TTFTP90Ms, res.TTFTP99Ms = scale(got.ttfts, 0.5), scale(got.ttfts, 0.9), scale(got.ttfts, 0.99)
	res.ITLP50Ms, res.ITLP90Ms, res.ITLP99Ms = scale(got.itls, 0.5), scale(got.itls, 0.9), scale(got.itls, 0.99)
	res.MakespanS = got.elapsed.Seconds() * p.Speedup
	res.OutputTokensPS = float64(res.Requests*p.Sim.OutputTokens) / res.MakespanS
	res.RequestsPS = float64(res.Requests) / res.MakespanS
	return res, nil
}

// startRealFleet starts kvselect with setup s's router configuration and
// s's mock workers, each with its role, logging into p.Out.
func (p *Config) startRealFleet(ctx context.Context, s pdsim.Setup) (*fleet.Fleet, error) {
	c := p.Sim
	if err := os.MkdirAll(p.Out, 0o755); err != nil {
		return nil, err
	}
	tag := strings.NewReplacer(" ", "-", "/", "").Replace(s.Name)
	conf := filepath.Join(p.Out, tag+".yaml")
	if err := writeRouterConfig(conf, c, s); err != nil {
		return nil, err
	}
	maxLen := c.FirstTokens + (c.Turns-1)*(c.OutputTokens+c.FollowUpTokens) + c.OutputTokens + 16
	pool := 4*c.Sessions*maxLen/c.BlockSize + 1024 // no eviction during the run
	return fleet.Start(ctx, fleet.Config{Binaries: p.Binaries, Family: fleet.FamilyMock, Workers: s.Prefill + s.Decode,
		Dir: p.Out, Prefix: tag, KVSelectArgs: []string{"--config", conf},
		Engine: fleet.Engine{BlockSize: c.BlockSize, PoolBlocks: pool, PrefillPerToken: c.PrefillPerToken, DecodePerToken: c.DecodePerToken,
			Speedup: p.Speedup, Extra: []string{"--max-model-len", strconv.Itoa(maxLen), "--max-num-batched-tokens", strconv.Itoa(c.ChunkTokens),
				"--prefill-stalls-decode", "--prefill-slots", "1", "--decode-batch-slowdown", "0", "--kv-transfer-per-block", c.TransferPerBlock.String()}},
		PerWorker: func(i int) []string {
			switch {
			case i < s.Prefill:
				return []string{"--role", "prefill"}
			case s.Prefill > 0:
				return []string{"--role", "decode"}
			}
			return []string{"--role", "both"}
		}})
}

// writeRouterConfig writes kvselect's configuration file for setup s: its
// conditional disaggregation and c's thresholds.
func writeRouterConfig(path string, c pdsim.Config, s pdsim.Setup) error {
	router := fmt.Sprintf("router:\n  conditional_disagg_enabled: %v\n", s.Conditional)
	if c.EffISLThreshold > 0 {
		router += fmt.Sprintf("  conditional_disagg_eff_isl_threshold: %d\n", c.EffISLThreshold)
	}
	if c.EffISLRatioThreshold > 0 {
		router += fmt.Sprintf("  conditional_disagg_eff_isl_ratio_threshold: %g\n", c.EffISLRatioThreshold)
	}
	return os.WriteFile(path, []byte(router), 0o644)
}

// realSamples is what the real run's requests measured.
type realSamples struct {
	ttfts, itls []time.Duration
	requests    int // completed with every output token
	elapsed     time.Duration
}

// replayReal sends every session's requests through fl's picker at their
// arrival times and waits for all of them; the error is the first request's
// that failed or streamed too few tokens.
func (p *Config) replayReal(ctx context.Context, fl *fleet.Fleet) (realSamples, error) {
	c := p.Sim
	rl := fl.Relay()
	var (
		mu       sync.Mutex
		got      realSamples
		firstErr error
		wg       sync.WaitGroup
	)
	begin := time.Now()
	for _, rq := range realTraffic(c, p.Speedup) {
		wg.Go(func() {
			if d := time.Until(begin.Add(rq.at)); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return
				}
			}
			body, _ := json.Marshal(relay.Completion{Model: fl.Model, Prompt: rq.prompt, MaxTokens: c.OutputTokens, Stream: true})
			r, err := rl.Do(ctx, "/v1/completions", body, envoysim.Header{Key: "x-request-id", Value: rq.id})
			mu.Lock()
			defer mu.Unlock()
			if err == nil && len(r.Events) != c.OutputTokens {
				err = fmt.Errorf("%s: %d tokens streamed, want %d", rq.id, len(r.Events), c.OutputTokens)
			}
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("%s: %w", rq.id, err)
				}
				return
			}
			got.ttfts = append(got.ttfts, r.TTFT)
			got.itls = append(got.itls, r.ITLs()...)
			got.requests++
		})
	}
	wg.Wait()
	got.elapsed = time.Since(begin)
	return got, firstErr
}

// realDecisions reads, since kvselect's metrics before, its prefill
// decisions, and from the decode workers' metrics the prompt tokens they
// prefilled themselves and the KV blocks transferred to them.
func realDecisions(ctx context.Context, fl *fleet.Fleet, s pdsim.Setup, before promtext.Samples, res *pdsim.Result) error {
	after, err := fl.KV.Metrics(ctx)
	if err != nil {
		return err
	}
	d := after.Minus(before).ByLabel("kvselect_prefill_decisions_total", "decision")
	res.RemotePrefills, res.LocalPrefills = int(d["remote_prefill"]), int(d["local_prefill"])
	if s.Prefill == 0 {
		res.LocalPrefills = res.Requests // no prefill pool: nothing was decided
	}
	for _, w := range fl.Workers[s.Prefill:] {
		m, err := promtext.Scrape(ctx, fl.HTTP, "http://"+w+"/metrics")
		if err != nil {
			return err
		}
		res.DecodePrefilled += int(m.Sum("kvselect_mockworker_prefill_computed_tokens_total"))
		res.TransferBlocks += int(m.Sum("kvselect_mockworker_kv_transfer_blocks_total"))
	}
	return nil
}

// realRequest is one request of the real run.
type realRequest struct {
	id     string
	at     time.Duration
	prompt []uint32
}

// realTraffic is pdsim's traffic as token ids: session s's conversation is
// one token sequence, each turn a longer prefix of it; arrivals and think
// times divided by speedup.
func realTraffic(c pdsim.Config, speedup float64) []realRequest {
	rnd := rand.New(rand.NewPCG(c.Seed, 1))
	var out []realRequest
	at := time.Duration(0)
	for s := range c.Sessions {
		at += time.Duration(rnd.ExpFloat64() / c.Rate * float64(time.Second))
		n := c.FirstTokens + (c.Turns-1)*(c.OutputTokens+c.FollowUpTokens)
		conv := make([]uint32, n)
		for i := range conv {
			conv[i] = 1000 + uint32(xxh3.HashString(fmt.Sprintf("%d/%d/%d", c.Seed, s, i))%30000)
		}
		tokens := c.FirstTokens
		for turn := range c.Turns {
			if turn > 0 {
				tokens += c.OutputTokens + c.FollowUpTokens
			}
			out = append(out, realRequest{id: fmt.Sprintf("pd-s%d-t%d", s, turn),
				at: time.Duration(float64(at+time.Duration(turn)*c.ThinkTime) / speedup), prompt: conv[:tokens]})
		}
	}
	slices.SortStableFunc(out, func(a, b realRequest) int { return int(a.at - b.at) })
	return out
}
