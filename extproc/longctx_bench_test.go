package extproc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
)

// longBlockSize is the block size of the long-context benchmarks: vLLM's and
// llm-d-inference-sim's default, so a 100k-token prompt is 6,250 blocks.
const longBlockSize = 16

// longCase is one long-context workload: llm-d-router's shared-prefix perf
// workloads (test/perf/config in llm-d/llm-d-router v0.10.0) cut to what one
// benchmark holds in memory: shared_prefix_100k-1k-10qps (a 95,000-token
// system prompt per group and a 5,000-token question) and
// shared_prefix_agentic-1m-1k (994,000 and 5,000).
type longCase struct {
	name             string
	system, question int // tokens
	groups, per      int // groups of prompts sharing a system prompt, prompts per group
	text             bool
}

var longCases = []longCase{
	{name: "tokens-100k", system: 95_000, question: 5_000, groups: 10, per: 5},
	{name: "text-100k", system: 95_000, question: 5_000, groups: 10, per: 5, text: true},
	{name: "tokens-1m", system: 994_000, question: 5_000, groups: 5, per: 2},
	{name: "text-1m", system: 994_000, question: 5_000, groups: 5, per: 2, text: true},
}

// BenchmarkRequestLong is one whole long-context request through the picker
// over loopback gRPC, one at a time (the published workloads send 1 to 10
// requests per second): headers, the body in Envoy's 16 KiB chunks
// (FULL_DUPLEX_STREAMED), the decision and the body's echo, response
// headers, 20 streamed chunks, the close. Token prompts are token ids in
// the completions prompt; each group's system prompt is cached on one of 16
// workers, as the engines' KV events would report it. Text prompts are chat
// messages of the same length at four characters a token (the text index
// learns them from the picker's own routing).
//
// Besides ns/op (client and picker), it reports the picker's own pick time
// (pick-ns/op: the mean of kvselect_extproc_pick_duration_seconds — parse,
// hash, index walk, booking), the process's CPU per request, and the heap
// left live after the run once every booking is freed and one upkeep ran
// (retained-B; text prompts leave what the text index learnt, until its
// TTL).
func BenchmarkRequestLong(b *testing.B) {
	for _, c := range longCases {
		b.Run(c.name, func(b *testing.B) {
			clock := &testClock{t: time.Now()}
			h, bodies := longPicker(b, c, clock.now)
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			chunks := sseChunks(19)
			b.ReportAllocs()
			cpu0 := processCPU()
			sum0, n0, buckets0 := pickTime(b, h.srv)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				streamRequest(b, h, bodies[i%len(bodies)], chunks)
			}
			b.StopTimer()
			sum, n, buckets := pickTime(b, h.srv)
			b.ReportMetric((sum-sum0)*1e9/float64(n-n0), "pick-ns/op")
			b.ReportMetric(pickMedian(buckets0, buckets)*1e9, "pick-p50-ns")
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			h.idle(b)
			// The upkeeps the server runs every 5 s: drained ranks
			// give long prompts' tables back once none came for 30 s.
			h.svc.Maintain(context.Background())
			clock.add(time.Minute)
			h.svc.Maintain(context.Background())
			runtime.GC()
			runtime.GC() // pooled buffers go at the second
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(bodies)
			b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)), "retained-B")
		})
	}
}

// longRequest runs one request and its streamed response.
func streamRequest(b *testing.B, h *harness, body []byte, chunks [][]byte) {
	x, d, err := h.client.Start(context.Background(), &envoysim.Request{Modes: envoysim.GIE, Body: body})
	if err != nil || d.Immediate != nil {
		b.Fatal(err, d)
	}
	if _, err := x.ResponseHeaders(envoysim.Response{Served: d.Endpoint, Headers: sseHeaders()}, false); err != nil {
		b.Fatal(err)
	}
	for k, c := range chunks {
		if _, err := x.ResponseBody(c, k == len(chunks)-1); err != nil {
			b.Fatal(err)
		}
	}
	x.Close()
}

// pickTime is the picker's pick histogram so far: its sum in seconds, its
// count and its cumulative buckets.
func pickTime(b *testing.B, srv *extproc.Server) (float64, uint64, []*dto.Bucket) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(srv); err != nil {
		b.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "kvselect_extproc_pick_duration_seconds" {
			hs := mf.GetMetric()[0].GetHistogram()
			return hs.GetSampleSum(), hs.GetSampleCount(), hs.GetBucket()
		}
	}
	b.Fatal("no pick histogram")
	return 0, 0, nil
}

// pickMedian is the median of the picks between two readings of the
// histogram, interpolated within its bucket as Prometheus'
// histogram_quantile does (the figure a dashboard shows).
func pickMedian(before, after []*dto.Bucket) float64 {
	total := after[len(after)-1].GetCumulativeCount() - before[len(before)-1].GetCumulativeCount()
	lower, below := 0.0, uint64(0)
	for i, bk := range after {
		in := bk.GetCumulativeCount() - before[i].GetCumulativeCount()
		if 2*in >= total {
			return lower + (bk.GetUpperBound()-lower)*(float64(total)/2-float64(below))/float64(in-below)
		}
		lower, below = bk.GetUpperBound(), in
	}
	return lower
}

// longPicker is a picker over 16 workers of 16-token blocks with KV events
// on, the bodies of c, and (token prompts) each group's system prompt cached
// on worker group%16.
func longPicker(b *testing.B, c longCase, clock func() time.Time) (*harness, [][]byte) {
	b.Helper()
	ls := &captureListeners{ix: map[index.WorkerKey]*index.Index{}}
	ws := make([]catalog.Record, 16)
	for i := range ws {
		ws[i] = catalog.Record{WorkerID: uint64(i + 1), ModelName: model, Endpoint: ptr(fmt.Sprintf("http://10.2.0.%d:8000", i+1)),
			BlockSize: ptr(uint32(longBlockSize))}
	}
	h := start(b, setup{workers: ws, kvEvents: true, listeners: ls, clock: clock})
	rng := rand.New(rand.NewPCG(uint64(c.system), 36))
	var bodies [][]byte
	for g := range c.groups {
		sys := longTokens(rng, c.system)
		if !c.text {
			locals := kvhash.LocalBlockHashes(sys, "", "", kvhash.BlockOptions{BlockSize: longBlockSize})
			blocks := make([]index.Block, len(locals))
			for i, l := range locals {
				blocks[i] = index.Block{Ext: uint64(g)<<40 | uint64(i+1), Local: l}
			}
			w := index.WorkerKey{WorkerID: uint64(g%16 + 1)}
			if err := ls.index(w).Apply(&index.Event{Worker: w, Kind: index.EventStored, Blocks: blocks}); err != nil {
				b.Fatal(err)
			}
		}
		for range c.per {
			q := longTokens(rng, c.question)
			if c.text {
				bodies = append(bodies, longChatBody(longText(sys), longText(q)))
			} else {
				bodies = append(bodies, longTokenBody(append(sys[:len(sys):len(sys)], q...)))
			}
		}
	}
	rng.Shuffle(len(bodies), func(i, j int) { bodies[i], bodies[j] = bodies[j], bodies[i] })
	return h, bodies
}

// longTokens are n token ids of a 128k vocabulary.
func longTokens(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = rng.Uint32N(128_000)
	}
	return out
}

// longTokenBody is a streamed completions request whose prompt is ids.
func longTokenBody(ids []uint32) []byte {
	out := fmt.Appendf(make([]byte, 0, 7*len(ids)+64), `{"model":%q,"stream":true,"max_tokens":1000,"prompt":[`, model)
	for i, t := range ids {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendUint(out, uint64(t), 10)
	}
	return append(out, "]}"...)
}

// longText spells ids as words of about four characters each, one per
// token, so the text is as long as the token prompt would be.
func longText(ids []uint32) string {
	var sb strings.Builder
	sb.Grow(4 * len(ids))
	for _, t := range ids {
		sb.WriteString(longWords[t%uint32(len(longWords))])
	}
	return sb.String()
}

var longWords = func() []string {
	out := make([]string, 0, 512)
	for i := range 512 {
		// Three letters and a space, sometimes punctuation or a newline.
		w := []byte{byte('a' + i%26), byte('a' + i/26%26), byte('e' + i%7), ' '}
		switch i % 17 {
		case 0:
			w[3] = '\n'
		case 1:
			w[2] = ','
		case 2:
			w[2] = '"'
		}
		out = append(out, string(w))
	}
	return out
}()

// longChatBody is a streamed chat request: the system prompt, then the
// question.
func longChatBody(system, question string) []byte {
	return fmt.Appendf(nil, `{"model":%q,"stream":true,"max_tokens":1000,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`,
		model, system, question)
}

// captureListeners hands each rank's index to the benchmark instead of a
// ZMQ listener.
type captureListeners struct {
	mu sync.Mutex
	ix map[index.WorkerKey]*index.Index
}

func (l *captureListeners) Attach(a selection.RankAttachment) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ix[a.Worker] = a.Index
	return nil
}

func (l *captureListeners) Detach(index.Partition, index.WorkerKey) {}

func (l *captureListeners) index(w index.WorkerKey) *index.Index {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ix[w]
}

// BenchmarkResponseStream is the response path at a low request rate: one
// request, then a streamed (SSE) response of N chunks, one token each, as an
// engine streams them one at a time, and the close. Every chunk is one
// message to the picker and one answer back, so ns/op over N is the
// per-message cost (reported as ns/chunk, client and picker together).
func BenchmarkResponseStream(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("chunks=%d", n), func(b *testing.B) {
			h := benchPicker(b, extproc.Options{})
			body := benchBodies("tokens")[0]
			chunks := sseChunks(n - 1)
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				streamRequest(b, h, body, chunks)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/chunk")
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N*n), "cpu-ns/chunk")
		})
	}
}
