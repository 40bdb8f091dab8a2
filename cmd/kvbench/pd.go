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
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvselect/kvselect/bench/pdsim"
	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/bench/stats"
	"github.com/kvselect/kvselect/envoysim"
)

// pdReport is what `kvbench pd -json` writes.
type pdReport struct {
	Mode    string         `json:"mode"` // sim or real
	Config  pdsim.Config   `json:"config"`
	Speedup float64        `json:"speedup,omitempty"` // real: every time divided by it
	Results []pdsim.Result `json:"results"`
}

// runPD compares aggregated serving, always-remote P/D and conditional P/D on
// long-prompt, short-output chat sessions: in the simulation (bench/pdsim), or
// with real processes — kvselect's picker, mock workers with their prefill/
// decode roles and llm-d's sidecar exchange, requests relayed as Envoy would.
func runPD(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench pd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := pdsim.DefaultConfig()
	c := def
	mode := fs.String("mode", "sim", "`sim` (the discrete-event simulation, bench/pdsim) or real (kvselect and mock worker processes)")
	prefill := fs.Int("prefill-workers", 2, "prefill `workers` of the P/D fleets (the aggregated fleet has prefill+decode workers)")
	decode := fs.Int("decode-workers", 4, "decode `workers` of the P/D fleets")
	fs.IntVar(&c.Sessions, "sessions", def.Sessions, "chat `sessions`")
	fs.IntVar(&c.Turns, "turns", def.Turns, "requests per session; each repeats the conversation so far")
	fs.IntVar(&c.FirstTokens, "first-tokens", def.FirstTokens, "prompt `tokens` of a session's first request")
	fs.IntVar(&c.FollowUpTokens, "follow-up-tokens", def.FollowUpTokens, "new prompt `tokens` of every later request")
	fs.IntVar(&c.OutputTokens, "output-tokens", def.OutputTokens, "output `tokens` per request")
	fs.IntVar(&c.BlockSize, "block-size", def.BlockSize, "KV block size in tokens")
	fs.Float64Var(&c.Rate, "rate", def.Rate, "sessions starting per second (Poisson)")
	fs.DurationVar(&c.ThinkTime, "think-time", def.ThinkTime, "time between a session's requests")
	fs.DurationVar(&c.PrefillPerToken, "prefill-per-token", def.PrefillPerToken, "prefill time per uncached prompt token")
	fs.DurationVar(&c.DecodePerToken, "decode-per-token", def.DecodePerToken, "decode step time (inter-token latency without prefill interference)")
	fs.DurationVar(&c.TransferPerBlock, "transfer-per-block", def.TransferPerBlock, "time to move one KV block from the prefill worker to the decode worker")
	fs.IntVar(&c.ChunkTokens, "chunk-tokens", def.ChunkTokens, "prefill chunk (vLLM's max_num_batched_tokens): a step carries at most this many prompt tokens")
	fs.Uint64Var(&c.Seed, "seed", def.Seed, "random `seed` of the traffic and the services")
	fs.IntVar(&c.EffISLThreshold, "eff-isl-threshold", 2048, "conditional P/D: prefill locally only below this many uncached `tokens` (DYN_ROUTER_CONDITIONAL_DISAGG_EFF_ISL_THRESHOLD)")
	fs.Float64Var(&c.EffISLRatioThreshold, "eff-isl-ratio-threshold", 0.7, "conditional P/D: ... and below this uncached share of the prompt (DYN_ROUTER_CONDITIONAL_DISAGG_EFF_ISL_RATIO_THRESHOLD)")
	speedup := fs.Float64("speedup", 2, "real mode: every time (arrivals, prefill, decode, transfer) divided by this `factor`")
	var kvselectBin, workerBin string
	binaryFlags(fs, &kvselectBin, &workerBin)
	out := fs.String("out", "bench/out/pd", "real mode: `directory` for the processes' logs")
	jsonOut := fs.String("json", "", "write the results as JSON to this `file`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case *mode != "sim" && *mode != "real":
		return fmt.Errorf("-mode %q: want sim or real", *mode)
	case *prefill < 1 || *decode < 1:
		return errors.New("-prefill-workers and -decode-workers must be at least 1")
	case !(*speedup > 0):
		return errors.New("-speedup must be positive")
	}
	rep := pdReport{Mode: *mode, Config: c}
	for _, s := range pdsim.Setups(*prefill, *decode) {
		fmt.Fprintf(stderr, "%s: %s...\n", *mode, s.Name)
		var r pdsim.Result
		var err error
		if *mode == "sim" {
			r, err = pdsim.Run(ctx, c, s)
		} else {
			rep.Speedup = *speedup
			r, err = runPDReal(ctx, pdReal{cfg: c, setup: s, speedup: *speedup, kvselectBin: kvselectBin, workerBin: workerBin, out: *out})
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s.Name, err)
		}
		rep.Results = append(rep.Results, r)
	}
	pdTable(stdout, &rep)
	return writeJSON(*jsonOut, rep)
}

func pdTable(w io.Writer, rep *pdReport) {
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

// pdReal is one real-process run.
type pdReal struct {
	cfg                    pdsim.Config
	setup                  pdsim.Setup
	speedup                float64
	kvselectBin, workerBin string
	out                    string
}

// runPDReal starts kvselect (conditional disaggregation from a config file)
// and the fleet's mock workers with their roles, chunked prefill that stalls
// decoding, and the KV transfer time, replays the sessions through the picker
// and reads the decisions from kvselect's metrics.
func runPDReal(ctx context.Context, p pdReal) (pdsim.Result, error) {
	c, s := p.cfg, p.setup
	res := pdsim.Result{Setup: s}
	if err := os.MkdirAll(p.out, 0o755); err != nil {
		return res, err
	}
	tag := strings.NewReplacer(" ", "-", "/", "").Replace(s.Name)
	conf := filepath.Join(p.out, tag+".yaml")
	router := fmt.Sprintf("router:\n  conditional_disagg_enabled: %v\n", s.Conditional)
	if c.EffISLThreshold > 0 {
		router += fmt.Sprintf("  conditional_disagg_eff_isl_threshold: %d\n", c.EffISLThreshold)
	}
	if c.EffISLRatioThreshold > 0 {
		router += fmt.Sprintf("  conditional_disagg_eff_isl_ratio_threshold: %g\n", c.EffISLRatioThreshold)
	}
	if err := os.WriteFile(conf, []byte(router), 0o644); err != nil {
		return res, err
	}
	workers := s.Prefill + s.Decode
	fl := &fleet{model: "mock-model", hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 1024}}}
	defer fl.stop()
	if err := fl.startKVSelect(ctx, p.out, tag+"-kvselect", p.kvselectBin, "--config", conf); err != nil {
		return res, err
	}
	maxLen := c.FirstTokens + (c.Turns-1)*(c.OutputTokens+c.FollowUpTokens) + c.OutputTokens + 16
	pool := 4*c.Sessions*maxLen/c.BlockSize + 1024 // no eviction during the run
	for i := range workers {
		role := "both"
		switch {
		case i < s.Prefill:
			role = "prefill"
		case s.Prefill > 0:
			role = "decode"
		}
		if err := fl.startWorker(p.out, fmt.Sprintf("%s-worker-%d", tag, i+1), p.workerBin, i, "--role", role, "--block-size", strconv.Itoa(c.BlockSize),
			"--num-gpu-blocks", strconv.Itoa(pool), "--max-model-len", strconv.Itoa(maxLen), "--max-num-batched-tokens", strconv.Itoa(c.ChunkTokens),
			"--prefill-stalls-decode", "--prefill-slots", "1", "--decode-batch-slowdown", "0",
			"--prefill-time-per-token", c.PrefillPerToken.String(), "--decode-time-per-token", c.DecodePerToken.String(),
			"--kv-transfer-per-block", c.TransferPerBlock.String(), "--speedup", strconv.FormatFloat(p.speedup, 'g', -1, 64)); err != nil {
			return res, err
		}
	}
	if err := fl.waitWorkers(ctx, workers, 60*time.Second); err != nil {
		return res, fmt.Errorf("%w (logs in %s)", err, p.out)
	}
	if err := fl.dialPicker(); err != nil {
		return res, err
	}
	before, err := promtext.Scrape(ctx, fl.hc, fl.rest+"/metrics")
	if err != nil {
		return res, err
	}
	rl := relay.Relay{Picker: envoysim.New(fl.conn), HTTP: fl.hc}
	var mu sync.Mutex
	var ttfts, itls []time.Duration
	var firstErr error
	begin := time.Now()
	var wg sync.WaitGroup
	for _, rq := range pdRealTraffic(c, p.speedup) {
		wg.Go(func() {
			if d := time.Until(begin.Add(rq.at)); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return
				}
			}
			body, _ := json.Marshal(map[string]any{"model": fl.model, "prompt": rq.prompt, "max_tokens": c.OutputTokens, "stream": true})
			r, err := rl.Do(ctx, "/v1/completions", body, envoysim.Header{Key: "x-request-id", Value: rq.id})
			mu.Lock()
			defer mu.Unlock()
			if err == nil && len(r.Events) != c.OutputTokens {
				err = fmt.Errorf("%s: %d tokens streamed, want %d", rq.id, len(r.Events), c.OutputTokens)
			}
			if err != nil {
				firstErr = cmpErr(firstErr, fmt.Errorf("%s: %w", rq.id, err))
				return
			}
			ttfts = append(ttfts, r.TTFT)
			itls = append(itls, r.ITLs()...)
			res.Requests++
		})
	}
	wg.Wait()
	elapsed := time.Since(begin)
	if firstErr != nil {
		return res, firstErr
	}
	// Every booking, decode and prefill, went with its response.
	if err := fl.waitNoBookings(10 * time.Second); err != nil {
		return res, err
	}
	after, err := promtext.Scrape(ctx, fl.hc, fl.rest+"/metrics")
	if err != nil {
		return res, err
	}
	d := after.Minus(before).ByLabel("kvselect_prefill_decisions_total", "decision")
	res.RemotePrefills, res.LocalPrefills = int(d["remote_prefill"]), int(d["local_prefill"])
	if s.Prefill == 0 {
		res.LocalPrefills = res.Requests // no prefill pool: nothing was decided
	}
	for _, w := range fl.workers[s.Prefill:] {
		m, err := promtext.Scrape(ctx, fl.hc, "http://"+w+"/metrics")
		if err != nil {
			return res, err
		}
		res.DecodePrefilled += int(m.Sum("kvselect_mockworker_prefill_computed_tokens_total"))
		res.TransferBlocks += int(m.Sum("kvselect_mockworker_kv_transfer_blocks_total"))
	}
	// Times are reported at the simulated scale (× speedup), comparable
	// with the simulation's.
	scale := func(q time.Duration) float64 { return float64(q.Microseconds()) * p.speedup / 1000 }
	res.TTFTP50Ms, res.TTFTP90Ms, res.TTFTP99Ms = scale(stats.Quantile(ttfts, 0.5)), scale(stats.Quantile(ttfts, 0.9)), scale(stats.Quantile(ttfts, 0.99))
	res.ITLP50Ms, res.ITLP90Ms, res.ITLP99Ms = scale(stats.Quantile(itls, 0.5)), scale(stats.Quantile(itls, 0.9)), scale(stats.Quantile(itls, 0.99))
	res.MakespanS = elapsed.Seconds() * p.speedup
	res.OutputTokensPS = float64(res.Requests*c.OutputTokens) / res.MakespanS
	res.RequestsPS = float64(res.Requests) / res.MakespanS
	return res, nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// pdRealRequest is one request of the real run.
type pdRealRequest struct {
	id     string
	at     time.Duration
	prompt []uint32
}

// pdRealTraffic is pdsim's traffic as token ids: session s's conversation is
// one token sequence, each turn a longer prefix of it; arrivals and think
// times divided by speedup.
func pdRealTraffic(c pdsim.Config, speedup float64) []pdRealRequest {
	rnd := rand.New(rand.NewPCG(c.Seed, 1))
	var out []pdRealRequest
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
			out = append(out, pdRealRequest{id: fmt.Sprintf("pd-s%d-t%d", s, turn),
				at: time.Duration(float64(at+time.Duration(turn)*c.ThinkTime) / speedup), prompt: conv[:tokens]})
		}
	}
	slices.SortStableFunc(out, func(a, b pdRealRequest) int { return int(a.at - b.at) })
	return out
}
