// Package text measures how kvselect routes text prompts: a seeded
// multi-turn chat workload (Workload) through kvselect's ext_proc picker on
// mock worker processes, once per way of routing text:
//
//   - tokens: the client sends the engine's token ids (nvext.token_data),
//     the upper bound of what routing on ids can do;
//   - pool: --tokenize pool, the picker asks a worker's /tokenize;
//   - text: --tokenize off, the approximate character-block text index;
//   - round-robin: --policy round-robin, no cache awareness;
//   - pool-warm: the workload twice on one fleet, the second pass reported
//     (a warm tokenize cache); pool-completions and pool-forward: the
//     conversations as completions prompts, without and with
//     --tokenize-forward-ids.
//
// Each phase runs fresh processes (empty prefix caches, index, text index
// and tokenize cache). It reports the workers' prefix-cache hit rate, TTFT
// (client side, the pick included), the pick's latency, and from kvselect's
// /metrics the tokenize latency, its cache hit rate and the fallbacks.
package text

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/stats"
	"github.com/kvselect/kvselect/envoysim"
)

// Phases are every phase Run knows, in the order the docs list them.
var Phases = []string{"tokens", "pool", "text", "round-robin", "pool-warm", "pool-completions", "pool-forward"}

// Config is one comparison.
type Config struct {
	// Spec is the mock workers, whose pool is small enough that the
	// sessions evict each other; Out receives text.json and the logs.
	fleet.Spec
	Concurrency     int           // sessions in flight; each sends its turns one after another
	MaxOutput       int           // output tokens per request
	TokenizeTimeout time.Duration // kvselect's --tokenize-timeout in the pool phases
	KVSelectArgs    []string      // more kvselect flags, every phase
	Phases          []string
	Load            WorkloadConfig
}

// Defaults is the four-phase comparison on 4 workers.
func Defaults() Config {
	return Config{Spec: fleet.Spec{Family: fleet.FamilyMock, Workers: 4, Out: "bench/out/text",
		Engine: fleet.Engine{BlockSize: 16, PoolBlocks: 768, Speedup: 4, PrefillPerToken: 200 * time.Microsecond,
			DecodePerToken: 20 * time.Millisecond, Extra: []string{"--prefill-slots", "1"}}},
		Concurrency: 16, MaxOutput: 8, TokenizeTimeout: 20 * time.Millisecond, Phases: slices.Clone(Phases[:4]), Load: DefaultWorkload()}
}

// Validate checks the configuration before anything starts.
func (c *Config) Validate() error {
	for _, p := range c.Phases {
		if !slices.Contains(Phases, p) {
			return fmt.Errorf("-phases: unknown phase %q", p)
		}
	}
	switch {
	case c.Workers < 1 || c.Concurrency < 1 || c.Engine.PoolBlocks < 1 || c.Engine.BlockSize < 1 || c.MaxOutput < 1 || c.Load.Sessions < 1:
		return errors.New("-workers, -concurrency, -pool-blocks, -block-size, -max-output and -sessions must be positive")
	case !(c.Engine.Speedup > 0):
		return errors.New("-speedup must be positive")
	}
	return nil
}

// Phase is one way of routing text.
type Phase struct {
	Name          string  `json:"phase"`
	Requests      int     `json:"requests"`
	Errors        int     `json:"errors"`
	HitRate       float64 `json:"prefix_cache_hit_rate"`
	TTFTP50Ms     float64 `json:"ttft_p50_ms"`
	TTFTP90Ms     float64 `json:"ttft_p90_ms"`
	PickP50Us     float64 `json:"pick_p50_us"`
	PickP99Us     float64 `json:"pick_p99_us"`
	TokenizeP50Us float64 `json:"tokenize_p50_us,omitempty"`
	TokenizeP99Us float64 `json:"tokenize_p99_us,omitempty"`
	TokenizeCache float64 `json:"tokenize_cache_hit_rate,omitempty"`
	// The same latency of whole-request cache hits alone (warm cache).
	TokenizeHitP50Us float64            `json:"tokenize_cache_hit_p50_us,omitempty"`
	TokenizeHitP99Us float64            `json:"tokenize_cache_hit_p99_us,omitempty"`
	Tokenized        map[string]float64 `json:"tokenize_requests,omitempty"`
	Fallbacks        map[string]float64 `json:"tokenize_fallbacks,omitempty"`
	WallSeconds      float64            `json:"wall_seconds"`
}

// Report is text.json.
type Report struct {
	Sessions int     `json:"sessions"`
	Requests int     `json:"requests"`
	Workers  int     `json:"workers"`
	Phases   []Phase `json:"phases"`
}

// Run runs every phase on fresh processes, prints the table, writes
// text.json into c.Out and fails when a request failed.
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) (*Report, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return nil, err
	}
	sessions := Workload(c.Load)
	rep := &Report{Sessions: len(sessions), Workers: c.Workers}
	for _, s := range sessions {
		rep.Requests += len(s.Turns)
	}
	fmt.Fprintf(stderr, "text workload: %d sessions, %d requests, %d workers\n", rep.Sessions, rep.Requests, c.Workers)
	for _, name := range c.Phases {
		ph, err := runPhase(ctx, &c, name, sessions, stderr)
		if err != nil {
			return nil, fmt.Errorf("phase %s: %w", name, err)
		}
		rep.Phases = append(rep.Phases, ph)
	}
	rep.Table(stdout)
	path := filepath.Join(c.Out, "text.json")
	if err := report.WriteJSON(path, rep); err != nil {
		return rep, err
	}
	fmt.Fprintf(stdout, "\nwrote %s (logs in %s)\n", path, c.Out)
	for _, ph := range rep.Phases {
		if ph.Errors > 0 {
			return rep, fmt.Errorf("%s: %d of %d requests failed (see %s)", ph.Name, ph.Errors, ph.Requests, c.Out)
		}
	}
	return rep, nil
}

// startFleet starts a phase's kvselect, set up for the phase, and workers.
func startFleet(ctx context.Context, c *Config, phase string) (*fleet.Fleet, error) {
	var args []string
	switch phase {
	case "pool", "pool-completions", "pool-warm":
		args = append(args, "--tokenize", "pool", "--tokenize-timeout", c.TokenizeTimeout.String())
	case "pool-forward":
		args = append(args, "--tokenize", "pool", "--tokenize-timeout", c.TokenizeTimeout.String(), "--tokenize-forward-ids")
	case "round-robin":
		args = append(args, "--policy", "round-robin")
	}
	return fleet.Start(ctx, fleet.Config{Binaries: c.Binaries, Family: fleet.FamilyMock, Workers: c.Workers, Engine: c.Engine,
		Dir: c.Out, Prefix: phase, KVSelectArgs: append(args, c.KVSelectArgs...),
		HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * c.Concurrency}}})
}

// result is one request's measurements.
type result struct {
	ttft, pick time.Duration
}

func runPhase(ctx context.Context, c *Config, phase string, sessions []Session, stderr io.Writer) (Phase, error) {
	ph := Phase{Name: phase}
	fl, err := startFleet(ctx, c, phase)
	if err != nil {
		return ph, err
	}
	defer fl.Stop()
	rl := fl.Relay()
	var base baseline
	if phase == "pool-warm" {
		// A first pass warms the tokenize cache (and the workers); only the
		// second, every request a whole-request hit, is reported.
		if _, _, err := replay(ctx, c, fl, rl, phase+"-warmup", sessions, stderr); err != nil {
			return ph, err
		}
		if base, err = readBaseline(ctx, fl); err != nil {
			return ph, err
		}
	}
	start := time.Now()
	results, errs, err := replay(ctx, c, fl, rl, phase, sessions, stderr)
	ph.WallSeconds = time.Since(start).Seconds()
	ph.Requests, ph.Errors = len(results)+errs, errs
	if err != nil {
		return ph, err
	}
	var ttft, pick []time.Duration
	for _, r := range results {
		ttft, pick = append(ttft, r.ttft), append(pick, r.pick)
	}
	ph.TTFTP50Ms, ph.TTFTP90Ms = ms(stats.Quantile(ttft, 0.5)), ms(stats.Quantile(ttft, 0.9))
	ph.PickP50Us, ph.PickP99Us = us(stats.Quantile(pick, 0.5)), us(stats.Quantile(pick, 0.99))
	queries, hits, err := fl.CacheCounters(ctx)
	if err != nil {
		return ph, err
	}
	if queries -= base.queries; queries > 0 {
		ph.HitRate = (hits - base.hits) / queries
	}
	m, err := fl.KV.Metrics(ctx)
	if err != nil {
		return ph, err
	}
	m = m.Minus(base.kvselect)
	if total := m.Sum("kvselect_tokenize_requests_total"); total > 0 {
		const duration = "kvselect_tokenize_duration_seconds"
		ph.Tokenized, ph.Fallbacks = m.ByLabel("kvselect_tokenize_requests_total", "result"), m.ByLabel("kvselect_tokenize_fallbacks_total", "reason")
		ph.TokenizeCache = (ph.Tokenized["cache"] + ph.Tokenized["prefix_cache"]) / total
		ph.TokenizeP50Us = m.HistogramQuantile(duration, 0.5) * 1e6
		ph.TokenizeP99Us = m.HistogramQuantile(duration, 0.99) * 1e6
		hits := m.Where("result", "cache")
		ph.TokenizeHitP50Us = hits.HistogramQuantile(duration, 0.5) * 1e6
		ph.TokenizeHitP99Us = hits.HistogramQuantile(duration, 0.99) * 1e6
	}
	return ph, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

// replay plays every session through the picker, c.Concurrency sessions at
// a time, each session's turns in order, as Envoy does with the ext_proc
// filter: the pick, the request to the chosen worker with the picker's
// headers, the response back through the picker.
func replay(ctx context.Context, c *Config, fl *fleet.Fleet, rl *relay.Relay, phase string, sessions []Session, stderr io.Writer) ([]result, int, error) {
	completions := phase == "pool-forward" || phase == "pool-completions"
	var (
		mu      sync.Mutex
		results []result
		errs    int
		firstEr error
	)
	next := make(chan Session)
	var wg sync.WaitGroup
	for range c.Concurrency {
		wg.Go(func() {
			for s := range next {
				for turn, msgs := range s.Turns {
					if ctx.Err() != nil {
						return
					}
					body, path, err := requestBody(ctx, fl, msgs, phase, completions, c.MaxOutput)
					var r result
					if err == nil {
						var res relay.Result
						res, err = rl.Do(ctx, path, body, envoysim.Header{Key: "x-request-id", Value: fmt.Sprintf("%s-%d-%d", phase, s.ID, turn)})
						r = result{ttft: res.TTFT, pick: res.Pick}
					}
					mu.Lock()
					if err != nil {
						errs++
						if firstEr == nil {
							firstEr = err
						}
					} else {
						results = append(results, r)
					}
					done := len(results) + errs
					mu.Unlock()
					if done%100 == 0 {
						fmt.Fprintf(stderr, "  %s: %d requests\n", phase, done)
					}
				}
			}
		})
	}
	for _, s := range sessions {
		select {
		case next <- s:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	if firstEr != nil {
		fmt.Fprintf(stderr, "  %s: first error: %v\n", phase, firstEr)
	}
	return results, errs, ctx.Err()
}

// baseline is what the counters held before the measured pass.
type baseline struct {
	queries, hits float64
	kvselect      promtext.Samples
}

func readBaseline(ctx context.Context, fl *fleet.Fleet) (baseline, error) {
	var b baseline
	var err error
	if b.queries, b.hits, err = fl.CacheCounters(ctx); err != nil {
		return b, err
	}
	b.kvselect, err = fl.KV.Metrics(ctx)
	return b, err
}

// requestBody is a turn's request body: chat (the workload's shape), with
// the engine's ids in nvext.token_data for the tokens phase, or the same
// conversation flattened into a completions prompt.
func requestBody(ctx context.Context, fl *fleet.Fleet, msgs []Message, phase string, completions bool, maxOutput int) ([]byte, string, error) {
	body := map[string]any{"model": fleet.MockModel, "max_tokens": maxOutput, "stream": true,
		"stream_options": map[string]any{"include_usage": true}}
	path := "/v1/chat/completions"
	if completions {
		var b strings.Builder
		for _, m := range msgs {
			b.WriteString(m.Role + ": " + m.Content + "\n")
		}
		body["prompt"], path = b.String(), "/v1/completions"
	} else {
		body["messages"] = msgs
	}
	if phase == "tokens" {
		// The client knows its ids (it asked the engine, outside the
		// measured time): the upper bound of routing on ids.
		tb, _ := json.Marshal(map[string]any{"model": fleet.MockModel, "messages": msgs})
		status, answer, err := fleet.Call(ctx, fl.HTTP, http.MethodPost, "http://"+fl.Workers[0]+"/tokenize", tb)
		if err != nil {
			return nil, "", err
		}
		var tr struct {
			Tokens []uint32 `json:"tokens"`
		}
		if err := json.Unmarshal(answer, &tr); err != nil {
			return nil, "", fmt.Errorf("tokenize: %d %.200s: %w", status, answer, err)
		}
		body["nvext"] = map[string]any{"token_data": tr.Tokens}
	}
	b, err := json.Marshal(body)
	return b, path, err
}
