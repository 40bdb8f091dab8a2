// Package extprocload measures the per-request overhead of the ext_proc
// endpoint picker on loopback. Every stream is one simulated HTTP request
// driven through envoysim exactly as Envoy drives it in the GIE
// configuration: request headers and a body of Config.Body bytes
// (FULL_DUPLEX_STREAMED), the routing decision, response headers with the
// served endpoint, Config.Chunks streamed SSE chunks (the last one ends the
// stream), then Envoy's close. The REST front runs the same request
// lifecycle through the REST API instead (select_and_reserve,
// prefill_complete, output_block per block, delete). The server is
// kvselect's service in this process, or an external kvselect on loopback.
package extprocload

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

	"google.golang.org/grpc"

	"github.com/kvselect/kvselect/bench/fleet"
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
	model     = "bench"
	blockSize = 16
	pool      = 256 // prompts in the pool
	systems   = 16  // shared prefixes in the pool
)

// Config is one run.
type Config struct {
	Front    string // "extproc" (gRPC via envoysim) or "rest" (the same lifecycle over REST)
	Streams  int    // concurrent requests, one goroutine each
	Workers  int    // registered (model "bench", block size 16)
	Duration time.Duration
	Warmup   time.Duration // unmeasured, before Duration
	Body     int           // request body size in bytes
	Chunks   int           // streamed response chunks, one token each
	Prompt   string        // "tokens" (completions prompt as ids) or "text" (chat messages; ext_proc only)
	// Rate is the open-loop arrival rate over all streams; 0 is a closed
	// loop, each stream starting its next request at once.
	Rate float64
	// KVEvents runs the in-process service with KV events on (the default;
	// no engine publishes, so token prompts find no cache) instead of the
	// approximate index that records every pick.
	KVEvents bool
	// PlainGRPC serves with grpc.NewServer's defaults instead of
	// extproc.ServerOptions (for comparison).
	PlainGRPC bool
	// URL and Addr are an external kvselect on loopback, its REST base URL
	// (workers are registered there; its /metrics gives the server's own
	// CPU per request) and its ext_proc host:port; empty: the server runs
	// in this process.
	URL, Addr string
	// Server, when set, is a kvselect process Run starts (bench/fleet) and
	// measures as the external server, in place of URL and Addr: the way
	// the picker is deployed, in a process of its own (on a CPU of its own
	// with Server.Wrap).
	Server *fleet.KVSelectConfig
	report.Files
}

// Defaults is `make bench-extproc`'s closed loop.
func Defaults() Config {
	return Config{Front: "extproc", Streams: 64, Workers: 64, Duration: 10 * time.Second, Warmup: 2 * time.Second,
		Body: 4096, Chunks: 20, Prompt: "tokens", KVEvents: true}
}

// Result is one run (its -json).
type Result struct {
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
	ServerCPUPerReq float64     `json:"server_cpu_us_per_request"`
	Decision        Percentiles `json:"decision"` // request start → routing decision
	Total           Percentiles `json:"total"`    // request start → end of the response
	ErrorSample     string      `json:"error_sample,omitempty"`
}

// Percentiles are a latency's, in nanoseconds.
type Percentiles struct {
	P50 int64 `json:"p50_ns"`
	P90 int64 `json:"p90_ns"`
	P99 int64 `json:"p99_ns"`
	Max int64 `json:"max_ns"`
}

// Validate checks the configuration before anything starts.
func (c *Config) Validate() error {
	switch {
	case c.Front != "extproc" && c.Front != "rest":
		return fmt.Errorf("-front %q: want extproc or rest", c.Front)
	case c.Prompt != "tokens" && c.Prompt != "text":
		return fmt.Errorf("-prompt %q: want tokens or text", c.Prompt)
	case c.Front == "rest" && c.Prompt == "text":
		return errors.New("-front rest takes only -prompt tokens (the REST API has no text prompts)")
	case c.Streams < 1 || c.Workers < 1 || c.Body < 64 || c.Chunks < 1 || c.Duration <= 0 || c.Warmup < 0 || c.Rate < 0:
		return errors.New("-streams, -workers, -chunks and -duration must be positive, -body at least 64, -warmup and -rate not negative")
	case c.URL != "":
		if err := fleet.CheckLoopback(c.URL); err != nil {
			return err
		}
		if c.Front == "extproc" && c.Addr == "" {
			return errors.New("-url needs -addr, the server's ext_proc host:port, for -front extproc")
		}
	}
	return nil
}

// Run drives the streams through the warmup and the measurement, prints the
// table, writes c.Files and fails when more than 1 % of the requests failed.
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) (*Result, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	bodies := requestBodies(c)
	var do func(ctx context.Context, i int, body []byte, dec *time.Duration) error
	res := &Result{Front: c.Front, Prompt: c.Prompt, KVEvents: &c.KVEvents, Streams: c.Streams, Workers: c.Workers, BodyBytes: len(bodies[0]),
		Chunks: c.Chunks, TargetRate: c.Rate, GOMAXPROCS: runtime.GOMAXPROCS(0), Server: "in-process"}
	chunks := sseChunks(c.Chunks)

	if c.Server != nil {
		k, err := fleet.StartKVSelect(ctx, *c.Server)
		if err != nil {
			return nil, err
		}
		defer k.Stop()
		c.URL, c.Addr = k.REST, k.ExtProc
		fmt.Fprintf(stderr, "kvbench extproc: started %s (REST %s, ext_proc %s; log %s)\n", c.Server.Binary, k.REST, k.ExtProc, k.Proc.Log)
	}
	restBase, epAddr := strings.TrimSuffix(c.URL, "/"), c.Addr
	var serverCPU func() (time.Duration, bool)
	if c.URL == "" {
		var err error
		if restBase, epAddr, err = serveInProcess(ctx, c); err != nil {
			return nil, err
		}
	} else {
		if err := register(ctx, restBase, c.Workers); err != nil {
			return nil, err
		}
		res.Server, res.KVEvents = c.URL, nil
		serverCPU = func() (time.Duration, bool) { return scrapeCPU(restBase) }
	}
	if c.Front == "extproc" {
		// One gRPC connection per 16 streams, as Envoy spreads streams over
		// a few connections per worker thread.
		var clients []*envoysim.Client
		for range 1 + (c.Streams-1)/16 {
			cc, err := fleet.Dial(epAddr, false)
			if err != nil {
				return nil, err
			}
			defer cc.Close()
			clients = append(clients, envoysim.New(cc))
		}
		res.RoundTrips = 3 + c.Chunks // headers, body, response headers, chunks (the last ends)
		do = func(ctx context.Context, i int, body []byte, dec *time.Duration) error {
			return viaPicker(ctx, clients[i%len(clients)], body, chunks, dec)
		}
	} else {
		outBlocks := c.Chunks / blockSize
		res.RoundTrips = 3 + outBlocks
		tr := &http.Transport{MaxIdleConns: c.Streams, MaxIdleConnsPerHost: c.Streams, DisableCompression: true}
		defer tr.CloseIdleConnections()
		hc := &http.Client{Transport: tr}
		var seq atomic.Uint64
		nonce := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
		do = func(ctx context.Context, i int, body []byte, dec *time.Duration) error {
			return restOne(ctx, hc, restBase, fmt.Sprintf("x%s-%d-%d", nonce, i, seq.Add(1)), body, outBlocks, dec)
		}
	}
	fmt.Fprintf(stderr, "kvbench extproc: front %s, %d streams, %d workers, %s prompt in %d-byte bodies, %d response chunks, rate %v, warmup %s + %s\n",
		c.Front, c.Streams, c.Workers, c.Prompt, len(bodies[0]), c.Chunks, c.Rate, c.Warmup, c.Duration)
	if err := drive(ctx, c, serverCPU, do, bodies, res); err != nil {
		return nil, err
	}
	if err := res.Table(stdout); err != nil {
		return res, err
	}
	if err := c.Files.Write(res, fmt.Sprintf("kvbench extproc: front %s, %d streams", res.Front, res.Streams),
		func() []report.Chart {
			return report.LatencyChart(res.Front, []string{"decision", "whole request"},
				[]int64{res.Decision.P50, res.Total.P50}, []int64{res.Decision.P90, res.Total.P90}, []int64{res.Decision.P99, res.Total.P99},
				[]float64{res.ReqPerSec, res.ReqPerSec})
		}); err != nil {
		return res, err
	}
	if res.Requests == 0 || res.Errors*100 > res.Requests {
		return res, fmt.Errorf("%d of %d requests failed: %s", res.Errors, res.Requests, res.ErrorSample)
	}
	return res, nil
}

// requestBodies builds the pool: bodies of about c.Body bytes, each starting with
// one of systems shared prefixes a quarter of its length.
func requestBodies(c Config) [][]byte {
	rng := rand.New(rand.NewPCG(1, 1))
	out := make([][]byte, pool)
	for i := range out {
		var b bytes.Buffer
		if c.Prompt == "tokens" {
			fmt.Fprintf(&b, `{"model":%q,"stream":true,"max_tokens":%d,"prompt":[`, model, c.Chunks)
			for n := 0; b.Len() < c.Body-8; n++ {
				if n > 0 {
					b.WriteByte(',')
				}
				tok := uint32(rng.IntN(150000))
				if b.Len() < c.Body/4 {
					tok = uint32(i%systems*10000 + n)
				}
				b.WriteString(strconv.FormatUint(uint64(tok), 10))
			}
			b.WriteString("]}")
		} else {
			fmt.Fprintf(&b, `{"model":%q,"stream":true,"max_tokens":%d,"messages":[{"role":"system","content":"`, model, c.Chunks)
			for b.Len() < c.Body/4 {
				fmt.Fprintf(&b, "system prompt %d. ", i%systems)
			}
			b.WriteString(`"},{"role":"user","content":"`)
			for b.Len() < c.Body-4 {
				fmt.Fprintf(&b, "w%d ", rng.IntN(100000))
			}
			b.WriteString(`"}]}`)
		}
		out[i] = b.Bytes()
	}
	return out
}

func sseChunks(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, "data: {\"id\":\"cmpl\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", i)
	}
	out[n-1] = append(out[n-1], "data: [DONE]\n\n"...)
	return out
}

var sseHeaders = []envoysim.Header{{Key: "content-type", Value: "text/event-stream"}}

// viaPicker is one request as Envoy drives the picker: the decision (dec),
// the served endpoint's SSE headers and every chunk through the exchange.
func viaPicker(ctx context.Context, cl *envoysim.Client, body []byte, chunks [][]byte, dec *time.Duration) error {
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
	if _, err := x.ResponseHeaders(envoysim.Response{Served: d.Endpoint, Headers: sseHeaders}, false); err != nil {
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
	sel, _ := json.Marshal(map[string]any{"selection_id": id, "model_name": model, "token_ids": in.Prompt})
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

// drive runs the streams through warmup and measurement.
func drive(ctx context.Context, c Config, serverCPU func() (time.Duration, bool), do func(context.Context, int, []byte, *time.Duration) error, bodies [][]byte, res *Result) error {
	start := time.Now()
	d := &driver{c: c, serverCPU: serverCPU, do: do, bodies: bodies,
		start: start, measure: start.Add(c.Warmup), end: start.Add(c.Warmup + c.Duration), samples: make([]sample, 0, 1<<16)}
	d.lastEnd = d.measure
	if c.Rate > 0 {
		d.interval = time.Duration(float64(c.Streams) / c.Rate * float64(time.Second))
	}
	go d.cpuAtMeasureStart()
	var wg sync.WaitGroup
	for i := range c.Streams {
		wg.Go(func() { d.merge(d.stream(ctx, i)) })
	}
	wg.Wait()
	cpuAtEnd := fleet.SelfCPU()
	var srvAtEnd time.Duration
	if serverCPU != nil {
		srvAtEnd, _ = serverCPU()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d.summarize(res, cpuAtEnd, srvAtEnd)
	return nil
}

// sample is one measured request: its decision time and its whole time.
type sample struct{ dec, total time.Duration }

// streamTally is what one stream measured.
type streamTally struct {
	samples []sample
	errs    int
	errOne  string // the stream's first error
}

// driver is one drive: its schedule, the request each stream repeats, and
// what the streams measured.
type driver struct {
	c         Config
	serverCPU func() (time.Duration, bool) // nil: the server is in this process
	do        func(context.Context, int, []byte, *time.Duration) error
	bodies    [][]byte
	// The warmup runs from start to measure, the measurement from measure
	// to end; interval is the time between two requests of one stream (0:
	// closed loop).
	start, measure, end time.Time
	interval            time.Duration

	mu                         sync.Mutex
	samples                    []sample
	errs                       int
	errOne                     string
	lastEnd                    time.Time // when the last stream finished
	cpuAtMeasure, srvAtMeasure time.Duration
}

// cpuAtMeasureStart reads this process's and the server's CPU time when the
// measurement starts.
func (d *driver) cpuAtMeasureStart() {
	time.Sleep(time.Until(d.measure))
	d.mu.Lock()
	d.cpuAtMeasure = fleet.SelfCPU()
	if d.serverCPU != nil {
		d.srvAtMeasure, _ = d.serverCPU()
	}
	d.mu.Unlock()
}

// stream is stream i: its requests, one after the other (or at its pace
// with a rate, the streams staggered), until the end; those that began
// before the measurement are not counted.
func (d *driver) stream(ctx context.Context, i int) streamTally {
	t := streamTally{samples: make([]sample, 0, 4096)}
	measure, end, interval := d.measure, d.end, d.interval
	next := d.start.Add(time.Duration(i) * interval / time.Duration(d.c.Streams))
	for p := i * 37; ; p++ {
		if interval > 0 {
			if wait := time.Until(next); wait > 0 {
				time.Sleep(wait)
			}
			next = next.Add(interval)
		}
		t0 := time.Now()
		if !t0.Before(end) || ctx.Err() != nil {
			break
		}
		var dec time.Duration
		err := d.do(ctx, i, d.bodies[p%len(d.bodies)], &dec)
		t1 := time.Now()
		if t0.Before(measure) {
			continue
		}
		if err != nil {
			t.errs++
			if t.errOne == "" {
				t.errOne = err.Error()
			}
			continue
		}
		t.samples = append(t.samples, sample{dec, t1.Sub(t0)})
		if t1.After(end) {
			break
		}
	}
	return t
}

// merge adds a finished stream's tally.
func (d *driver) merge(t streamTally) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.samples = append(d.samples, t.samples...)
	d.errs += t.errs
	if d.errOne == "" {
		d.errOne = t.errOne
	}
	if now := time.Now(); now.After(d.lastEnd) {
		d.lastEnd = now
	}
}

// summarize fills res from the streams' tallies and the CPU times read at
// the end of the run.
func (d *driver) summarize(res *Result, cpuAtEnd, srvAtEnd time.Duration) {
	d.mu.Lock()
	if len(d.samples) > 0 && d.cpuAtMeasure > 0 {
		res.CPUPerReq = float64((cpuAtEnd - d.cpuAtMeasure).Microseconds()) / float64(len(d.samples)+d.errs)
		if d.srvAtMeasure > 0 && srvAtEnd > d.srvAtMeasure {
			res.ServerCPUPerReq = float64((srvAtEnd - d.srvAtMeasure).Microseconds()) / float64(len(d.samples)+d.errs)
		}
	}
	d.mu.Unlock()
	res.ElapsedSec = d.lastEnd.Sub(d.measure).Seconds()
	res.Requests, res.Errors, res.ErrorSample = len(d.samples), d.errs, d.errOne
	if res.ElapsedSec > 0 {
		res.ReqPerSec = float64(len(d.samples)) / res.ElapsedSec
	}
	decs := make([]time.Duration, len(d.samples))
	tots := make([]time.Duration, len(d.samples))
	for i, s := range d.samples {
		decs[i], tots[i] = s.dec, s.total
	}
	res.Decision, res.Total = percentiles(decs), percentiles(tots)
}

func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	slices.Sort(ds)
	return Percentiles{P50: int64(stats.SortedQuantile(ds, 0.5)), P90: int64(stats.SortedQuantile(ds, 0.9)), P99: int64(stats.SortedQuantile(ds, 0.99)),
		Max: int64(ds[len(ds)-1])}
}

// Table prints the run.
func (r *Result) Table(w io.Writer) error {
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
		p    Percentiles
	}{{"decision (start → route)", r.Decision}, {"whole request", r.Total}} {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", row.name, us(row.p.P50), us(row.p.P90), us(row.p.P99), us(row.p.Max))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return nil
}

// serveInProcess starts the selection service with c.Workers workers and the
// front under test on 127.0.0.1, returning the REST base URL or the ext_proc
// address. Everything stops when ctx ends.
func serveInProcess(ctx context.Context, c Config) (restBase, epAddr string, err error) {
	rc := routerconfig.Default()
	rc.UseKVEvents = c.KVEvents
	svc, err := selection.New(selection.Config{Router: rc})
	if err != nil {
		return "", "", err
	}
	for id := range c.Workers {
		ep := fmt.Sprintf("http://10.%d.%d.%d:8000", id>>16&255, id>>8&255, id&255)
		bs, kv := uint32(blockSize), uint64(16384)
		// With KV events on, a worker needs an event endpoint to be
		// schedulable; nothing listens to it in this process.
		zmq := fmt.Sprintf("tcp://127.0.0.1:%d", 20000+id)
		if _, err := svc.UpsertWorker(ctx, catalog.Record{WorkerID: uint64(id), ModelName: model, Endpoint: &ep, BlockSize: &bs,
			TotalKVBlocks: &kv, KVEventsEndpoint: &zmq}); err != nil {
			return "", "", err
		}
	}
	go server.Upkeep(ctx, svc, 5*time.Second)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", "", err
	}
	if c.Front == "extproc" {
		var opts []grpc.ServerOption
		if !c.PlainGRPC {
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

// register registers the workers of the bench model on an external server.
func register(ctx context.Context, base string, n int) error {
	hc := &http.Client{Timeout: 10 * time.Second}
	for id := range n {
		body, _ := json.Marshal(map[string]any{
			"worker_id": id, "model_name": model, "block_size": blockSize, "total_kv_blocks": 16384,
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
