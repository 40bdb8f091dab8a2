// Package restload is a closed-loop HTTP/1.1 keep-alive load generator for
// kvselect's REST API. Every client is one goroutine with its own
// connection; each iteration is POST /select_and_reserve with a fresh
// selection_id followed by DELETE /reservations/{id}, and both requests are
// timed separately. The server is kvselect's service in this process behind
// httpadmin on 127.0.0.1 — with no authentication, a bearer token, TLS or
// both, measured in turn when several are asked for (auth.go) — or an
// external kvselect on loopback.
package restload

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/stats"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/server"
)

const (
	model      = "bench"
	blockSize  = 16
	kvBlocks   = 16384 // total_kv_blocks per worker, as httpadmin's benchmark
	pool       = 256   // prompts in the pool
	systems    = 16    // distinct shared prefixes ("system prompts") in the pool
	maxFailPct = 1.0   // abort when more than this share of requests fail
	// samples is each client's preallocated room per request kind; a client
	// that outruns it grows its slice (amortized, at most a handful of times).
	samples = 1 << 15
)

// Config is one run.
type Config struct {
	// URL is the base URL of a kvselect REST server on loopback; empty: one
	// in this process on 127.0.0.1.
	URL      string
	Workers  int // registered (POST /workers, model "bench", block_size 16)
	Clients  int // concurrent keep-alive connections, one goroutine each
	Duration time.Duration
	Warmup   time.Duration // unmeasured, before Duration
	// Prompt is "tokens" (token_ids) or "hashes" (block_hashes +
	// sequence_hashes + isl_tokens).
	Prompt string
	Blocks int // prompt size in 16-token blocks
	// Auth are the in-process server setups measured in turn (AuthModes),
	// Rounds times, alternating so that drift on a shared machine hits each
	// alike.
	Auth   []string
	Rounds int
	Token  string // bearer token sent to a URL server
	report.Files
}

// Defaults is `make bench-rest`'s run.
func Defaults() Config {
	return Config{Workers: 64, Clients: 32, Duration: 10 * time.Second, Warmup: 2 * time.Second, Prompt: "tokens", Blocks: 32,
		Auth: []string{"off"}, Rounds: 1}
}

// latencyStats is one request kind over the measured window. Latencies in ns.
type latencyStats struct {
	Requests  int            `json:"requests"`
	PerSec    float64        `json:"per_sec"`
	P50       int64          `json:"p50_ns"`
	P90       int64          `json:"p90_ns"`
	P99       int64          `json:"p99_ns"`
	Max       int64          `json:"max_ns"`
	Errors    int            `json:"errors"`
	ErrorsBy  map[string]int `json:"errors_by_status"`
	errSample string
}

// Result is one server setup's run.
type Result struct {
	Server          string       `json:"server"`                         // "in-process" or the -url
	Auth            string       `json:"auth"`                           // the -auth mode: off, token, tls, tls+token
	TLSHandshakeP50 int64        `json:"tls_handshake_p50_ns,omitempty"` // a full handshake on a new connection (tls modes)
	CPUPerRequest   int64        `json:"cpu_per_request_ns"`             // this process's CPU (clients and, in-process, the server) per request, warmup included
	Workers         int          `json:"workers"`
	Clients         int          `json:"clients"`
	Prompt          string       `json:"prompt"`
	Blocks          int          `json:"blocks"`
	ISLTokens       int          `json:"isl_tokens"`
	PoolPrompts     int          `json:"pool_prompts"`
	SeededPrompts   int          `json:"seeded_prompts"` // prompts cached on some worker before the run (in-process only)
	UseKVEvents     *bool        `json:"use_kv_events"`  // the in-process service's setting; null (unknown) with -url
	GOMAXPROCS      int          `json:"gomaxprocs"`
	NumCPU          int          `json:"num_cpu"`
	WarmupSec       float64      `json:"warmup_s"`
	DurationSec     float64      `json:"duration_s"` // requested
	ElapsedSec      float64      `json:"elapsed_s"`  // measured window: warmup end to the last client's stop
	Requests        int          `json:"requests"`   // both kinds, measured window
	RequestsPerSec  float64      `json:"requests_per_sec"`
	Pairs           int          `json:"pairs"` // select_and_reserve + delete both 200
	PairsPerSec     float64      `json:"pairs_per_sec"`
	Select          latencyStats `json:"select_and_reserve"`
	Delete          latencyStats `json:"delete"`
	WarmupRequests  int          `json:"warmup_requests"`
	WarmupErrors    int          `json:"warmup_errors"`
}

// client is one connection's state. Everything but the two counters is
// touched only by its own goroutine until the run is over; the counters are
// read by the progress line and sit on their own cache lines.
type client struct {
	_      [64]byte
	sent   atomic.Int64 // requests finished, every phase
	_      [56]byte
	failed atomic.Int64 // of which not 200, every phase
	_      [56]byte

	sel, del       []time.Duration // measured window only
	selErr, delErr map[string]int  // measured window only
	errSample      [2]string
	token          string // sent as a bearer token when set
	warmReqs       int
	warmErrs       int
	pairs          int
	lastEnd        time.Time
}

// Validate checks the configuration before anything starts.
func (c *Config) Validate() error {
	switch {
	case c.Workers < 1 || c.Clients < 1 || c.Blocks < 1:
		return errors.New("-workers, -clients and -blocks must be positive")
	case c.Duration <= 0 || c.Warmup < 0:
		return errors.New("-duration must be positive and -warmup not negative")
	case c.Prompt != "tokens" && c.Prompt != "hashes":
		return fmt.Errorf("-prompt %q: want tokens or hashes", c.Prompt)
	case c.Rounds < 1:
		return errors.New("-rounds must be positive")
	case len(c.Auth) == 0:
		return errors.New("-auth: no mode")
	case c.URL != "" && (len(c.Auth) > 1 || c.Auth[0] != "off"):
		return errors.New("-auth measures in-process servers; with -url give the server's token with -token")
	}
	for _, m := range c.Auth {
		if !slices.Contains(AuthModes, m) {
			return fmt.Errorf("-auth: unknown mode %q (want %s)", m, strings.Join(AuthModes, ", "))
		}
	}
	if c.URL != "" {
		return fleet.CheckLoopback(c.URL)
	}
	return nil
}

// Run measures each mode of c.Auth, c.Rounds times, printing each run's
// table and, for several, the comparison; it writes c.Files (one result as
// an object with its chart, several as a list) and fails when more than 1 %
// of the requests failed.
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) ([]Result, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if len(c.Auth) == 1 && c.Rounds == 1 {
		res, err := runOnce(ctx, c, c.Auth[0], stdout, stderr)
		if err != nil {
			return nil, err
		}
		if err := c.Files.Write(res, fmt.Sprintf("kvbench rest: %d clients, %s prompt", res.Clients, res.Prompt),
			func() []report.Chart {
				return report.LatencyChart("REST", []string{"select_and_reserve", "delete"},
					[]int64{res.Select.P50, res.Delete.P50}, []int64{res.Select.P90, res.Delete.P90}, []int64{res.Select.P99, res.Delete.P99},
					[]float64{res.Select.PerSec, res.Delete.PerSec})
			}); err != nil {
			return nil, err
		}
		return []Result{res}, failRate(&res)
	}
	var all []Result
	for range c.Rounds {
		for _, mode := range c.Auth {
			res, err := runOnce(ctx, c, mode, stdout, stderr)
			if err != nil {
				return all, fmt.Errorf("-auth %s: %w", mode, err)
			}
			if err := failRate(&res); err != nil {
				return all, fmt.Errorf("-auth %s: %w", mode, err)
			}
			all = append(all, res)
		}
	}
	if err := authTable(stdout, c.Auth, all); err != nil {
		return all, err
	}
	return all, c.Files.Write(all, "", nil)
}

// runOnce starts the server of mode (or targets -url), registers the
// workers, drives the clients and prints the table.
func runOnce(ctx context.Context, c Config, mode string, stdout, stderr io.Writer) (Result, error) {
	res := Result{Workers: c.Workers, Clients: c.Clients, Prompt: c.Prompt, Blocks: c.Blocks,
		ISLTokens: c.Blocks * blockSize, PoolPrompts: pool, GOMAXPROCS: runtime.GOMAXPROCS(0),
		NumCPU: runtime.NumCPU(), WarmupSec: c.Warmup.Seconds(), DurationSec: c.Duration.Seconds()}
	prompts := promptPool(c.Blocks)
	res.Auth = mode

	tg := target{base: strings.TrimSuffix(c.URL, "/"), token: c.Token}
	var svc *selection.Service
	if tg.base == "" {
		rc := routerconfig.Default() // UseKVEvents stays true: Dynamo's and kvselect's default
		var err error
		if svc, err = selection.New(selection.Config{Router: rc}); err != nil {
			return res, err
		}
		upkeep, stop := context.WithCancel(ctx)
		defer stop()
		go server.Upkeep(upkeep, svc, 5*time.Second) // the host's job, as server.Run does it
		var closeServer func()
		if tg, closeServer, err = startServer(svc, mode); err != nil {
			return res, err
		}
		defer closeServer()
		res.Server, res.UseKVEvents = "in-process", &rc.UseKVEvents
		if tg.tls != nil {
			if res.TLSHandshakeP50, err = handshakeP50(ctx, tg, 200); err != nil {
				return res, err
			}
		}
	} else {
		res.Server = tg.base
	}

	if err := registerWorkers(ctx, tg, c.Workers); err != nil {
		return res, err
	}
	if svc != nil {
		n, err := seedIndex(svc, prompts, c.Workers)
		if err != nil {
			return res, err
		}
		res.SeededPrompts = n
	}
	bodies, err := requestBodies(prompts, c.Prompt == "hashes")
	if err != nil {
		return res, err
	}
	fmt.Fprintf(stderr, "kvbench rest: target %s (%s, auth %s), %d workers, %d clients, %s prompts of %d blocks, warmup %s + %s\n",
		tg.base, res.Server, mode, c.Workers, c.Clients, c.Prompt, c.Blocks, c.Warmup, c.Duration)

	cpu0 := fleet.SelfCPU()
	if err := drive(ctx, c, tg, bodies, &res, stderr); err != nil {
		return res, err
	}
	if n := res.Requests + res.WarmupRequests; n > 0 {
		res.CPUPerRequest = int64(fleet.SelfCPU()-cpu0) / int64(n)
	}
	return res, table(stdout, &res)
}

// failRate is the final verdict: more than 1 % failed requests is an error.
func failRate(r *Result) error {
	n := r.Select.Requests + r.Delete.Requests + r.WarmupRequests
	bad := r.Select.Errors + r.Delete.Errors + r.WarmupErrors
	if n == 0 {
		return errors.New("no request completed")
	}
	if pct := 100 * float64(bad) / float64(n); pct > maxFailPct {
		return fmt.Errorf("%d of %d requests failed (%.2f%% > %.0f%%): select %v %s, delete %v %s", bad, n, pct, maxFailPct,
			r.Select.ErrorsBy, r.Select.errSample, r.Delete.ErrorsBy, r.Delete.errSample)
	}
	return nil
}

// promptPool is the pool: pool prompts of blocks×16 token ids, each
// starting with one of systems shared prefixes a quarter of its length
// (at least one block), the rest random.
func promptPool(blocks int) [][]uint32 {
	rng := rand.New(rand.NewPCG(1, 1))
	shared := max(1, blocks/4) * blockSize
	out := make([][]uint32, pool)
	for i := range out {
		t := make([]uint32, blocks*blockSize)
		for j := range t {
			if j < shared {
				t[j] = uint32(i%systems*100000 + j)
			} else {
				t[j] = rng.Uint32N(150000)
			}
		}
		out[i] = t
	}
	return out
}

// requestBodies precomputes each prompt's request body after the selection_id:
// `"model_name":...}` — the hot loop only prepends `{"selection_id":"<id>",`.
func requestBodies(prompts [][]uint32, hashes bool) ([][]byte, error) {
	out := make([][]byte, len(prompts))
	for i, t := range prompts {
		var v any = struct {
			ModelName string   `json:"model_name"`
			TokenIDs  []uint32 `json:"token_ids"`
		}{model, t}
		if hashes {
			locals := kvhash.LocalBlockHashes(t, "", "", kvhash.BlockOptions{BlockSize: blockSize})
			bh, sh := kvhash.WireHashes(locals)
			v = struct {
				ModelName      string  `json:"model_name"`
				BlockHashes    []int64 `json:"block_hashes"`
				SequenceHashes []int64 `json:"sequence_hashes"`
				ISLTokens      int     `json:"isl_tokens"`
			}{model, bh, sh, len(t)}
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		out[i] = raw[1:] // drop '{'
	}
	return out, nil
}

// registerWorkers upserts workers 0..n-1 over POST /workers and checks that
// each is schedulable. kv_events_endpoint is required when the server uses KV
// events (the default); no socket is opened for it by the in-process service,
// which has no event listener connected.
func registerWorkers(ctx context.Context, tg target, n int) error {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tg.tls}}
	defer c.CloseIdleConnections()
	base := tg.base
	for id := range n {
		body, _ := json.Marshal(map[string]any{
			"worker_id": id, "model_name": model, "block_size": blockSize, "total_kv_blocks": kvBlocks,
			"endpoint":           fmt.Sprintf("http://bench-w%d:8000", id),
			"kv_events_endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", 20000+id),
		})
		req, err := http.NewRequestWithContext(ctx, "POST", base+"/workers", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		tg.authorize(req)
		res, err := c.Do(req)
		if err != nil {
			return fmt.Errorf("register worker %d: %w", id, err)
		}
		raw, _ := io.ReadAll(res.Body)
		res.Body.Close()
		var rec struct{ Lifecycle string }
		if (res.StatusCode != http.StatusOK && res.StatusCode != http.StatusCreated) || json.Unmarshal(raw, &rec) != nil || rec.Lifecycle != "schedulable" {
			return fmt.Errorf("register worker %d: %d %s", id, res.StatusCode, bytes.TrimSpace(raw))
		}
	}
	return nil
}

// seedIndex stores every other prompt of the pool on one worker, through a
// /dump-shaped Restore as httpadmin's benchmark does, so that lookups find
// cached prefixes (the shared prefixes make most prompts a partial hit).
func seedIndex(svc *selection.Service, prompts [][]uint32, workers int) (int, error) {
	var events []index.RouterEvent
	for i, t := range prompts {
		if i%2 == 1 {
			continue
		}
		locals := kvhash.LocalBlockHashes(t, "", "", kvhash.BlockOptions{BlockSize: blockSize})
		blocks := make([]index.StoredBlock, len(locals))
		for k, l := range locals {
			blocks[k] = index.StoredBlock{BlockHash: index.Hash(l ^ 0x5555), TokensHash: index.Hash(l)}
		}
		events = append(events, index.RouterEvent{WorkerID: uint64(i % workers), StorageTier: "device",
			Event: index.KvCacheEvent{EventID: uint64(i), Data: index.EventData{Stored: &index.StoredData{Blocks: blocks}}}})
	}
	for _, r := range svc.Replica().Restore(index.Dump{index.PartitionKey(model, "default"): {BlockSize: blockSize, Events: events}}) {
		if r.Err != nil {
			return 0, fmt.Errorf("seed the index: %+v", r)
		}
	}
	return len(events), nil
}

// drive runs the clients through warmup and measurement and fills res.
func drive(ctx context.Context, c Config, tg target, bodies [][]byte, res *Result, stderr io.Writer) error {
	runCtx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	var stop atomic.Bool
	context.AfterFunc(runCtx, func() { stop.Store(true) })

	clients := make([]*client, c.Clients)
	for i := range clients {
		clients[i] = &client{sel: make([]time.Duration, 0, samples), del: make([]time.Duration, 0, samples)}
	}
	// Per-run nonce: a server that outlived an aborted run may still hold ids.
	nonce := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	start := time.Now()
	measure, end := start.Add(c.Warmup), start.Add(c.Warmup+c.Duration)

	var wg sync.WaitGroup
	for i, cl := range clients {
		wg.Go(func() { cl.loop(runCtx, &stop, tg, fmt.Sprintf("b%s-c%d-", nonce, i), bodies, i, measure, end) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last int64
	lastAt := start
progress:
	for {
		select {
		case <-done:
			break progress
		case now := <-tick.C:
			var sent, failed int64
			for _, cl := range clients {
				sent += cl.sent.Load()
				failed += cl.failed.Load()
			}
			phase := "measure"
			if now.Before(measure) {
				phase = "warmup"
			}
			fmt.Fprintf(stderr, "%5.1fs %-7s %9d requests %8.0f req/s  %d failed\n",
				now.Sub(start).Seconds(), phase, sent, float64(sent-last)/now.Sub(lastAt).Seconds(), failed)
			last, lastAt = sent, now
			if sent >= 200 && 100*float64(failed) > maxFailPct*float64(sent) {
				abort(fmt.Errorf("aborted: %d of %d requests failed", failed, sent))
			}
		}
	}
	if err := context.Cause(runCtx); err != nil {
		var msgs []string
		for _, cl := range clients {
			for _, s := range cl.errSample {
				if s != "" {
					msgs = append(msgs, s)
				}
			}
		}
		if len(msgs) > 3 {
			msgs = msgs[:3]
		}
		return fmt.Errorf("%w (e.g. %s)", err, strings.Join(msgs, "; "))
	}

	var sel, del []time.Duration
	lastEnd := measure
	for _, cl := range clients {
		sel = append(sel, cl.sel...)
		del = append(del, cl.del...)
		res.Pairs += cl.pairs
		res.WarmupRequests += cl.warmReqs
		res.WarmupErrors += cl.warmErrs
		if cl.lastEnd.After(lastEnd) {
			lastEnd = cl.lastEnd
		}
	}
	elapsed := lastEnd.Sub(measure).Seconds()
	res.ElapsedSec = elapsed
	res.Select = summarize(sel, clients, 0, elapsed)
	res.Delete = summarize(del, clients, 1, elapsed)
	res.Requests = res.Select.Requests + res.Delete.Requests
	if elapsed > 0 {
		res.RequestsPerSec = float64(res.Requests) / elapsed
		res.PairsPerSec = float64(res.Pairs) / elapsed
	}
	return nil
}

// loop is one client: a closed loop of select_and_reserve + delete on one
// keep-alive connection until end. Requests that start before measure are
// warmup and only counted; the others are recorded.
func (cl *client) loop(ctx context.Context, stop *atomic.Bool, tg target, idPrefix string, bodies [][]byte, idx int, measure, end time.Time) {
	base := tg.base
	cl.token = tg.token
	tr := &http.Transport{
		TLSClientConfig:     tg.tls,
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	hc := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()

	selURL := base + "/select_and_reserve"
	delPrefix := base + "/reservations/"
	id := make([]byte, 0, 64)
	body := make([]byte, 0, 64+len(bodies[0])*2)
	var buf bytes.Buffer
	checked := false
	p := idx * 37 // clients walk the pool from different places
	for seq := uint64(0); !stop.Load(); seq++ {
		id = strconv.AppendUint(append(id[:0], idPrefix...), seq, 10)
		body = append(append(append(append(body[:0], `{"selection_id":"`...), id...), `",`...), bodies[p%len(bodies)]...)
		p++

		t0 := time.Now()
		st, err := cl.do(ctx, hc, "POST", selURL, body, &buf, !checked)
		t1 := time.Now()
		if st == http.StatusOK && !checked {
			if !bytes.Contains(buf.Bytes(), id) { // the first answer must echo our id
				st, err = 0, fmt.Errorf("select_and_reserve answered without selection_id %s: %.200s", id, buf.Bytes())
			}
			checked = true
		}
		warm := t0.Before(measure)
		cl.note(0, st, err, warm, t1.Sub(t0))
		if st != http.StatusOK {
			cl.lastEnd = t1
			if !t1.Before(end) {
				break
			}
			continue
		}
		t2 := time.Now()
		st, err = cl.do(ctx, hc, "DELETE", delPrefix+string(id), nil, &buf, false)
		t3 := time.Now()
		cl.note(1, st, err, warm, t3.Sub(t2))
		if st == http.StatusOK && !warm {
			cl.pairs++
		}
		cl.lastEnd = t3
		if !t3.Before(end) {
			break
		}
	}
}

// do sends one request and drains the answer (into buf when keep is set, or
// when the status is not 200, for the error sample). It returns the status, 0
// on a transport error.
func (cl *client) do(ctx context.Context, hc *http.Client, method, u string, body []byte, buf *bytes.Buffer, keep bool) (int, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if cl.token != "" {
		req.Header.Set("Authorization", "Bearer "+cl.token)
	}
	res, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if keep || res.StatusCode != http.StatusOK {
		buf.Reset()
		_, err = buf.ReadFrom(res.Body)
		if res.StatusCode != http.StatusOK {
			return res.StatusCode, fmt.Errorf("%s %s: %d %.200s", method, u, res.StatusCode, bytes.TrimSpace(buf.Bytes()))
		}
	} else {
		_, err = io.Copy(io.Discard, res.Body)
	}
	if err != nil {
		return 0, err
	}
	return res.StatusCode, nil
}

// note records one finished request of kind k (0 select, 1 delete).
func (cl *client) note(k, status int, err error, warm bool, d time.Duration) {
	cl.sent.Add(1)
	ok := status == http.StatusOK && err == nil
	if !ok {
		cl.failed.Add(1)
		if cl.errSample[k] == "" && err != nil {
			cl.errSample[k] = err.Error()
		}
	}
	if warm {
		cl.warmReqs++
		if !ok {
			cl.warmErrs++
		}
		return
	}
	if !ok {
		key := "transport"
		if status != 0 {
			key = strconv.Itoa(status)
		}
		m := &cl.selErr
		if k == 1 {
			m = &cl.delErr
		}
		if *m == nil {
			*m = map[string]int{}
		}
		(*m)[key]++
	}
	if k == 0 {
		cl.sel = append(cl.sel, d)
	} else {
		cl.del = append(cl.del, d)
	}
}

// summarize sorts the merged samples of kind k and reads the percentiles
// (nearest rank). Failed requests are included in the latencies and counted.
func summarize(ds []time.Duration, clients []*client, k int, elapsed float64) latencyStats {
	s := latencyStats{Requests: len(ds), ErrorsBy: map[string]int{}}
	for _, cl := range clients {
		m := cl.selErr
		if k == 1 {
			m = cl.delErr
		}
		for key, n := range m {
			s.ErrorsBy[key] += n
			s.Errors += n
		}
		if s.errSample == "" {
			s.errSample = cl.errSample[k]
		}
	}
	if len(ds) == 0 {
		return s
	}
	slices.Sort(ds)
	s.P50, s.P90, s.P99 = int64(stats.SortedQuantile(ds, 0.5)), int64(stats.SortedQuantile(ds, 0.9)), int64(stats.SortedQuantile(ds, 0.99))
	s.Max = int64(ds[len(ds)-1])
	if elapsed > 0 {
		s.PerSec = float64(len(ds)) / elapsed
	}
	return s
}

// table prints the result in bench/report's style.
func table(w io.Writer, r *Result) error {
	fmt.Fprintf(w, "REST load (%s server): %d workers, %d clients (closed loop, HTTP/1.1 keep-alive), prompt %s x %d blocks (%d tokens)\n",
		r.Server, r.Workers, r.Clients, r.Prompt, r.Blocks, r.ISLTokens)
	seeded := "not seeded (external server)"
	if r.Server == "in-process" {
		seeded = fmt.Sprintf("%d of %d pool prompts seeded in the index, use_kv_events %v", r.SeededPrompts, r.PoolPrompts, *r.UseKVEvents)
	}
	fmt.Fprintf(w, "GOMAXPROCS %d (NumCPU %d), warmup %.1fs (%d requests, %d errors), measured %.2fs; %s\n\n",
		r.GOMAXPROCS, r.NumCPU, r.WarmupSec, r.WarmupRequests, r.WarmupErrors, r.ElapsedSec, seeded)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	us := func(ns int64) string { return fmt.Sprintf("%.1f", float64(ns)/1e3) }
	row := func(name, a, b, c string) { fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", name, a, b, c) }
	row("", "select_and_reserve", "delete", "total")
	row("requests", fmt.Sprint(r.Select.Requests), fmt.Sprint(r.Delete.Requests), fmt.Sprint(r.Requests))
	row("requests/s", fmt.Sprintf("%.0f", r.Select.PerSec), fmt.Sprintf("%.0f", r.Delete.PerSec), fmt.Sprintf("%.0f", r.RequestsPerSec))
	row("pairs/s", "", "", fmt.Sprintf("%.0f", r.PairsPerSec))
	row("p50 µs", us(r.Select.P50), us(r.Delete.P50), "")
	row("p90 µs", us(r.Select.P90), us(r.Delete.P90), "")
	row("p99 µs", us(r.Select.P99), us(r.Delete.P99), "")
	row("max µs", us(r.Select.Max), us(r.Delete.Max), "")
	errs := func(s latencyStats) string {
		if s.Errors == 0 {
			return "0"
		}
		keys := make([]string, 0, len(s.ErrorsBy))
		for k := range s.ErrorsBy {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = fmt.Sprintf("%s:%d", k, s.ErrorsBy[k])
		}
		return fmt.Sprintf("%d (%s)", s.Errors, strings.Join(parts, " "))
	}
	row("errors", errs(r.Select), errs(r.Delete), fmt.Sprint(r.Select.Errors+r.Delete.Errors))
	return tw.Flush()
}
