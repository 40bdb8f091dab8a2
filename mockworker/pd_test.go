package mockworker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/logwatch"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// exchange is one request a recording front saw, with the answer it passed
// back.
type exchange struct {
	path   string
	body   map[string]any
	status int
	answer map[string]any
}

// recorder is a front for a worker (or any engine) that records every request
// and answer passing through it: the prefill side of the exchange as the
// decode worker performed it.
type recorder struct {
	mu  sync.Mutex
	got []exchange
}

func (rc *recorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		ex := exchange{path: req.URL.Path}
		_ = json.Unmarshal(b, &ex.body)
		req.Body = io.NopCloser(bytes.NewReader(b))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		ex.status = rec.Code
		_ = json.Unmarshal(rec.Body.Bytes(), &ex.answer)
		rc.mu.Lock()
		rc.got = append(rc.got, ex)
		rc.mu.Unlock()
		for k, v := range rec.Header() {
			rw.Header()[k] = v
		}
		rw.WriteHeader(rec.Code)
		_, _ = rw.Write(rec.Body.Bytes())
	})
}

// forward is a handler that passes requests on to an engine at base.
func forward(base string) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		out, err := http.NewRequestWithContext(req.Context(), req.Method, base+req.URL.Path, bytes.NewReader(body))
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadGateway)
			return
		}
		out.Header = req.Header.Clone()
		resp, err := http.DefaultClient.Do(out)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			rw.Header()[k] = v
		}
		rw.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(rw, resp.Body)
	})
}

func (rc *recorder) take() []exchange {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := rc.got
	rc.got = nil
	return out
}

// withEvents publishes KV events with a replay ring on loopback, so a test can
// read a worker's whole event history.
func withEvents(c Config) Config {
	c.KVEventsEndpoint, c.ReplayEndpoint = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
	return c
}

// pdPair is a prefill worker behind a recording front and a decode worker,
// both served over HTTP on loopback and publishing KV events.
func pdPair(t *testing.T) (pre, dec *Worker, preAddr, decURL string, rec *recorder) {
	t.Helper()
	pre = newWorker(t, withEvents(Config{Role: RolePrefill, BlockSize: 4, WorkerID: 1}))
	rec = &recorder{}
	ps := httptest.NewServer(rec.wrap(pre.Handler()))
	t.Cleanup(ps.Close)
	dec, decURL = serve(t, withEvents(Config{Role: RoleDecode, BlockSize: 4, WorkerID: 2, KVTransferPerBlock: time.Millisecond}))
	return pre, dec, strings.TrimPrefix(ps.URL, "http://"), decURL, rec
}

// pdPrompt is 10 tokens: two full blocks of 4 and a partial one.
const pdPrompt = `[11,12,13,14,15,16,17,18,19,20]`

// answerText is the generated text of a non-streamed answer, or the
// concatenated token texts of a stream, and the number of tokens.
func answerText(t *testing.T, resp *http.Response, stream bool) (string, int) {
	t.Helper()
	if !stream {
		m := decodeJSON(t, resp.Body)
		if m["kv_transfer_params"] != nil {
			t.Fatalf("a whole request's answer carries transfer params: %v", m)
		}
		c := choice0(t, m)
		u, _ := m["usage"].(map[string]any)
		n, _ := u["completion_tokens"].(float64)
		if msg, ok := c["message"].(map[string]any); ok {
			return msg["content"].(string), int(n)
		}
		return c["text"].(string), int(n)
	}
	var b strings.Builder
	n := 0
	for _, ev := range readSSE(t, resp) {
		cs, _ := ev["choices"].([]any)
		for _, c := range cs {
			c := c.(map[string]any)
			s, _ := c["text"].(string)
			if d, ok := c["delta"].(map[string]any); ok {
				s, _ = d["content"].(string)
			}
			if s != "" {
				b.WriteString(s)
				n++
			}
		}
	}
	return b.String(), n
}

// promptBlocks is the set of engine hashes in a rank's event history (its
// replay ring folded: stored minus removed) and in its pool.
func promptBlocks(t *testing.T, w *Worker) (events, pool map[uint64]bool) {
	t.Helper()
	ep := w.Endpoints()[0]
	events, _ = replayedBlocks(t, ep.Replay, w.Config().BlockSize)
	pool = map[uint64]bool{}
	for _, b := range w.CachedBlocks(ep.DPRank) {
		pool[b.Hash] = true
	}
	return events, pool
}

func TestDecodeWorkerPrefillsOnTheNamedPrefillWorker(t *testing.T) {
	chat := `"messages":[{"role":"user","content":"one two three four five six seven"}]`
	for _, tc := range []struct {
		name, path, body string
		stream           bool
		promptTokens     int // the prompt's length as the engine tokenizes it
	}{
		{"completions", "/v1/completions", `{"prompt":` + pdPrompt + `,"max_tokens":5}`, false, 10},
		{"completions streamed", "/v1/completions",
			`{"prompt":` + pdPrompt + `,"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`, true, 10},
		// role, 7 words, end of turn, assistant role
		{"chat", "/v1/chat/completions", `{` + chat + `,"max_tokens":5}`, false, 10},
		{"chat streamed", "/v1/chat/completions", `{` + chat + `,"max_completion_tokens":5,"stream":true}`, true, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pre, dec, preAddr, decURL, rec := pdPair(t)
			resp := post(t, decURL+tc.path, tc.body, DefaultPrefillerHeader, preAddr)
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			// The answer is the one an aggregated worker gives: same tokens,
			// as many as asked for.
			got, n := answerText(t, resp, tc.stream)
			_, aggURL := serve(t, Config{BlockSize: 4})
			want, _ := answerText(t, post(t, aggURL+tc.path, tc.body), tc.stream)
			if got != want || n != 5 {
				t.Fatalf("decode answered %q (%d tokens), an aggregated worker %q", got, n, want)
			}

			// The prefill worker saw one request on the same path: the same
			// body, but 1 token, not streamed, and do_remote_decode.
			seen := rec.take()
			if len(seen) != 1 {
				t.Fatalf("prefill worker saw %d requests", len(seen))
			}
			ex := seen[0]
			var orig map[string]any
			if err := json.Unmarshal([]byte(tc.body), &orig); err != nil {
				t.Fatal(err)
			}
			b := ex.body
			wantKV := map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
				"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
			if ex.path != tc.path || fmt.Sprint(b["kv_transfer_params"]) != fmt.Sprint(wantKV) || b["stream"] != false ||
				b["stream_options"] != nil || b["max_tokens"] != 1.0 ||
				(orig["max_completion_tokens"] != nil && b["max_completion_tokens"] != 1.0) ||
				fmt.Sprint(b["prompt"], b["messages"]) != fmt.Sprint(orig["prompt"], orig["messages"]) {
				t.Fatalf("prefill request %s %v", ex.path, b)
			}
			// Its answer carried the parameters the decode side then used.
			kv, _ := ex.answer["kv_transfer_params"].(map[string]any)
			if ex.status != http.StatusOK || kv["do_remote_prefill"] != true || kv["remote_engine_id"] != "mockworker-1-dp0" {
				t.Fatalf("prefill answer %d %v", ex.status, ex.answer)
			}

			// The prefill worker computed the prompt; the decode worker
			// computed none of it and pulled its three blocks instead.
			p, d := pre.PDCounts()[0], dec.PDCounts()[0]
			if p.RemoteDecodes != 1 || p.ComputedPrefill != uint64(tc.promptTokens) ||
				d.ComputedPrefill != 0 || d.RemotePrefills != 1 || d.TransferredBlocks != 3 {
				t.Fatalf("prefill %+v decode %+v", p, d)
			}
			// Both caches hold the prompt's two full blocks, and both KV
			// event streams said so: the decode side stored the pulled
			// blocks under the same engine hashes.
			preEv, prePool := promptBlocks(t, pre)
			decEv, decPool := promptBlocks(t, dec)
			if len(prePool) != tc.promptTokens/4 || fmt.Sprint(preEv) != fmt.Sprint(prePool) || fmt.Sprint(decEv) != fmt.Sprint(decPool) {
				t.Fatalf("prefill pool %v events %v; decode pool %v events %v", prePool, preEv, decPool, decEv)
			}
			for h := range prePool {
				if !decPool[h] {
					t.Fatalf("the decode worker does not cache prompt block %x (prefill %v, decode %v)", h, prePool, decPool)
				}
			}

			// The same request again: the decode worker caches the full
			// blocks now and pulls only the last, partial one.
			if _, n := answerText(t, post(t, decURL+tc.path, tc.body, DefaultPrefillerHeader, preAddr), tc.stream); n != 5 {
				t.Fatalf("the second request got %d tokens", n)
			}
			if d2 := dec.PDCounts()[0]; d2.TransferredBlocks-d.TransferredBlocks != 1 || d2.ComputedPrefill != 0 {
				t.Fatalf("a cached prompt: %+v after %+v", d2, d)
			}
		})
	}
}

// A request that already carries do_remote_prefill (a caller that ran the
// prefill stage itself) is the decode half alone, on a worker of any role.
func TestRemotePrefillParamsWithoutHeader(t *testing.T) {
	for _, role := range []string{RoleDecode, RoleBoth} {
		t.Run(role, func(t *testing.T) {
			w, url := serve(t, Config{Role: role, BlockSize: 4, KVTransferPerBlock: time.Millisecond})
			resp := post(t, url+"/v1/completions", `{"prompt":`+pdPrompt+`,"max_tokens":3,"kv_transfer_params":`+
				`{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e","remote_block_ids":[0,1,2],"remote_host":"10.0.0.1","remote_port":5600}}`)
			if _, n := answerText(t, resp, false); n != 3 {
				t.Fatalf("%d tokens", n)
			}
			if d := w.PDCounts()[0]; d.RemotePrefills != 1 || d.ComputedPrefill != 0 || d.TransferredBlocks != 3 || d.RemoteDecodes != 0 {
				t.Fatalf("counters %+v", d)
			}
			m := scrape(t, url)
			if m[`kvselect_mockworker_remote_prefill_requests_total{engine="0",model_name="mock-model"}`] != 1 ||
				m[`kvselect_mockworker_kv_transfer_blocks_total{engine="0",model_name="mock-model"}`] != 3 ||
				m[`vllm:prompt_tokens_total{engine="0",model_name="mock-model"}`] != 10 {
				t.Fatalf("metrics %v", m)
			}
		})
	}
}

func TestPrefillStageAnswersTransferParams(t *testing.T) {
	for _, tc := range []struct {
		name, advertise string
		host            string // "" = the address the request was sent to
		port            int
	}{
		{"request host", "", "", 0},
		{"advertised address", "10.0.0.7:8000", "10.0.0.7", 8000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, url := serve(t, Config{Role: RolePrefill, BlockSize: 4, WorkerID: 7, AdvertiseAddr: tc.advertise})
			resp := post(t, url+"/v1/completions", `{"prompt":`+pdPrompt+`,"max_tokens":1,"stream":false,`+
				`"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`)
			got := decodeJSON(t, resp.Body)
			if tc.host == "" {
				h, p, _ := net.SplitHostPort(strings.TrimPrefix(url, "http://"))
				tc.host, tc.port = h, mustAtoi(t, p)
			}
			kv, _ := got["kv_transfer_params"].(map[string]any)
			ids, _ := kv["remote_block_ids"].([]any)
			if kv["do_remote_prefill"] != true || kv["do_remote_decode"] != false || kv["remote_host"] != tc.host ||
				kv["remote_port"] != float64(tc.port) || kv["remote_engine_id"] != "mockworker-7-dp0" ||
				fmt.Sprint(ids) != "[0 1 2]" {
				t.Fatalf("kv_transfer_params = %v", kv)
			}
			if _, n := answerText(t, post(t, url+"/v1/completions", `{"prompt":[1],"max_tokens":1}`), false); n != 1 {
				t.Fatal("a plain request to a prefill worker")
			}
			if p := w.PDCounts()[0]; p.RemoteDecodes != 1 || p.ComputedPrefill != 11 {
				t.Fatalf("counters %+v", p)
			}
		})
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
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
	notJSON := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(rw, "<html>a proxy's page</html>")
	}))
	t.Cleanup(notJSON.Close)
	// A prefill worker that never answers: the decode worker gives up
	// after its prefill timeout, and the hung request ends with it.
	// (The body is read first: only then does the server notice the client
	// hanging up and cancel the request's context.)
	stop := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		select {
		case <-req.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(hung.Close)
	t.Cleanup(func() { close(stop) }) // runs first
	hostPort := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	_, decURL := serve(t, Config{Role: RoleDecode, BlockSize: 4, PrefillTimeout: 200 * time.Millisecond})
	plain := `{"prompt":[1,2,3],"max_tokens":2}`
	streamed := `{"prompt":[1,2,3],"max_tokens":2,"stream":true}`
	for _, tc := range []struct {
		name, url, body, prefiller string
		status                     int
		frag                       string
	}{
		{"prefill role refuses to decode", preURL, plain, "127.0.0.1:1", http.StatusBadRequest, "this is a prefill worker"},
		{"not host:port", decURL, plain, "http://10.0.0.1:8000", http.StatusBadRequest, "is not host:port"},
		{"dead prefill worker", decURL, plain, dead, http.StatusBadGateway, "prefill worker " + dead},
		{"dead prefill worker, streamed", decURL, streamed, dead, http.StatusBadGateway, "prefill worker " + dead},
		{"failing prefill worker", decURL, plain, hostPort(failing), http.StatusBadGateway,
			"prefill worker " + hostPort(failing) + " answered 500 Internal Server Error"},
		{"prefill answer not JSON", decURL, plain, hostPort(notJSON), http.StatusBadGateway,
			"prefill worker " + hostPort(notJSON) + ": answer is not JSON"},
		{"hung prefill worker", decURL, plain, hostPort(hung), http.StatusBadGateway,
			"prefill worker " + hostPort(hung)},
		{"invalid body", decURL, `{"prompt":`, dead, http.StatusBadRequest, "invalid JSON body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, tc.url+"/v1/completions", tc.body, DefaultPrefillerHeader, tc.prefiller)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.frag) ||
				resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d body %s, want %d with %q", resp.StatusCode, b, tc.status, tc.frag)
			}
		})
	}
}

func TestDisaggregationConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		frag string
	}{
		{Config{Role: "prefiller"}, "role must be both, prefill or decode"},
		{Config{KVTransferPerBlock: -time.Millisecond}, "KV transfer time per block must not be negative"},
		{Config{PrefillTimeout: -time.Second}, "prefill timeout must not be negative"},
		{Config{PrefillerHeader: "x prefiller"}, "is not an HTTP header name"},
		{Config{AdvertiseAddr: "10.0.0.1"}, "advertise address"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.frag) {
			t.Errorf("%+v: err = %v, want %q", tc.cfg, err, tc.frag)
		}
	}
	w, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if c := w.Config(); c.Role != RoleBoth || c.PrefillerHeader != "x-prefiller-host-port" || c.PrefillTimeout != DefaultPrefillTimeout ||
		c.KVTransferPerBlock != 0 || c.PrefillStallsDecode {
		t.Fatalf("defaults %+v", c)
	}
}

// scriptClock never sleeps. It logs each sleep's start and end under the name
// kind gives it (the tests tell sleeps apart by their lengths), and holds a
// sleep whose kind has a hold condition until the condition is true. Tests
// log their own events in the same log, so assertions are on the order of
// events, never on durations. Conditions run with mu held.
type scriptClock struct {
	kind func(time.Duration) string
	hold map[string]func(c *scriptClock) bool

	mu  sync.Mutex
	log []string
}

func (c *scriptClock) Now() time.Time { return time.Unix(1700000000, 0) }

func (c *scriptClock) Sleep(ctx context.Context, d time.Duration) error {
	k := c.kind(d)
	c.note(k + "+")
	var err error
	if cond := c.hold[k]; cond != nil {
		err = c.await(ctx, cond)
	}
	c.note(k + "-")
	return err
}

func (c *scriptClock) note(ev string) {
	c.mu.Lock()
	c.log = append(c.log, ev)
	c.mu.Unlock()
}

// await polls cond (with mu held) until it is true; a condition that never
// comes means the worker deadlocked, reported after waitFor.
func (c *scriptClock) await(ctx context.Context, cond func(c *scriptClock) bool) error {
	deadline := time.Now().Add(waitFor)
	for {
		c.mu.Lock()
		ok := cond(c)
		c.mu.Unlock()
		switch {
		case ok:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case time.Now().After(deadline):
			c.note("deadlock")
			return fmt.Errorf("scriptClock: condition not met after %v", waitFor)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// count is how many times ev was logged; with mu held.
func (c *scriptClock) count(ev string) int {
	n := 0
	for _, e := range c.log {
		if e == ev {
			n++
		}
	}
	return n
}

// last is whichever of evs was logged last ("" for none); with mu held.
func (c *scriptClock) last(evs ...string) string {
	for i := len(c.log) - 1; i >= 0; i-- {
		if slices.Contains(evs, c.log[i]) {
			return c.log[i]
		}
	}
	return ""
}

func (c *scriptClock) events() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.log)
}

// within counts the events named ev logged while a sleep of kind k was in
// progress, and after the last one ended.
func within(log []string, k, ev string) (inside, after int) {
	open := false
	for _, e := range log {
		switch e {
		case k + "+":
			open, after = true, 0
		case k + "-":
			open = false
		case ev:
			if open {
				inside++
			} else {
				after++
			}
		}
	}
	return inside, after
}

// A sequence decodes (40 tokens) while a 64-token prompt is prefilled on the
// same rank. With PrefillStallsDecode the prefill runs as four chunks of 16
// tokens (MaxNumBatchedTokens), and no decode step runs during a chunk,
// although the sequence is waiting for one during every chunk: its tokens
// come between the chunks and after the prefill. Without it the whole
// prefill is one computation, and the sequence's every remaining step runs
// during it. The clock holds each prefill sleep until the decoding sequence
// is waiting for a step (stalling) or has finished (not stalling), and the
// decoder's token callback waits for the next chunk to have begun, so that
// the order of events is forced, never raced against time.
func TestPrefillStallsDecode(t *testing.T) {
	const (
		itl        = time.Microsecond
		perToken   = time.Millisecond
		decodeToks = 40
	)
	for _, tc := range []struct {
		stall  bool
		chunks int
	}{{true, 4}, {false, 1}} {
		t.Run(fmt.Sprintf("stall=%v", tc.stall), func(t *testing.T) {
			clk := &scriptClock{kind: func(d time.Duration) string {
				switch d {
				case itl:
					return "step"
				case 4 * perToken: // the decoding sequence's own 4-token prompt
					return "own-prefill"
				}
				return "chunk"
			}}
			var waitingSince time.Time // of the current chunk's waiting decoder
			clk.hold = map[string]func(*scriptClock) bool{"chunk": func(c *scriptClock) bool {
				switch {
				case c.count("decoder done") > 0:
					return true
				case !tc.stall:
					return false
				case c.last("chunk+", "step-") == "step-":
					return true // a step ran during this chunk: the assertions below say so
				case c.last("tok", "step+") != "tok":
					return false
				}
				// The decoder took its token and has not started the step for
				// the next one: it waits for the engine step. The chunk lasts
				// a moment more, time for a decoder that did not wait to show
				// it (the correct worker passes however long it lasts).
				if c.last("chunk+", "decoder waiting") == "chunk+" {
					c.log = append(c.log, "decoder waiting")
					waitingSince = time.Now()
				}
				return time.Since(waitingSince) >= 2*time.Millisecond
			}}
			w := newWorker(t, Config{Clock: clk, BlockSize: 4, MaxNumBatchedTokens: 16, PrefillPerToken: perToken,
				DecodePerToken: itl, PrefillStallsDecode: tc.stall})
			ctx := context.Background()
			decoding := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				_, err := w.Generate(ctx, Request{Tokens: toks(1, 4), MaxTokens: decodeToks, OnToken: func(i int, _ uint32) error {
					if i == 1 {
						close(decoding)
					}
					if i >= 1 {
						chunk := min(i, tc.chunks)
						if err := clk.await(ctx, func(c *scriptClock) bool { return c.count("chunk+") >= chunk }); err != nil {
							return err
						}
					}
					clk.note("tok")
					return nil
				}})
				clk.note("decoder done")
				if err != nil {
					t.Error(err)
				}
			})
			<-decoding
			_, err := w.Generate(ctx, Request{Tokens: toks(1000, 64), MaxTokens: 1})
			wg.Wait()
			log := clk.events()
			if err != nil {
				t.Fatalf("%v; events %v", err, log)
			}
			inside, after := within(log, "chunk", "step+")
			waiting, _ := within(log, "chunk", "decoder waiting")
			total := clk.count("step+")
			t.Logf("%d prefill computations; decode steps: %d during them, %d after", clk.count("chunk+"), inside, after)
			if clk.count("chunk+") != tc.chunks || total != decodeToks-1 {
				t.Fatalf("%d prefill computations (want %d), %d decode steps (want %d); events %v",
					clk.count("chunk+"), tc.chunks, total, decodeToks-1, log)
			}
			if tc.stall {
				// Stalled in every chunk, resumed only after the prefill (a
				// step between two chunks at most).
				if inside != 0 || waiting != tc.chunks || after < decodeToks-1-(tc.chunks-1)-1 {
					t.Fatalf("stalling: %d steps during chunks, %d chunks with the decoder waiting, %d steps after the prefill; events %v",
						inside, waiting, after, log)
				}
			} else if inside != decodeToks-2 {
				// Every step after the first token's ran during the prefill.
				t.Fatalf("not stalling: %d of the %d steps ran during the prefill; events %v", inside, decodeToks-2, log)
			}
		})
	}
}

// A remotely prefilled request pulls its blocks without a prefill slot and
// without the engine step: it is served while another request's prefill
// chunk holds both, and a running sequence keeps decoding while it pulls.
// Each held sleep waits for what would deadlock if the pull needed the slot
// or the step.
func TestRemotePrefillNeedsNoSlotAndStallsNothing(t *testing.T) {
	const (
		itl      = time.Microsecond
		perToken = time.Millisecond
		perBlock = 7 * time.Millisecond
	)
	kind := func(d time.Duration) string {
		switch d {
		case itl:
			return "step"
		case 3 * perBlock: // a 10-token prompt's three blocks
			return "pull"
		case 16 * perToken:
			return "chunk"
		}
		return "own-prefill"
	}
	cfg := func(clk Clock) Config {
		return Config{Clock: clk, BlockSize: 4, MaxNumBatchedTokens: 16, PrefillPerToken: perToken, DecodePerToken: itl,
			KVTransferPerBlock: perBlock, PrefillSlots: 1, PrefillStallsDecode: true}
	}
	remote := func(from int) Request { return Request{Tokens: toks(from, 10), MaxTokens: 1, RemotePrefill: true} }
	ctx := context.Background()

	t.Run("during a prefill chunk", func(t *testing.T) {
		clk := &scriptClock{kind: kind, hold: map[string]func(*scriptClock) bool{
			"chunk": func(c *scriptClock) bool { return c.count("remote done") > 0 },
		}}
		w := newWorker(t, cfg(clk))
		var wg sync.WaitGroup
		wg.Go(func() {
			if _, err := w.Generate(ctx, Request{Tokens: toks(1000, 64), MaxTokens: 1}); err != nil {
				t.Error(err)
			}
		})
		err := clk.await(ctx, func(c *scriptClock) bool { return c.count("chunk+") > 0 })
		if err == nil {
			_, err = w.Generate(ctx, remote(500))
		}
		clk.note("remote done")
		wg.Wait()
		if err != nil {
			t.Fatalf("%v; events %v", err, clk.events())
		}
		if inside, _ := within(clk.events(), "chunk", "pull-"); inside != 1 {
			t.Fatalf("the pull did not run during the chunk: %v", clk.events())
		}
		if c := w.PDCounts()[0]; c.ComputedPrefill != 64 || c.TransferredBlocks != 3 || c.RemotePrefills != 1 {
			t.Fatalf("counters %+v", c)
		}
	})

	t.Run("beside a decoding sequence", func(t *testing.T) {
		const decodeToks = 20
		clk := &scriptClock{kind: kind, hold: map[string]func(*scriptClock) bool{
			"pull": func(c *scriptClock) bool { return c.count("decoder done") > 0 },
		}}
		w := newWorker(t, cfg(clk))
		decoding := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			_, err := w.Generate(ctx, Request{Tokens: toks(1, 4), MaxTokens: decodeToks, OnToken: func(i int, _ uint32) error {
				if i == 1 {
					close(decoding)
					return clk.await(ctx, func(c *scriptClock) bool { return c.count("pull+") > 0 })
				}
				return nil
			}})
			clk.note("decoder done")
			if err != nil {
				t.Error(err)
			}
		})
		<-decoding
		_, err := w.Generate(ctx, remote(500))
		wg.Wait()
		if err != nil {
			t.Fatalf("%v; events %v", err, clk.events())
		}
		if inside, _ := within(clk.events(), "pull", "step+"); inside != decodeToks-2 {
			t.Fatalf("%d of %d decode steps ran during the pull: %v", inside, decodeToks-2, clk.events())
		}
	})
}

// startSim runs llm-d-inference-sim on a free port (it refuses port 0), or
// skips the test without KVSELECT_LLMD_SIM (fails with
// KVSELECT_REQUIRE_LLMD_SIM=1).
func startSim(t *testing.T, blockSize int, extra ...string) *peerproc.SimProcess {
	t.Helper()
	bin := peerproc.SimBinary(t)
	port, err := peerproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var log logwatch.Buffer // the process's two output pipes write at once
	sim, err := peerproc.StartSim(ctx, peerproc.Sim{Binary: bin, Port: port, Model: "mock-model", BlockSize: blockSize,
		Extra: extra, Log: &log})
	if err != nil {
		t.Fatalf("%v; its output: %s", err, log.String())
	}
	t.Cleanup(sim.Stop)
	return sim
}

// llm-d's vLLM simulator as the prefill worker of a mock decode worker,
// behind a recording front. Observed deviations from vLLM, tolerated: its
// kv_transfer_params are placeholders ("remote_engine_id": "DUMMY_ID",
// "remote_block_ids": ["DUMMY_ID"] — strings where vLLM has integers —,
// "remote_host": "DUMMY", "remote_port": 1234) and its finish_reason is
// "remote_decode" (vLLM's is "length" at max_tokens 1). The mock's decode
// side passes the parameters through without reading them, so the exchange
// works.
func TestLLMDSimAsPrefillWorker(t *testing.T) {
	sim := startSim(t, 8) // the simulator's smallest block size is 8
	rec := &recorder{}
	front := httptest.NewServer(rec.wrap(forward(sim.URL())))
	t.Cleanup(front.Close)
	prompt := `[` + strings.Repeat("7,", 19) + `7]` // 20 tokens: three blocks of 8, the last partial
	dec, url := serve(t, Config{Role: RoleDecode, BlockSize: 8, KVTransferPerBlock: time.Millisecond})
	for i, stream := range []bool{true, false} {
		body := fmt.Sprintf(`{"model":"mock-model","prompt":%s,"max_tokens":4,"stream":%v}`, prompt, stream)
		resp := post(t, url+"/v1/completions", body, DefaultPrefillerHeader, strings.TrimPrefix(front.URL, "http://"))
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("stream=%v: status %d: %s", stream, resp.StatusCode, b)
		}
		if _, n := answerText(t, resp, stream); n != 4 {
			t.Fatalf("stream=%v: %d tokens", stream, n)
		}
		seen := rec.take()
		if len(seen) != 1 {
			t.Fatalf("the simulator saw %d requests", len(seen))
		}
		ex := seen[0]
		if kv, _ := ex.body["kv_transfer_params"].(map[string]any); kv["do_remote_decode"] != true || ex.body["max_tokens"] != 1.0 {
			t.Fatalf("prefill request %v", ex.body)
		}
		kv, _ := ex.answer["kv_transfer_params"].(map[string]any)
		if ex.status != http.StatusOK || kv["do_remote_prefill"] != true {
			t.Fatalf("the simulator answered %d %v", ex.status, ex.answer)
		}
		t.Logf("simulator's prefill answer: finish_reason %v, kv_transfer_params %v", choice0(t, ex.answer)["finish_reason"], kv)
		// The first request pulled all three blocks, the second only the
		// partial one: the decode worker cached the full ones.
		want := []uint64{3, 4}[i]
		if d := dec.PDCounts()[0]; d.RemotePrefills != uint64(i+1) || d.ComputedPrefill != 0 || d.TransferredBlocks != want {
			t.Fatalf("decode counters %+v", d)
		}
	}
	// The simulator did the prefills (max_tokens 1 each). Its counters may
	// trail its answers, so they are polled.
	var promptToks, gen float64
	eventually(t, "the simulator's counters to show two 20-token prefills of one token each", func() bool {
		promptToks, gen = 0, 0
		for k, v := range scrape(t, sim.URL()) {
			switch {
			case strings.HasPrefix(k, "vllm:prompt_tokens_total"):
				promptToks += v
			case strings.HasPrefix(k, "vllm:generation_tokens_total"):
				gen += v
			}
		}
		return promptToks == 40 && gen == 2
	})
}

// llm-d's vLLM simulator as the decode worker after a mock prefill worker;
// the test plays the routing sidecar. The simulator rejects vLLM's integer
// remote_block_ids with 400 (it declares them strings); the test notes that
// deviation and retries with the ids as strings, which the simulator
// accepts: it then decodes after its --kv-cache-transfer-latency, and caches
// the prompt as if it had computed it (a later plain request hits).
func TestLLMDSimAsDecodeWorker(t *testing.T) {
	sim := startSim(t, 8, "--kv-cache-transfer-latency", "1ms")
	pre, preURL := serve(t, Config{Role: RolePrefill, BlockSize: 8, WorkerID: 3})
	prompt := `[` + strings.Repeat("9,", 19) + `9]`
	stage := post(t, preURL+"/v1/completions", `{"model":"mock-model","prompt":`+prompt+`,"max_tokens":1,"stream":false,`+
		`"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`)
	kv, _ := decodeJSON(t, stage.Body)["kv_transfer_params"].(map[string]any)
	if kv["do_remote_prefill"] != true || pre.PDCounts()[0].RemoteDecodes != 1 {
		t.Fatalf("mock prefill stage answered %v", kv)
	}
	decode := func(kv map[string]any) *http.Response {
		b, err := json.Marshal(map[string]any{"model": "mock-model", "prompt": json.RawMessage(prompt), "max_tokens": 4,
			"stream": true, "kv_transfer_params": kv})
		if err != nil {
			t.Fatal(err)
		}
		return post(t, sim.URL()+"/v1/completions", string(b))
	}
	resp := decode(kv)
	if resp.StatusCode == http.StatusBadRequest {
		b, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(b), "remote_block_ids") {
			t.Fatalf("the simulator refused the decode: %s", b)
		}
		t.Logf("known deviation: the simulator refuses integer remote_block_ids: %s", bytes.TrimSpace(b))
		ids, _ := kv["remote_block_ids"].([]any)
		strs := make([]string, len(ids))
		for i, id := range ids {
			strs[i] = fmt.Sprint(id)
		}
		kv["remote_block_ids"] = strs
		resp = decode(kv)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	// The simulator's default mode picks an output length up to max_tokens.
	if _, n := answerText(t, resp, true); n < 1 || n > 4 {
		t.Fatalf("%d tokens", n)
	}
	again := decodeJSON(t, post(t, sim.URL()+"/v1/completions", `{"model":"mock-model","prompt":`+prompt+`,"max_tokens":1}`).Body)
	u, _ := again["usage"].(map[string]any)
	details, _ := u["prompt_tokens_details"].(map[string]any)
	if details["cached_tokens"] != 16.0 {
		t.Fatalf("after the remote prefill the simulator caches %v of the prompt's tokens, want its two full blocks (16)", details["cached_tokens"])
	}
}
