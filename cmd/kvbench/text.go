package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/stats"
	"github.com/kvselect/kvselect/envoysim"
)

// `kvbench text`: the text workload (textload.go) through kvselect's
// ext_proc picker on mock worker processes, once per way of routing text:
//
//   - tokens: the client sends the engine's token ids (nvext.token_data),
//     the upper bound of what routing on ids can do;
//   - pool: --tokenize pool, the picker asks a worker's /tokenize;
//   - text: --tokenize off, the approximate character-block text index;
//   - round-robin: --policy round-robin, no cache awareness.
//
// Each phase runs fresh processes (empty prefix caches, index, text index
// and tokenize cache). It reports the workers' prefix-cache hit rate, TTFT
// (client side, the pick included), the pick's latency, and from kvselect's
// /metrics the tokenize latency, its cache hit rate and the fallbacks.

type textConfig struct {
	kvselectBin, workerBin string
	workers                int
	concurrency            int
	poolBlocks, blockSize  int
	speedup                float64
	prefillPerToken        time.Duration
	decodePerToken         time.Duration
	maxOutput              int
	tokenizeTimeout        time.Duration
	kvselectArgs           []string // more kvselect flags, every phase
	phases                 []string
	out                    string
	load                   textWorkloadConfig
}

type textPhase struct {
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

type textReport struct {
	Sessions int         `json:"sessions"`
	Requests int         `json:"requests"`
	Workers  int         `json:"workers"`
	Phases   []textPhase `json:"phases"`
}

func runText(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench text", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := textConfig{load: defaultTextWorkload()}
	var phases string
	binaryFlags(fs, &c.kvselectBin, &c.workerBin)
	fs.IntVar(&c.workers, "workers", 4, "mock `workers` (processes)")
	fs.IntVar(&c.concurrency, "concurrency", 16, "`sessions` in flight; each sends its turns one after another")
	fs.IntVar(&c.poolBlocks, "pool-blocks", 768, "KV `blocks` per worker: small enough that the sessions evict each other")
	fs.IntVar(&c.blockSize, "block-size", 16, "KV block size in tokens")
	fs.Float64Var(&c.speedup, "speedup", 4, "workers' timing speed-up")
	fs.DurationVar(&c.prefillPerToken, "prefill-time-per-token", 200*time.Microsecond, "workers' prefill time per uncached prompt token (before -speedup)")
	fs.DurationVar(&c.decodePerToken, "decode-time-per-token", 20*time.Millisecond, "workers' time per output token (before -speedup)")
	fs.IntVar(&c.maxOutput, "max-output", 8, "output `tokens` per request")
	fs.DurationVar(&c.tokenizeTimeout, "tokenize-timeout", 20*time.Millisecond, "kvselect --tokenize-timeout in the pool phase")
	fs.StringVar(&phases, "phases", "tokens,pool,text,round-robin", "comma-separated `phases`: tokens, pool, text, round-robin; pool-warm (the workload twice on one fleet, the second pass reported: a warm tokenize cache); pool-completions and pool-forward (the conversations as completions prompts, without and with --tokenize-forward-ids)")
	fs.StringVar(&c.out, "out", "bench/out/text", "`directory` for text.json and the processes' logs")
	fs.Uint64Var(&c.load.seed, "seed", c.load.seed, "workload `seed`")
	extra := fs.String("kvselect-args", "", "more kvselect `flags` for every phase, space-separated")
	fs.IntVar(&c.load.sessions, "sessions", c.load.sessions, "chat `sessions`")
	fs.IntVar(&c.load.systemPrompts, "system-prompts", c.load.systemPrompts, "distinct long system `prompts`")
	fs.IntVar(&c.load.documents, "documents", c.load.documents, "distinct `documents` quoted into user turns")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c.phases = strings.Split(phases, ",")
	c.kvselectArgs = strings.Fields(*extra)
	for _, p := range c.phases {
		if !slices.Contains([]string{"tokens", "pool", "pool-warm", "pool-forward", "pool-completions", "text", "round-robin"}, p) {
			return fmt.Errorf("-phases: unknown phase %q", p)
		}
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.workers < 1 || c.concurrency < 1 || c.poolBlocks < 1 || c.blockSize < 1 || c.maxOutput < 1 || c.load.sessions < 1:
		return errors.New("-workers, -concurrency, -pool-blocks, -block-size, -max-output and -sessions must be positive")
	case !(c.speedup > 0):
		return errors.New("-speedup must be positive")
	}
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return err
	}
	sessions := textWorkload(c.load)
	rep := textReport{Sessions: len(sessions), Workers: c.workers}
	for _, s := range sessions {
		rep.Requests += len(s.Turns)
	}
	fmt.Fprintf(stderr, "text workload: %d sessions, %d requests, %d workers\n", rep.Sessions, rep.Requests, c.workers)
	for _, name := range c.phases {
		ph, err := runTextPhase(ctx, &c, name, sessions, stderr)
		if err != nil {
			return fmt.Errorf("phase %s: %w", name, err)
		}
		rep.Phases = append(rep.Phases, ph)
	}
	textTable(stdout, &rep)
	if err := report.WriteJSON(filepath.Join(c.out, "text.json"), rep); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nwrote %s (logs in %s)\n", filepath.Join(c.out, "text.json"), c.out)
	for _, ph := range rep.Phases {
		if ph.Errors > 0 {
			return fmt.Errorf("%s: %d of %d requests failed (see %s)", ph.Name, ph.Errors, ph.Requests, c.out)
		}
	}
	return nil
}

// textFleet is one phase's processes.
type textFleet struct{ fleet }

func startTextFleet(ctx context.Context, c *textConfig, phase string) (*textFleet, error) {
	fl := &textFleet{fleet{hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * c.concurrency}}}}
	ok := false
	defer func() {
		if !ok {
			fl.stop()
		}
	}()
	var args []string
	switch phase {
	case "pool", "pool-completions", "pool-warm":
		args = append(args, "--tokenize", "pool", "--tokenize-timeout", c.tokenizeTimeout.String())
	case "pool-forward":
		args = append(args, "--tokenize", "pool", "--tokenize-timeout", c.tokenizeTimeout.String(), "--tokenize-forward-ids")
	case "round-robin":
		args = append(args, "--policy", "round-robin")
	}
	args = append(args, c.kvselectArgs...)
	if err := fl.startKVSelect(ctx, c.out, phase+"-kvselect", c.kvselectBin, args...); err != nil {
		return nil, err
	}
	for i := range c.workers {
		if err := fl.startWorker(c.out, fmt.Sprintf("%s-worker-%d", phase, i+1), c.workerBin, i,
			"--block-size", strconv.Itoa(c.blockSize), "--num-gpu-blocks", strconv.Itoa(c.poolBlocks),
			"--speedup", strconv.FormatFloat(c.speedup, 'g', -1, 64), "--prefill-slots", "1",
			"--prefill-time-per-token", c.prefillPerToken.String(), "--decode-time-per-token", c.decodePerToken.String()); err != nil {
			return nil, err
		}
	}
	if err := fl.waitWorkers(ctx, c.workers, 60*time.Second); err != nil {
		return nil, fmt.Errorf("%w (logs in %s)", err, c.out)
	}
	if err := fl.dialPicker(); err != nil {
		return nil, err
	}
	ok = true
	return fl, nil
}

// textResult is one request's measurements.
type textResult struct {
	ttft, pick time.Duration
}

func runTextPhase(ctx context.Context, c *textConfig, phase string, sessions []textSession, stderr io.Writer) (textPhase, error) {
	ph := textPhase{Name: phase}
	fl, err := startTextFleet(ctx, c, phase)
	if err != nil {
		return ph, err
	}
	defer fl.stop()
	client := envoysim.New(fl.conn)
	var base textBaseline
	if phase == "pool-warm" {
		// A first pass warms the tokenize cache (and the workers); only the
		// second, every request a whole-request hit, is reported.
		if _, _, err := replayText(ctx, c, fl, client, phase+"-warmup", sessions, stderr); err != nil {
			return ph, err
		}
		var err error
		if base, err = fl.baseline(); err != nil {
			return ph, err
		}
	}
	start := time.Now()
	results, errs, err := replayText(ctx, c, fl, client, phase, sessions, stderr)
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
	queries, hits, err := fl.cacheCounters()
	if err != nil {
		return ph, err
	}
	if queries -= base.queries; queries > 0 {
		ph.HitRate = (hits - base.hits) / queries
	}
	m, err := promtext.Scrape(ctx, fl.hc, fl.rest+"/metrics")
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

// replayText plays every session through the picker, c.concurrency sessions
// at a time, each session's turns in order.
func replayText(ctx context.Context, c *textConfig, fl *textFleet, client *envoysim.Client, phase string, sessions []textSession, stderr io.Writer) ([]textResult, int, error) {
	completions := phase == "pool-forward" || phase == "pool-completions"
	var (
		mu      sync.Mutex
		results []textResult
		errs    int
		firstEr error
	)
	next := make(chan textSession)
	var wg sync.WaitGroup
	for range c.concurrency {
		wg.Go(func() {
			for s := range next {
				for turn, msgs := range s.Turns {
					if ctx.Err() != nil {
						return
					}
					body, path, err := textBody(ctx, fl, msgs, phase, completions, c.maxOutput)
					var r textResult
					if err == nil {
						r, err = fl.viaPicker(ctx, client, path, body, fmt.Sprintf("%s-%d-%d", phase, s.ID, turn))
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

// textBaseline is what the counters held before the measured pass.
type textBaseline struct {
	queries, hits float64
	kvselect      promtext.Samples
}

func (fl *textFleet) baseline() (textBaseline, error) {
	var b textBaseline
	var err error
	if b.queries, b.hits, err = fl.cacheCounters(); err != nil {
		return b, err
	}
	b.kvselect, err = promtext.Scrape(context.Background(), fl.hc, fl.rest+"/metrics")
	return b, err
}

// textBody is a turn's request body: chat (the workload's shape), with the
// engine's ids in nvext.token_data for the tokens phase, or the same
// conversation flattened into a completions prompt.
func textBody(ctx context.Context, fl *textFleet, msgs []chatMsg, phase string, completions bool, maxOutput int) ([]byte, string, error) {
	body := map[string]any{"model": "mock-model", "max_tokens": maxOutput, "stream": true,
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
		tb, _ := json.Marshal(map[string]any{"model": "mock-model", "messages": msgs})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+fl.workers[0]+"/tokenize", bytes.NewReader(tb))
		if err != nil {
			return nil, "", err
		}
		req.Header.Set("content-type", "application/json")
		resp, err := fl.hc.Do(req)
		if err != nil {
			return nil, "", err
		}
		var tr struct {
			Tokens []uint32 `json:"tokens"`
		}
		err = json.NewDecoder(resp.Body).Decode(&tr)
		resp.Body.Close()
		if err != nil {
			return nil, "", err
		}
		body["nvext"] = map[string]any{"token_data": tr.Tokens}
	}
	b, err := json.Marshal(body)
	return b, path, err
}

// viaPicker runs one request as Envoy does with the ext_proc filter: the pick,
// the request to the chosen worker with the picker's headers, the response
// back through the picker (bench/relay).
func (fl *textFleet) viaPicker(ctx context.Context, client *envoysim.Client, path string, body []byte, id string) (textResult, error) {
	r := relay.Relay{Picker: client, HTTP: fl.hc}
	res, err := r.Do(ctx, path, body, envoysim.Header{Key: "x-request-id", Value: id})
	return textResult{ttft: res.TTFT, pick: res.Pick}, err
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

func textTable(w io.Writer, rep *textReport) {
	fmt.Fprintf(w, "\n%d chat sessions (%d requests) over %d mock workers, each phase from empty caches:\n\n", rep.Sessions, rep.Requests, rep.Workers)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\thit rate\tTTFT p50 ms\tTTFT p90 ms\tpick p50 µs\tpick p99 µs\ttokenize p50 µs\ttokenize p99 µs\tcache-hit p50 µs\ttokenize cache\tfallbacks\terrors\t")
	for _, ph := range rep.Phases {
		fb := 0.0
		for _, v := range ph.Fallbacks {
			fb += v
		}
		tok := "-\t-\t-\t-\t-"
		if ph.Tokenized != nil {
			hit := "-"
			if ph.Tokenized["cache"] > 0 {
				hit = fmt.Sprintf("%.0f", ph.TokenizeHitP50Us)
			}
			tok = fmt.Sprintf("%.0f\t%.0f\t%s\t%.1f%%\t%.0f", ph.TokenizeP50Us, ph.TokenizeP99Us, hit, 100*ph.TokenizeCache, fb)
		}
		fmt.Fprintf(tw, "%s\t%.1f%%\t%.1f\t%.1f\t%.0f\t%.0f\t%s\t%d\t\n", ph.Name, 100*ph.HitRate, ph.TTFTP50Ms, ph.TTFTP90Ms,
			ph.PickP50Us, ph.PickP99Us, tok, ph.Errors)
	}
	tw.Flush()
}
