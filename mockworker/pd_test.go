package mockworker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/peerproc"
)

// recorder keeps the bodies a handler received.
type recorder struct {
	mu     sync.Mutex
	bodies []map[string]any
}

func (rc *recorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		rc.mu.Lock()
		rc.bodies = append(rc.bodies, m)
		rc.mu.Unlock()
		req.Body = io.NopCloser(strings.NewReader(string(b)))
		h.ServeHTTP(rw, req)
	})
}

func (rc *recorder) take() []map[string]any {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := rc.bodies
	rc.bodies = nil
	return out
}

// pdPair is a prefill worker (its requests recorded) and a decode worker on
// loopback.
func pdPair(t *testing.T) (pre, dec *Worker, preAddr, decURL string, rec *recorder) {
	t.Helper()
	pre = newWorker(t, Config{Role: RolePrefill, BlockSize: 4, WorkerID: 1})
	rec = &recorder{}
	ps := httptest.NewServer(rec.wrap(pre.Handler()))
	t.Cleanup(ps.Close)
	dec, decURL = serve(t, Config{Role: RoleDecode, BlockSize: 4, WorkerID: 2, KVTransferPerBlock: time.Millisecond})
	return pre, dec, strings.TrimPrefix(ps.URL, "http://"), decURL, rec
}

// prompt is 10 tokens: two full blocks of 4 and a partial one.
const pdPrompt = `[11,12,13,14,15,16,17,18,19,20]`

func TestDecodeWorkerPrefillsOnTheNamedPrefillWorker(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		stream           bool
	}{
		{"completions", "/v1/completions", `{"prompt":` + pdPrompt + `,"max_tokens":5}`, false},
		{"completions streamed", "/v1/completions", `{"prompt":` + pdPrompt + `,"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`, true},
		{"chat streamed", "/v1/chat/completions", `{"messages":[{"role":"user","content":"one two three four five six seven"}],"max_completion_tokens":5,"stream":true}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pre, dec, preAddr, decURL, rec := pdPair(t)
			resp := post(t, decURL+tc.path, tc.body, DefaultPrefillerHeader, preAddr)
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			if tc.stream {
				evs := readSSE(t, resp)
				if len(evs) < 5 {
					t.Fatalf("%d events", len(evs))
				}
			} else if got := decodeJSON(t, resp.Body); got["kv_transfer_params"] != nil {
				t.Fatalf("the decode answer carries transfer params: %v", got)
			}
			// The prefill worker saw one request: the prompt, max 1 token,
			// not streamed, with do_remote_decode.
			bodies := rec.take()
			if len(bodies) != 1 {
				t.Fatalf("prefill worker saw %d requests", len(bodies))
			}
			b := bodies[0]
			kv, _ := b["kv_transfer_params"].(map[string]any)
			if kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false || b["stream"] != false || b["stream_options"] != nil ||
				b["max_tokens"] != float64(1) || (strings.Contains(tc.body, "max_completion_tokens") && b["max_completion_tokens"] != float64(1)) {
				t.Fatalf("prefill request = %v", b)
			}
			// The prefill worker computed the prompt; the decode worker
			// pulled its blocks instead, and both caches hold them.
			p, d := pre.PDCounts()[0], dec.PDCounts()[0]
			if p.RemoteDecodes != 1 || p.ComputedPrefill == 0 || d.ComputedPrefill != 0 || d.RemotePrefills != 1 ||
				d.TransferredBlocks != (p.ComputedPrefill+3)/4 {
				t.Fatalf("prefill %+v decode %+v", p, d)
			}
			if np, nd := len(pre.CachedBlocks(0)), len(dec.CachedBlocks(0)); np == 0 || nd < np {
				t.Fatalf("cached blocks: prefill %d, decode %d", np, nd)
			}
			// The same prompt again: the decode worker caches it now, so
			// nothing more is pulled for its full blocks.
			before := dec.PDCounts()[0].TransferredBlocks
			post(t, decURL+tc.path, tc.body, DefaultPrefillerHeader, preAddr).Body.Close()
			if got := dec.PDCounts()[0].TransferredBlocks - before; got > 1 {
				t.Fatalf("a cached prompt pulled %d blocks again", got)
			}
		})
	}
}

func TestPrefillStageAnswersTransferParams(t *testing.T) {
	_, url := serve(t, Config{Role: RolePrefill, BlockSize: 4, WorkerID: 7})
	resp := post(t, url+"/v1/completions", `{"prompt":`+pdPrompt+`,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}}`)
	got := decodeJSON(t, resp.Body)
	kv, _ := got["kv_transfer_params"].(map[string]any)
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(url, "http://"))
	if kv["do_remote_prefill"] != true || kv["do_remote_decode"] != false || kv["remote_host"] != host ||
		kv["remote_port"] != float64(mustAtoi(t, port)) || kv["remote_engine_id"] != "mockworker-7-dp0" || len(kv["remote_block_ids"].([]any)) != 2 {
		t.Fatalf("kv_transfer_params = %v", kv)
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDisaggregationErrors(t *testing.T) {
	_, preURL := serve(t, Config{Role: RolePrefill, BlockSize: 4})
	dead := func() string { // a port nothing listens on
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		return addr
	}()
	failing := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		http.Error(rw, `{"error":{"message":"out of memory"}}`, http.StatusInternalServerError)
	}))
	t.Cleanup(failing.Close)
	_, decURL := serve(t, Config{Role: RoleDecode, BlockSize: 4})
	for _, tc := range []struct {
		name, url, prefiller string
		status               int
		frag                 string
	}{
		{"prefill role refuses to decode", preURL, "127.0.0.1:1", http.StatusBadRequest, "this is a prefill worker"},
		{"dead prefill worker", decURL, dead, http.StatusBadGateway, "prefill worker " + dead},
		{"failing prefill worker", decURL, strings.TrimPrefix(failing.URL, "http://"), http.StatusBadGateway, "answered 500 Internal Server Error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, tc.url+"/v1/completions", `{"prompt":[1,2,3],"max_tokens":2}`, DefaultPrefillerHeader, tc.prefiller)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.frag) {
				t.Fatalf("status %d body %s, want %d with %q", resp.StatusCode, b, tc.status, tc.frag)
			}
		})
	}
	if _, err := New(Config{Role: "prefiller"}); err == nil || !strings.Contains(err.Error(), "role must be both, prefill or decode") {
		t.Fatalf("err = %v", err)
	}
}

// overlapClock sleeps for real and notes whether a prefill's sleep ever
// overlapped a decode step's (itl long), telling the sleeps apart by their
// lengths; it counts the prefill sleeps that are one chunk long.
type overlapClock struct {
	chunk, itl          time.Duration
	chunks, steps       atomic.Int32 // in progress
	overlaps, chunkRuns atomic.Int32
}

func (c *overlapClock) Now() time.Time { return time.Now() }

func (c *overlapClock) Sleep(ctx context.Context, d time.Duration) error {
	mine, other := &c.steps, &c.chunks
	if d != c.itl { // a prefill: one chunk, or the whole prompt unchunked
		mine, other = &c.chunks, &c.steps
		if d == c.chunk {
			c.chunkRuns.Add(1)
		}
	}
	mine.Add(1)
	defer mine.Add(-1)
	if other.Load() > 0 {
		c.overlaps.Add(1)
	}
	err := wallClock{}.Sleep(ctx, d)
	if other.Load() > 0 {
		c.overlaps.Add(1) // the other started meanwhile
	}
	return err
}

// With PrefillStallsDecode a prefill runs in MaxNumBatchedTokens chunks and
// no decode step of the rank runs during a chunk; without it they overlap.
// The test asserts on what overlapped, not on how long anything took.
func TestPrefillStallsDecode(t *testing.T) {
	for _, stall := range []bool{true, false} {
		t.Run(fmt.Sprintf("stall=%v", stall), func(t *testing.T) {
			clk := &overlapClock{chunk: 16 * 3 * time.Millisecond, itl: 2 * time.Millisecond}
			w, err := New(Config{BlockSize: 4, MaxNumBatchedTokens: 16, PrefillPerToken: 3 * time.Millisecond,
				DecodePerToken: 2 * time.Millisecond, DecodeBatchSlowdown: 0, PrefillStallsDecode: stall, Clock: clk, Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { w.Close() })
			ctx := context.Background()
			started := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() { // a long decode, running when the prefill starts
				_, err := w.Generate(ctx, Request{Tokens: toks(1, 4), MaxTokens: 60, OnToken: func(i int, _ uint32) error {
					if i == 1 {
						close(started)
					}
					return nil
				}})
				if err != nil {
					t.Error(err)
				}
			})
			<-started
			if _, err := w.Generate(ctx, Request{Tokens: toks(1000, 64), MaxTokens: 1}); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if stall && (clk.overlaps.Load() != 0 || clk.chunkRuns.Load() != 4) {
				t.Fatalf("stalling: %d overlaps, %d chunks; want 0 and 4 chunks of 16 tokens", clk.overlaps.Load(), clk.chunkRuns.Load())
			}
			if !stall && clk.overlaps.Load() == 0 {
				t.Fatal("without stalling the prefill never overlapped a decode step")
			}
		})
	}
}

// llm-d's vLLM simulator as the prefill worker of a mock decode worker. The
// simulator answers the prefill stage with kv_transfer_params whose
// remote_block_ids are strings ("DUMMY_ID"), not vLLM's integers; the mock's
// decode side passes the parameters through without reading them, so the
// exchange works.
func TestLLMDSimAsPrefillWorker(t *testing.T) {
	bin := peerproc.SimBinary(t)
	port, err := peerproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The simulator's smallest block size is 8.
	sim, err := peerproc.StartSim(ctx, peerproc.Sim{Binary: bin, Port: port, Model: "mock-model", BlockSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Stop)
	dec, url := serve(t, Config{Role: RoleDecode, BlockSize: 8, KVTransferPerBlock: time.Millisecond})
	resp := post(t, url+"/v1/completions", `{"model":"mock-model","prompt":[`+strings.Repeat("7,", 19)+`7],"max_tokens":4,"stream":true}`,
		DefaultPrefillerHeader, sim.HostPort())
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if evs := readSSE(t, resp); len(evs) != 4 {
		t.Fatalf("%d events", len(evs))
	}
	if d := dec.PDCounts()[0]; d.RemotePrefills != 1 || d.ComputedPrefill != 0 || d.TransferredBlocks != 3 {
		t.Fatalf("decode counters %+v", d)
	}
	// The simulator did the prefill: its prefix cache counts the prompt.
	prompt := 0.0
	for k, v := range scrape(t, sim.URL()) {
		if strings.HasPrefix(k, "vllm:prompt_tokens_total") {
			prompt += v
		}
	}
	if prompt < 20 {
		t.Fatalf("simulator prompt tokens = %v", prompt)
	}
}
