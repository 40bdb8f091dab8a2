package main

// kvbench extproc: per-request overhead of the ext_proc endpoint picker on
// loopback. Every stream is one simulated HTTP request driven through
// envoysim exactly as Envoy drives it in the GIE configuration: request
// headers + a body of -body bytes (FULL_DUPLEX_STREAMED), the routing
// decision, response headers with the served endpoint, -chunks streamed SSE
// chunks (the last one ends the stream), then Envoy's close. -front rest runs
// the same request lifecycle through the REST API instead
// (select_and_reserve, prefill_complete, output_block per block, delete).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
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
	"syscall"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/stats"
	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/httpadmin"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/server"
)

const (
	epModel     = "bench"
	epBlockSize = 16
	epPool      = 256 // prompts in the pool
	epSystems   = 16  // shared prefixes in the pool
)

type epConfig struct {
	front    string
	streams  int
	workers  int
	duration time.Duration
	warmup   time.Duration
	body     int
	chunks   int
	prompt   string
	rate     float64
	kvEvents bool
	jsonOut  string
	svgOut   string
	// plainGRPC serves with grpc.NewServer's defaults instead of
	// extproc.ServerOptions (for comparison).
	plainGRPC bool
	url, addr string
	serverCPU func() (time.Duration, bool) // external server's CPU clock, nil in-process
}

type epResult struct {
	Front      string  `json:"front"`
	Server     string  `json:"server"` // "in-process" or the -url
	Prompt     string  `json:"prompt"`
	KVEvents   *bool   `json:"use_kv_events"` // the in-process service's setting; null (unknown) with -url
	Streams    int     `json:"streams"`
	Workers    int     `json:"workers"`
	BodyBytes  int     `json:"body_bytes"`
	Chunks     int     `json:"chunks"`
	TargetRate float64 `json:"target_rate"` // 0 = closed loop
	GOMAXPROCS int     `json:"gomaxprocs"`
	ElapsedSec float64 `json:"elapsed_s"`
	Requests   int     `json:"requests"`
	Errors     int     `json:"errors"`
	ReqPerSec  float64 `json:"requests_per_sec"`
	RoundTrips int     `json:"round_trips_per_request"` // gRPC messages each way, or HTTP requests
	// CPUPerReq is the process's CPU time (user + system, client and server
	// together) per measured request: unlike latency it does not depend on
	// what else runs on the machine.
	CPUPerReq float64 `json:"cpu_us_per_request"`
	// ServerCPUPerReq is the external server's own CPU per request (from its
	// process_cpu_seconds_total), 0 in-process.
	ServerCPUPerReq float64 `json:"server_cpu_us_per_request"`
	Decision        pct     `json:"decision"` // request start → routing decision
	Total           pct     `json:"total"`    // request start → end of the response
	ErrorSample     string  `json:"error_sample,omitempty"`
}

type pct struct {
	P50 int64 `json:"p50_ns"`
	P90 int64 `json:"p90_ns"`
	P99 int64 `json:"p99_ns"`
	Max int64 `json:"max_ns"`
}

func runExtProc(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench extproc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c epConfig
	fs.StringVar(&c.front, "front", "extproc", "front to drive: extproc (gRPC ext_proc via envoysim) or rest (the same lifecycle over the REST API)")
	fs.IntVar(&c.streams, "streams", 64, "concurrent requests (one goroutine each)")
	fs.IntVar(&c.workers, "workers", 64, "workers registered (model \"bench\", block_size 16)")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "measured time after the warmup")
	fs.DurationVar(&c.warmup, "warmup", 2*time.Second, "unmeasured time before the measurement")
	fs.IntVar(&c.body, "body", 4096, "request body size in bytes")
	fs.IntVar(&c.chunks, "chunks", 20, "streamed response chunks (one token each)")
	fs.StringVar(&c.prompt, "prompt", "tokens", "prompt form: tokens (completions prompt as token ids) or text (chat messages; ext_proc only)")
	fs.Float64Var(&c.rate, "rate", 0, "open-loop arrival rate in requests/s over all streams (0 = closed loop: each stream starts its next request at once)")
	fs.BoolVar(&c.kvEvents, "kv-events", true, "run the service with KV events on (the default; no engine publishes, so token prompts find no cache) instead of the approximate index that records every pick")
	fs.BoolVar(&c.plainGRPC, "plain-grpc", false, "serve ext_proc with grpc.NewServer's defaults instead of extproc.ServerOptions (stream workers)")
	fs.StringVar(&c.url, "url", "", "REST base URL of an external kvselect on loopback (workers are registered there; its /metrics gives the server's own CPU per request); empty: run the server in this process")
	fs.StringVar(&c.addr, "addr", "", "ext_proc host:port of the external kvselect (with -url)")
	fs.StringVar(&c.jsonOut, "json", "", "also write the results as JSON to this file")
	fs.StringVar(&c.svgOut, "svg", "", "also write a latency and throughput chart to this SVG `file`")
	prof := fs.String("cpuprofile", "", "write a CPU profile of the run (server and clients) to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	stopProfile, err := startCPUProfile(*prof)
	if err != nil {
		return err
	}
	defer stopProfile()
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.front != "extproc" && c.front != "rest":
		return fmt.Errorf("-front %q: want extproc or rest", c.front)
	case c.prompt != "tokens" && c.prompt != "text":
		return fmt.Errorf("-prompt %q: want tokens or text", c.prompt)
	case c.front == "rest" && c.prompt == "text":
		return errors.New("-front rest takes only -prompt tokens (the REST API has no text prompts)")
	case c.streams < 1 || c.workers < 1 || c.body < 64 || c.chunks < 1 || c.duration <= 0 || c.warmup < 0 || c.rate < 0:
		return errors.New("-streams, -workers, -chunks and -duration must be positive, -body at least 64, -warmup and -rate not negative")
	}

	bodies := epBodies(c)
	var do func(ctx context.Context, i int, body []byte, dec *time.Duration) error
	res := epResult{Front: c.front, Prompt: c.prompt, KVEvents: &c.kvEvents, Streams: c.streams, Workers: c.workers, BodyBytes: len(bodies[0]),
		Chunks: c.chunks, TargetRate: c.rate, GOMAXPROCS: runtime.GOMAXPROCS(0), Server: "in-process"}
	chunks := epChunks(c.chunks)

	restBase, epAddr := strings.TrimSuffix(c.url, "/"), c.addr
	var serverCPU func() (time.Duration, bool)
	if c.url == "" {
		var err error
		if restBase, epAddr, err = epInProcess(ctx, c); err != nil {
			return err
		}
	} else {
		if err := checkLoopback(c.url); err != nil {
			return err
		}
		if c.front == "extproc" && c.addr == "" {
			return errors.New("-url needs -addr, the server's ext_proc host:port, for -front extproc")
		}
		if err := epRegister(ctx, restBase, c.workers); err != nil {
			return err
		}
		res.Server, res.KVEvents = c.url, nil
		serverCPU = func() (time.Duration, bool) { return scrapeCPU(restBase) }
	}
	if c.front == "extproc" {
		// One gRPC connection per 16 streams, as Envoy spreads streams over
		// a few connections per worker thread.
		var clients []*envoysim.Client
		for range 1 + (c.streams-1)/16 {
			cc, err := grpc.NewClient(epAddr, append(envoysim.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
			if err != nil {
				return err
			}
			defer cc.Close()
			clients = append(clients, envoysim.New(cc))
		}
		res.RoundTrips = 3 + c.chunks // headers, body, response headers, chunks (the last ends)
		do = func(ctx context.Context, i int, body []byte, dec *time.Duration) error {
			return epOne(ctx, clients[i%len(clients)], body, chunks, dec)
		}
	} else {
		outBlocks := c.chunks / epBlockSize
		res.RoundTrips = 3 + outBlocks
		tr := &http.Transport{MaxIdleConns: c.streams, MaxIdleConnsPerHost: c.streams, DisableCompression: true}
		defer tr.CloseIdleConnections()
		hc := &http.Client{Transport: tr}
		var seq atomic.Uint64
		nonce := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
		do = func(ctx context.Context, i int, body []byte, dec *time.Duration) error {
			return restOne(ctx, hc, restBase, fmt.Sprintf("x%s-%d-%d", nonce, i, seq.Add(1)), body, outBlocks, dec)
		}
	}
	c.serverCPU = serverCPU
	fmt.Fprintf(stderr, "kvbench extproc: front %s, %d streams, %d workers, %s prompt in %d-byte bodies, %d response chunks, rate %v, warmup %s + %s\n",
		c.front, c.streams, c.workers, c.prompt, len(bodies[0]), c.chunks, c.rate, c.warmup, c.duration)
	if err := epDrive(ctx, c, do, bodies, &res); err != nil {
		return err
	}
	if err := epTable(stdout, &res); err != nil {
		return err
	}
	if err := writeOutputs(c.jsonOut, res, c.svgOut, fmt.Sprintf("kvbench extproc: front %s, %d streams", res.Front, res.Streams),
		func() []report.Chart {
			return report.LatencyChart(res.Front, []string{"decision", "whole request"},
				[]int64{res.Decision.P50, res.Total.P50}, []int64{res.Decision.P90, res.Total.P90}, []int64{res.Decision.P99, res.Total.P99},
				[]float64{res.ReqPerSec, res.ReqPerSec})
		}); err != nil {
		return err
	}
	if res.Requests == 0 || res.Errors*100 > res.Requests {
		return fmt.Errorf("%d of %d requests failed: %s", res.Errors, res.Requests, res.ErrorSample)
	}
	return nil
}

// epBodies builds the pool: bodies of about c.body bytes, each starting with
// one of epSystems shared prefixes a quarter of its length.
func epBodies(c epConfig) [][]byte {
	rng := rand.New(rand.NewPCG(1, 1))
	out := make([][]byte, epPool)
	for i := range out {
		var b bytes.Buffer
		if c.prompt == "tokens" {
			fmt.Fprintf(&b, `{"model":%q,"stream":true,"max_tokens":%d,"prompt":[`, epModel, c.chunks)
			for n := 0; b.Len() < c.body-8; n++ {
				if n > 0 {
					b.WriteByte(',')
				}
				tok := uint32(rng.IntN(150000))
				if b.Len() < c.body/4 {
					tok = uint32(i%epSystems*10000 + n)
				}
				b.WriteString(strconv.FormatUint(uint64(tok), 10))
			}
			b.WriteString("]}")
		} else {
			fmt.Fprintf(&b, `{"model":%q,"stream":true,"max_tokens":%d,"messages":[{"role":"system","content":"`, epModel, c.chunks)
			for b.Len() < c.body/4 {
				fmt.Fprintf(&b, "system prompt %d. ", i%epSystems)
			}
			b.WriteString(`"},{"role":"user","content":"`)
			for b.Len() < c.body-4 {
				fmt.Fprintf(&b, "w%d ", rng.IntN(100000))
			}
			b.WriteString(`"}]}`)
		}
		out[i] = b.Bytes()
	}
	return out
}

func epChunks(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, "data: {\"id\":\"cmpl\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", i)
	}
	out[n-1] = append(out[n-1], "data: [DONE]\n\n"...)
	return out
}

var epSSE = []envoysim.Header{{Key: "content-type", Value: "text/event-stream"}}

func epOne(ctx context.Context, cl *envoysim.Client, body []byte, chunks [][]byte, dec *time.Duration) error {
	t0 := time.Now()
	x, d, err := cl.Start(ctx, &envoysim.Request{Modes: envoysim.GIE, Body: body})
	*dec = time.Since(t0)
	if err != nil {
		return err
	}
	defer x.Close()
	if d.Immediate != nil {
		return fmt.Errorf("immediate %d: %s", d.Immediate.Status, d.Immediate.Body)
	}
	if _, err := x.ResponseHeaders(envoysim.Response{Served: d.Endpoint, Headers: epSSE}, false); err != nil {
		return err
	}
	for i, c := range chunks {
		if _, err := x.ResponseBody(c, i == len(chunks)-1); err != nil {
			return err
		}
	}
	return nil
}

// restOne is the REST client's share of the same request: book, prefill
// complete at the first token, an output block per 16 tokens, free.
func restOne(ctx context.Context, hc *http.Client, base, id string, body []byte, outBlocks int, dec *time.Duration) error {
	// The completions body becomes a select_and_reserve body.
	var in struct {
		Prompt []uint32 `json:"prompt"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return err
	}
	sel, _ := json.Marshal(map[string]any{"selection_id": id, "model_name": epModel, "token_ids": in.Prompt})
	t0 := time.Now()
	err := restCall(ctx, hc, "POST", base+"/select_and_reserve", sel)
	*dec = time.Since(t0)
	if err != nil {
		return err
	}
	if err := restCall(ctx, hc, "POST", base+"/reservations/"+id+"/prefill_complete", nil); err != nil {
		return err
	}
	for range outBlocks {
		if err := restCall(ctx, hc, "POST", base+"/reservations/"+id+"/output_block", []byte("{}")); err != nil {
			return err
		}
	}
	return restCall(ctx, hc, "DELETE", base+"/reservations/"+id, nil)
}

func restCall(ctx context.Context, hc *http.Client, method, u string, body []byte) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %d %.200s", method, u, res.StatusCode, raw)
	}
	return nil
}

// epDrive runs the streams through warmup and measurement.
func epDrive(ctx context.Context, c epConfig, do func(context.Context, int, []byte, *time.Duration) error, bodies [][]byte, res *epResult) error {
	type sample struct{ dec, total time.Duration }
	start := time.Now()
	measure, end := start.Add(c.warmup), start.Add(c.warmup+c.duration)
	var (
		mu      sync.Mutex
		samples = make([]sample, 0, 1<<16)
		errs    int
		errOne  string
		lastEnd = measure
	)
	var interval time.Duration
	if c.rate > 0 {
		interval = time.Duration(float64(c.streams) / c.rate * float64(time.Second))
	}
	var cpuAtMeasure, srvAtMeasure time.Duration
	go func() {
		time.Sleep(time.Until(measure))
		mu.Lock()
		cpuAtMeasure = cpuTime()
		if c.serverCPU != nil {
			srvAtMeasure, _ = c.serverCPU()
		}
		mu.Unlock()
	}()
	var wg sync.WaitGroup
	for i := range c.streams {
		wg.Go(func() {
			local := make([]sample, 0, 4096)
			var lerr int
			var lmsg string
			next := start.Add(time.Duration(i) * interval / time.Duration(c.streams))
			for p := i * 37; ; p++ {
				if interval > 0 {
					if d := time.Until(next); d > 0 {
						time.Sleep(d)
					}
					next = next.Add(interval)
				}
				t0 := time.Now()
				if !t0.Before(end) || ctx.Err() != nil {
					break
				}
				var dec time.Duration
				err := do(ctx, i, bodies[p%len(bodies)], &dec)
				t1 := time.Now()
				if t0.Before(measure) {
					continue
				}
				if err != nil {
					lerr++
					if lmsg == "" {
						lmsg = err.Error()
					}
					continue
				}
				local = append(local, sample{dec, t1.Sub(t0)})
				if t1.After(end) {
					break
				}
			}
			mu.Lock()
			samples = append(samples, local...)
			errs += lerr
			if errOne == "" {
				errOne = lmsg
			}
			if now := time.Now(); now.After(lastEnd) {
				lastEnd = now
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	cpuAtEnd := cpuTime()
	var srvAtEnd time.Duration
	if c.serverCPU != nil {
		srvAtEnd, _ = c.serverCPU()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	mu.Lock()
	if len(samples) > 0 && cpuAtMeasure > 0 {
		res.CPUPerReq = float64((cpuAtEnd - cpuAtMeasure).Microseconds()) / float64(len(samples)+errs)
		if srvAtMeasure > 0 && srvAtEnd > srvAtMeasure {
			res.ServerCPUPerReq = float64((srvAtEnd - srvAtMeasure).Microseconds()) / float64(len(samples)+errs)
		}
	}
	mu.Unlock()
	res.ElapsedSec = lastEnd.Sub(measure).Seconds()
	res.Requests, res.Errors, res.ErrorSample = len(samples), errs, errOne
	if res.ElapsedSec > 0 {
		res.ReqPerSec = float64(len(samples)) / res.ElapsedSec
	}
	decs := make([]time.Duration, len(samples))
	tots := make([]time.Duration, len(samples))
	for i, s := range samples {
		decs[i], tots[i] = s.dec, s.total
	}
	res.Decision, res.Total = percentiles(decs), percentiles(tots)
	return nil
}

func percentiles(ds []time.Duration) pct {
	if len(ds) == 0 {
		return pct{}
	}
	slices.Sort(ds)
	return pct{P50: int64(stats.SortedQuantile(ds, 0.5)), P90: int64(stats.SortedQuantile(ds, 0.9)), P99: int64(stats.SortedQuantile(ds, 0.99)),
		Max: int64(ds[len(ds)-1])}
}

func epTable(w io.Writer, r *epResult) error {
	mode := "closed loop"
	if r.TargetRate > 0 {
		mode = fmt.Sprintf("open loop at %.0f req/s", r.TargetRate)
	}
	ev := "server's own setting"
	if r.KVEvents != nil {
		ev = strconv.FormatBool(*r.KVEvents)
	}
	fmt.Fprintf(w, "ext_proc bench: front %s (%s server), %d streams (%s), %d workers, %s prompt in %d-byte bodies, %d response chunks, use_kv_events %s; GOMAXPROCS %d\n",
		r.Front, r.Server, r.Streams, mode, r.Workers, r.Prompt, r.BodyBytes, r.Chunks, ev, r.GOMAXPROCS)
	fmt.Fprintf(w, "%d requests in %.2fs = %.0f requests/s (%d round trips each), %d errors\n", r.Requests, r.ElapsedSec, r.ReqPerSec, r.RoundTrips, r.Errors)
	switch {
	case r.ServerCPUPerReq > 0:
		fmt.Fprintf(w, "CPU per request: client (this process) %.0f µs, server (%s, /metrics) %.0f µs = %.0f requests/s per server core if CPU-bound\n",
			r.CPUPerReq, r.Server, r.ServerCPUPerReq, 1e6/r.ServerCPUPerReq)
	case r.CPUPerReq > 0:
		fmt.Fprintf(w, "CPU per request (client + server, user + system): %.0f µs = %.0f requests/s per core if CPU-bound\n", r.CPUPerReq, 1e6/r.CPUPerReq)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	us := func(ns int64) string { return fmt.Sprintf("%.1f", float64(ns)/1e3) }
	fmt.Fprintf(tw, "\tp50 µs\tp90 µs\tp99 µs\tmax µs\t\n")
	for _, row := range []struct {
		name string
		p    pct
	}{{"decision (start → route)", r.Decision}, {"whole request", r.Total}} {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", row.name, us(row.p.P50), us(row.p.P90), us(row.p.P99), us(row.p.Max))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return nil
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// epInProcess starts the selection service with c.workers workers and the
// front under test on 127.0.0.1, returning the REST base URL or the ext_proc
// address. Everything stops when ctx ends.
func epInProcess(ctx context.Context, c epConfig) (restBase, epAddr string, err error) {
	rc := routerconfig.Default()
	rc.UseKVEvents = c.kvEvents
	svc, err := selection.New(selection.Config{Router: rc})
	if err != nil {
		return "", "", err
	}
	for id := range c.workers {
		ep := fmt.Sprintf("http://10.%d.%d.%d:8000", id>>16&255, id>>8&255, id&255)
		bs, kv := uint32(epBlockSize), uint64(16384)
		// With KV events on, a worker needs an event endpoint to be
		// schedulable; nothing listens to it in this process.
		zmq := fmt.Sprintf("tcp://127.0.0.1:%d", 20000+id)
		if _, err := svc.UpsertWorker(ctx, catalog.Record{WorkerID: uint64(id), ModelName: epModel, Endpoint: &ep, BlockSize: &bs,
			TotalKVBlocks: &kv, KVEventsEndpoint: &zmq}); err != nil {
			return "", "", err
		}
	}
	go server.Upkeep(ctx, svc, 5*time.Second)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", "", err
	}
	if c.front == "extproc" {
		var opts []grpc.ServerOption
		if !c.plainGRPC {
			opts = extproc.ServerOptions()
		}
		g := grpc.NewServer(opts...)
		extproc.New(svc, extproc.Options{}).Register(g)
		go func() { _ = g.Serve(ln) }()
		context.AfterFunc(ctx, g.Stop)
		return "", ln.Addr().String(), nil
	}
	srv := &http.Server{Handler: httpadmin.New(svc, httpadmin.Options{}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	context.AfterFunc(ctx, func() { srv.Close() })
	return "http://" + ln.Addr().String(), "", nil
}

// epRegister registers the workers of the bench model on an external server.
func epRegister(ctx context.Context, base string, n int) error {
	hc := &http.Client{Timeout: 10 * time.Second}
	for id := range n {
		body, _ := json.Marshal(map[string]any{
			"worker_id": id, "model_name": epModel, "block_size": epBlockSize, "total_kv_blocks": 16384,
			"endpoint":           fmt.Sprintf("http://10.%d.%d.%d:8000", id>>16&255, id>>8&255, id&255),
			"kv_events_endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", 20000+id),
		})
		if err := restCall(ctx, hc, "POST", base+"/workers", body); err != nil {
			return fmt.Errorf("register worker %d: %w", id, err)
		}
	}
	return nil
}

// scrapeCPU reads process_cpu_seconds_total from the server's /metrics.
func scrapeCPU(base string) (time.Duration, bool) {
	m, err := promtext.Scrape(context.Background(), http.DefaultClient, base+"/metrics")
	if err != nil {
		return 0, false
	}
	f := m.Sum("process_cpu_seconds_total")
	return time.Duration(f * float64(time.Second)), f > 0
}
