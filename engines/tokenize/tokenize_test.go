package tokenize_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvselect/kvselect/engines/tokenize"
	"github.com/kvselect/kvselect/mockworker"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

func ptr[T any](v T) *T { return &v }

// newService is a real selection service with the given workers at the
// given base URLs.
func newService(t *testing.T, model string, urls ...string) *selection.Service {
	t.Helper()
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	svc, err := selection.New(selection.Config{Router: rc})
	if err != nil {
		t.Fatal(err)
	}
	for i, u := range urls {
		rec := catalog.Record{WorkerID: uint64(i + 1), ModelName: model, Endpoint: ptr(u), BlockSize: ptr(uint32(16))}
		if _, err := svc.UpsertWorker(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
	}
	return svc
}

// mockEngine serves a real mock worker's API on loopback.
func mockEngine(t *testing.T) string {
	t.Helper()
	w, err := mockworker.New(mockworker.Config{Model: "mock-model", WorkerID: 1})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(w.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

func newTokenizer(t *testing.T, cfg tokenize.Config, pool tokenize.Pool) *tokenize.Tokenizer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	tk, err := tokenize.New(ctx, cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// engineIDs asks an engine's /tokenize directly: the reference answer.
func engineIDs(t *testing.T, base string, req *selection.TokenizeRequest) []uint32 {
	t.Helper()
	body := map[string]any{"model": req.ModelName}
	if req.Messages != nil {
		msgs := make([]json.RawMessage, len(req.Messages))
		for i, m := range req.Messages {
			msgs[i] = m
		}
		body["messages"] = msgs
		for _, o := range req.Options {
			body[o.Name] = json.RawMessage(o.Value)
		}
	} else {
		body["prompt"] = req.Prompt
	}
	b, _ := json.Marshal(body)
	resp, err := http.Post(base+"/tokenize", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reference /tokenize: %d %s", resp.StatusCode, raw)
	}
	ids, err := tokenize.ParseResponse(raw, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// conversation is a seeded random multi-turn chat: a system prompt from a
// small shared set, then user and assistant turns whose contents mix words,
// whitespace at both ends, newlines, punctuation and digits.
type conversation struct {
	rng  *rand.Rand
	msgs [][]byte
}

var pieces = []string{"the", "cache", "  ", "\n", "\n\n", "tokens", ",", ".", "42", " ", "route", "数字", "\"q\"", "prefix", "end.\n"}

func (c *conversation) content() string {
	var b strings.Builder
	for range 3 + c.rng.IntN(25) {
		b.WriteString(pieces[c.rng.IntN(len(pieces))])
		if c.rng.IntN(2) == 0 {
			b.WriteByte(' ')
		}
	}
	return b.String()
}

func (c *conversation) add(role string) {
	b, _ := json.Marshal(map[string]string{"role": role, "content": c.content()})
	c.msgs = append(c.msgs, b)
}

func (c *conversation) request(model string, gen *bool) *selection.TokenizeRequest {
	req := &selection.TokenizeRequest{PartitionKey: selection.PartitionKey{ModelName: model}, Messages: slices.Clone(c.msgs)}
	if gen != nil {
		req.Options = []selection.TokenizeOption{{Name: "add_generation_prompt", Value: []byte(strconv.FormatBool(*gen))}}
	}
	return req
}

// checkAgainstEngine replays randomised multi-turn conversations through the
// tokenizer and compares every answer with the engine's own /tokenize of the
// whole request: any mismatch fails. It returns the tokenizer's counters.
func checkAgainstEngine(t *testing.T, base, model string, cfg tokenize.Config, wantPrefixHits bool) tokenize.Stats {
	t.Helper()
	cfg.Endpoints = map[string]string{model: base}
	cfg.Mode = tokenize.ModeEndpoint
	cfg.Timeout = 5 * time.Second // correctness, not latency: no fallback expected
	tk := newTokenizer(t, cfg, nil)
	rng := rand.New(rand.NewPCG(17, uint64(len(model))))
	// Wait for the template probe once, so that later turns can compose.
	first := &conversation{rng: rng}
	first.add("system")
	first.add("user")
	if _, err := tk.Tokenize(context.Background(), first.request(model, nil)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, decided := tk.TemplateState(first.request(model, nil)); decided || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	reusable, decided := tk.TemplateState(first.request(model, nil))
	if !decided {
		t.Fatal("the template probe did not finish")
	}
	if wantPrefixHits && !reusable {
		t.Fatal("the probe found the template not reusable at message borders")
	}
	for conv := range 12 {
		c := &conversation{rng: rng}
		c.add("system")
		for turn := range 2 + rng.IntN(5) {
			c.add("user")
			var gen *bool
			switch rng.IntN(4) {
			case 0:
				gen = ptr(false)
			case 1:
				gen = ptr(true)
			}
			req := c.request(model, gen)
			got, err := tk.Tokenize(context.Background(), req)
			if err != nil {
				t.Fatalf("conversation %d turn %d: %v", conv, turn, err)
			}
			if want := engineIDs(t, base, req); !slices.Equal(got, want) {
				t.Fatalf("conversation %d turn %d: tokenizer answered %d ids that the engine does not produce:\n got %v\nwant %v",
					conv, turn, len(got), got, want)
			}
			// A repeat is a whole-request hit with the same ids.
			if again, err := tk.Tokenize(context.Background(), req); err != nil || !slices.Equal(again, got) {
				t.Fatalf("repeat: %v", err)
			}
			c.add("assistant")
		}
	}
	// Completions prompts: whole-request cache only.
	for i := range 5 {
		req := &selection.TokenizeRequest{PartitionKey: selection.PartitionKey{ModelName: model},
			Prompt: (&conversation{rng: rng}).content() + strconv.Itoa(i)}
		got, err := tk.Tokenize(context.Background(), req)
		if err != nil || !slices.Equal(got, engineIDs(t, base, req)) {
			t.Fatalf("prompt %d: %v %v", i, got, err)
		}
	}
	st := tk.Stats()
	if wantPrefixHits && st.Requests["prefix_cache"] == 0 {
		t.Fatalf("no conversation prefix was reused: %+v", st)
	}
	if st.Requests["cache"] == 0 {
		t.Fatalf("no whole-request hit: %+v", st)
	}
	if st.Requests["fallback"] != 0 || st.PrefixMismatch != 0 {
		t.Fatalf("fallbacks or mismatches: %+v", st)
	}
	return st
}

func TestCacheAnswersOnlyTheMockWorkersOwnIDs(t *testing.T) {
	st := checkAgainstEngine(t, mockEngine(t), "mock-model", tokenize.Config{}, true)
	t.Logf("mock worker: %+v", st)
}

// A template that is not a concatenation of its messages — here the mock's
// template behind a proxy that numbers the turns, so a message renders
// differently by its position — fails the probe: answers stay exact, served
// from the engine and the whole-request cache only.
func TestNonConcatenativeTemplateIsNeverComposed(t *testing.T) {
	inner := mockEngine(t)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]json.RawMessage
		_ = json.NewDecoder(r.Body).Decode(&body)
		var msgs []map[string]any
		if err := json.Unmarshal(body["messages"], &msgs); err == nil {
			for i, m := range msgs {
				m["content"] = fmt.Sprintf("turn %d: %v", i, m["content"])
			}
			body["messages"], _ = json.Marshal(msgs)
		}
		b, _ := json.Marshal(body)
		resp, err := http.Post(inner+"/tokenize", "application/json", strings.NewReader(string(b)))
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(proxy.Close)
	st := checkAgainstEngine(t, proxy.URL, "mock-model", tokenize.Config{}, false)
	if st.Requests["prefix_cache"] != 0 {
		t.Fatalf("composed answers from a template the probe refused: %+v", st)
	}
}

// Every way an engine can fail a call ends in an error counted under its
// reason — the front then routes on the text index — and never in ids.
func TestBadEnginesFallBackCountedByReason(t *testing.T) {
	huge := `{"tokens":[` + strings.Repeat("1,", 200) + `1]}`
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		reason  string
	}{
		{"garbage", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "<html>hello</html>") }, tokenize.ReasonBadResponse},
		{"wrong shape", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{"tokens":"1 2 3"}`) }, tokenize.ReasonBadResponse},
		{"4xx", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":"bad"}`)
		}, tokenize.ReasonStatus},
		{"5xx", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }, tokenize.ReasonStatus},
		{"too many tokens", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, huge) }, tokenize.ReasonTooLarge},
		{"too many bytes", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, `{"tokens":[1],"pad":"`+strings.Repeat("x", 4096)+`"}`)
		}, tokenize.ReasonTooLarge},
		{"slow", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(300 * time.Millisecond):
			}
			_, _ = io.WriteString(w, `{"tokens":[1]}`)
		}, tokenize.ReasonTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			t.Cleanup(srv.Close)
			tk := newTokenizer(t, tokenize.Config{Mode: tokenize.ModePool, Timeout: 50 * time.Millisecond,
				MaxTokens: 100, MaxResponseBytes: 2048}, newService(t, "m", srv.URL).Inspect())
			ids, err := tk.Tokenize(context.Background(), &selection.TokenizeRequest{
				PartitionKey: selection.PartitionKey{ModelName: "m"}, Prompt: "some text"})
			fe, ok := errors.AsType[*tokenize.FallbackError](err)
			if ids != nil || !ok || fe.Reason != tc.reason {
				t.Fatalf("got %v, %v; want a %s fallback", ids, err, tc.reason)
			}
			if st := tk.Stats(); st.Fallbacks[tc.reason] != 1 || st.Requests["fallback"] != 1 {
				t.Fatalf("counters %+v", st)
			}
		})
	}
	t.Run("no worker", func(t *testing.T) {
		tk := newTokenizer(t, tokenize.Config{Mode: tokenize.ModePool}, newService(t, "m").Inspect())
		_, err := tk.Tokenize(context.Background(), &selection.TokenizeRequest{PartitionKey: selection.PartitionKey{ModelName: "m"}, Prompt: "x"})
		if fe, ok := errors.AsType[*tokenize.FallbackError](err); !ok || fe.Reason != tokenize.ReasonNoWorker {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("unavailable", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL
		srv.Close()
		tk := newTokenizer(t, tokenize.Config{Mode: tokenize.ModePool, Timeout: time.Second}, newService(t, "m", url).Inspect())
		_, err := tk.Tokenize(context.Background(), &selection.TokenizeRequest{PartitionKey: selection.PartitionKey{ModelName: "m"}, Prompt: "x"})
		if fe, ok := errors.AsType[*tokenize.FallbackError](err); !ok || fe.Reason != tokenize.ReasonUnavailable {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("endpoint mode without an endpoint for the model", func(t *testing.T) {
		tk := newTokenizer(t, tokenize.Config{Mode: tokenize.ModeEndpoint, Endpoints: map[string]string{"a": "http://127.0.0.1:1"}}, nil)
		_, err := tk.Tokenize(context.Background(), &selection.TokenizeRequest{PartitionKey: selection.PartitionKey{ModelName: "b"}, Prompt: "x"})
		if fe, ok := errors.AsType[*tokenize.FallbackError](err); !ok || fe.Reason != tokenize.ReasonNoEndpoint {
			t.Fatalf("got %v", err)
		}
	})
}

// A call that outlives its budget still finishes in the background and fills
// the cache: the request falls back, the next identical one is a hit.
func TestLateAnswerFillsTheCache(t *testing.T) {
	srv, release := heldEngine(t)
	// The late call may take long on a loaded machine; it must not give up
	// before the test releases it (that would make a second engine call).
	tk := newTokenizer(t, tokenize.Config{Mode: tokenize.ModePool, Timeout: 10 * time.Millisecond, BackgroundTimeout: time.Minute},
		newService(t, "m", srv.URL).Inspect())
	req := &selection.TokenizeRequest{PartitionKey: selection.PartitionKey{ModelName: "m"}, Prompt: "late"}
	if _, err := tk.Tokenize(context.Background(), req); err == nil {
		t.Fatal("answered within a budget the engine cannot meet")
	}
	release <- struct{}{}
	// Requests that arrive while the call still runs wait for it (within
	// their budget); once it is over the answer is a cache hit.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, err := tk.Tokenize(context.Background(), req); err == nil {
			break
		}
	}
	ids, err := tk.Tokenize(context.Background(), req)
	if err != nil || !slices.Equal(ids, []uint32{5, 6}) {
		t.Fatalf("ids %v, %v", ids, err)
	}
	if st := tk.Stats(); st.Requests["cache"] < 1 || st.EngineCalls != 1 {
		t.Fatalf("counters %+v: want one engine call, then cache hits", st)
	}
}

// Pool mode asks the least-loaded worker of the partition.
func TestPoolAsksTheLeastLoadedWorker(t *testing.T) {
	var calls [2]int
	var urls []string
	for i := range 2 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			calls[i]++
			_, _ = io.WriteString(w, `{"tokens":[1,2,3]}`)
		}))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	svc := newService(t, "m", urls...)
	// Worker 1 is busy.
	if _, err := svc.Reserve(context.Background(), &selection.ReservationRequest{PartitionKey: selection.PartitionKey{ModelName: "m"},
		SelectionID: ptr("busy"), WorkerID: ptr(uint64(1)), PromptRequest: selection.PromptRequest{TokenIDs: make([]uint32, 64)}}); err != nil {
		t.Fatal(err)
	}
	tk := newTokenizer(t, tokenize.Config{Mode: tokenize.ModePool, CacheTokens: -1, Timeout: time.Second}, svc.Inspect())
	for i := range 6 {
		if _, err := tk.Tokenize(context.Background(), &selection.TokenizeRequest{PartitionKey: selection.PartitionKey{ModelName: "m"},
			Prompt: fmt.Sprint("p", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if calls[0] != 0 || calls[1] != 6 {
		t.Fatalf("calls per worker %v: want all on the idle worker 2", calls)
	}
}

// heldEngine is a /tokenize that answers [5, 6] once per value sent on
// release.
func heldEngine(t *testing.T) (*httptest.Server, chan struct{}) {
	t.Helper()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		<-release
		_, _ = io.WriteString(w, `{"count":2,"tokens":[5,6]}`)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	return srv, release
}

// estimatingPool is a real service's view with a fixed prefill estimate.
type estimatingPool struct {
	tokenize.Pool
	estimate time.Duration
	asked    atomic.Int64 // the token count last asked about
}

func (p *estimatingPool) PrefillEstimate(_ string, tokens int) time.Duration {
	p.asked.Store(int64(tokens))
	return p.estimate
}

// The adaptive budget waits for the ids as long as they are predicted to
// save, within --tokenize-timeout and --tokenize-timeout-max.
func TestAdaptiveBudget(t *testing.T) {
	srv, release := heldEngine(t)
	pool := &estimatingPool{Pool: newService(t, "m", srv.URL).Inspect()}
	tk := newTokenizer(t, tokenize.Config{Mode: tokenize.ModePool, Timeout: 10 * time.Millisecond, MaxTimeout: time.Minute,
		BackgroundTimeout: time.Minute, CacheTokens: -1}, pool)
	req := func(prompt string) *selection.TokenizeRequest {
		return &selection.TokenizeRequest{PartitionKey: selection.PartitionKey{ModelName: "m"}, Prompt: prompt}
	}

	// Little to save: the floor, which the held engine cannot meet.
	pool.estimate = time.Microsecond
	if _, err := tk.Tokenize(context.Background(), req("short")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the floor's timeout", err)
	}
	if got := pool.asked.Load(); got != int64(len("short")/4) {
		t.Errorf("estimate asked for %d tokens, want %d (four bytes a token)", got, len("short")/4)
	}
	release <- struct{}{} // the background call of "short" ends

	// Much to save: the call waits for the engine.
	pool.estimate = 10 * time.Minute // capped at MaxTimeout
	done := make(chan error, 1)
	go func() {
		_, err := tk.Tokenize(context.Background(), req(strings.Repeat("long prompt ", 100)))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond) // past the floor
	release <- struct{}{}
	if err := <-done; err != nil {
		t.Fatalf("a prompt worth waiting for fell back: %v", err)
	}
}
