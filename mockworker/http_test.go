package mockworker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func serve(t *testing.T, cfg Config) (*Worker, string) {
	t.Helper()
	w := newWorker(t, cfg)
	srv := httptest.NewServer(w.Handler())
	t.Cleanup(srv.Close)
	return w, srv.URL
}

func post(t *testing.T, url, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func decodeJSON(t *testing.T, r io.Reader) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.NewDecoder(r).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// readSSE parses a text/event-stream body the way an OpenAI client does: one
// JSON object per "data:" event, up to the [DONE] sentinel, which must come
// last.
func readSSE(t *testing.T, resp *http.Response) []map[string]any {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	var out []map[string]any
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		if done {
			t.Fatalf("event after [DONE]: %q", line)
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !done {
		t.Fatal("stream ended without [DONE]")
	}
	return out
}

func choice0(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	cs, ok := m["choices"].([]any)
	if !ok || len(cs) == 0 {
		t.Fatalf("no choices in %v", m)
	}
	return cs[0].(map[string]any)
}

func TestCompletionsStream(t *testing.T) {
	_, url := serve(t, Config{BlockSize: 4})
	body := `{"model":"mock-model","prompt":"the quick brown fox jumps over the lazy dog","max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`
	resp := post(t, url+"/v1/completions", body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	events := readSSE(t, resp)
	if len(events) != 6 {
		t.Fatalf("%d events, want 5 token chunks and a usage chunk", len(events))
	}
	var text strings.Builder
	for i, ev := range events[:5] {
		if ev["object"] != "text_completion" || ev["model"] != "mock-model" || !strings.HasPrefix(ev["id"].(string), "cmpl-") {
			t.Fatalf("chunk %d: %v", i, ev)
		}
		c := choice0(t, ev)
		text.WriteString(c["text"].(string))
		wantFinish := any(nil)
		if i == 4 {
			wantFinish = "length"
		}
		if c["finish_reason"] != wantFinish {
			t.Fatalf("chunk %d finish_reason %v", i, c["finish_reason"])
		}
	}
	last := events[5]
	if cs := last["choices"].([]any); len(cs) != 0 {
		t.Fatalf("usage chunk has choices %v", cs)
	}
	u := last["usage"].(map[string]any)
	if u["prompt_tokens"] != 9.0 || u["completion_tokens"] != 5.0 || u["total_tokens"] != 14.0 {
		t.Fatalf("usage %v", u)
	}
	// The same request without streaming generates the same text.
	resp = post(t, url+"/v1/completions", strings.Replace(body, `"stream":true,"stream_options":{"include_usage":true}`, `"stream":false`, 1))
	m := decodeJSON(t, resp.Body)
	if got := choice0(t, m)["text"]; got != text.String() {
		t.Fatalf("non-streamed text %q, streamed %q", got, text.String())
	}
	// Identical prompt: two blocks (8 of 9 tokens) now come from the cache.
	if cached := m["usage"].(map[string]any)["prompt_tokens_details"].(map[string]any)["cached_tokens"]; cached != 8.0 {
		t.Fatalf("cached tokens %v, want 8", cached)
	}
}

func TestCompletionsPromptForms(t *testing.T) {
	_, url := serve(t, Config{BlockSize: 4})
	for _, c := range []struct {
		prompt  string
		choices int
		tokens  float64
	}{
		{`"hello world"`, 1, 2},
		{`[300, 301, 302]`, 1, 3},
		{`["a b", "c d e"]`, 2, 5},
		{`[[300, 301], [302, 303, 304, 305]]`, 2, 6},
	} {
		resp := post(t, url+"/v1/completions", `{"prompt":`+c.prompt+`,"max_tokens":2}`)
		if resp.StatusCode != 200 {
			t.Fatalf("prompt %s: status %d", c.prompt, resp.StatusCode)
		}
		m := decodeJSON(t, resp.Body)
		cs := m["choices"].([]any)
		if len(cs) != c.choices {
			t.Fatalf("prompt %s: %d choices", c.prompt, len(cs))
		}
		for i, ch := range cs {
			if ch.(map[string]any)["index"] != float64(i) {
				t.Fatalf("prompt %s: choice %d has index %v", c.prompt, i, ch.(map[string]any)["index"])
			}
		}
		if got := m["usage"].(map[string]any)["prompt_tokens"]; got != c.tokens {
			t.Fatalf("prompt %s: %v prompt tokens, want %v", c.prompt, got, c.tokens)
		}
	}
	// Streaming a list interleaves chunks of both choices.
	events := readSSE(t, post(t, url+"/v1/completions", `{"prompt":["a","b"],"max_tokens":3,"stream":true}`))
	seen := map[float64]int{}
	for _, ev := range events {
		seen[choice0(t, ev)["index"].(float64)]++
	}
	if seen[0] != 3 || seen[1] != 3 {
		t.Fatalf("chunks per choice %v", seen)
	}
}

func TestChatCompletions(t *testing.T) {
	_, url := serve(t, Config{BlockSize: 4})
	msgs := `"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi there"}]}]`
	resp := post(t, url+"/v1/chat/completions", `{"model":"mock-model",`+msgs+`,"max_tokens":4}`)
	m := decodeJSON(t, resp.Body)
	if m["object"] != "chat.completion" {
		t.Fatalf("response %v", m)
	}
	msg := choice0(t, m)["message"].(map[string]any)
	if msg["role"] != "assistant" || len(strings.Fields(msg["content"].(string))) != 4 {
		t.Fatalf("message %v", msg)
	}
	events := readSSE(t, post(t, url+"/v1/chat/completions", `{`+msgs+`,"max_completion_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`))
	if len(events) != 6 {
		t.Fatalf("%d events, want role + 4 tokens + usage", len(events))
	}
	if d := choice0(t, events[0])["delta"].(map[string]any); d["role"] != "assistant" {
		t.Fatalf("first delta %v", d)
	}
	var content strings.Builder
	for _, ev := range events[1:5] {
		if ev["object"] != "chat.completion.chunk" {
			t.Fatalf("chunk %v", ev)
		}
		content.WriteString(choice0(t, ev)["delta"].(map[string]any)["content"].(string))
	}
	if content.String() != msg["content"] {
		t.Fatalf("streamed %q, non-streamed %q", content.String(), msg["content"])
	}
	if choice0(t, events[4])["finish_reason"] != "length" {
		t.Fatalf("last token chunk %v", events[4])
	}
	if u := events[5]["usage"].(map[string]any); u["completion_tokens"] != 4.0 {
		t.Fatalf("usage %v", u)
	}
}

func TestAPIErrors(t *testing.T) {
	_, url := serve(t, Config{BlockSize: 4, MaxModelLen: 64, DPSize: 2})
	for _, c := range []struct {
		name, path, body string
		hdr              []string
		status           int
	}{
		{"bad-json", "/v1/completions", `{"prompt":`, nil, 400},
		{"trailing", "/v1/completions", `{"prompt":"a"} {}`, nil, 400},
		{"no-prompt", "/v1/completions", `{}`, nil, 400},
		{"empty-prompt", "/v1/completions", `{"prompt":""}`, nil, 400},
		{"empty-ids", "/v1/completions", `{"prompt":[]}`, nil, 400},
		{"negative-id", "/v1/completions", `{"prompt":[1,-2]}`, nil, 400},
		{"bad-prompt-type", "/v1/completions", `{"prompt":{"a":1}}`, nil, 400},
		{"out-of-vocab", "/v1/completions", `{"prompt":[4000000000]}`, nil, 400},
		{"unknown-model", "/v1/completions", `{"model":"gpt-5","prompt":"a"}`, nil, 404},
		{"n-2", "/v1/completions", `{"prompt":"a","n":2}`, nil, 400},
		{"zero-max-tokens", "/v1/completions", `{"prompt":"a","max_tokens":0}`, nil, 400},
		{"too-long", "/v1/completions", `{"prompt":"a","max_tokens":100}`, nil, 400},
		{"stream-options-without-stream", "/v1/completions", `{"prompt":"a","stream_options":{"include_usage":true}}`, nil, 400},
		{"bad-rank-header", "/v1/completions", `{"prompt":"a"}`, []string{HeaderDPRank, "x"}, 400},
		{"rank-not-served", "/v1/completions", `{"prompt":"a"}`, []string{HeaderDPRank, "5"}, 400},
		{"bad-worker-header", "/v1/completions", `{"prompt":"a"}`, []string{HeaderWorkerID, "-1"}, 400},
		{"no-messages", "/v1/chat/completions", `{"messages":[]}`, nil, 400},
		{"no-role", "/v1/chat/completions", `{"messages":[{"content":"a"}]}`, nil, 400},
		{"image-part", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, nil, 400},
		{"bad-content", "/v1/chat/completions", `{"messages":[{"role":"user","content":5}]}`, nil, 400},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := post(t, url+c.path, c.body, c.hdr...)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			e, ok := decodeJSON(t, resp.Body)["error"].(map[string]any)
			if !ok || e["message"] == "" || e["code"] != float64(c.status) {
				t.Fatalf("error body %v", e)
			}
		})
	}
	resp, err := http.Get(url + "/v1/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET /v1/completions: %d", resp.StatusCode)
	}
}

func TestRankHeaders(t *testing.T) {
	_, url := serve(t, Config{BlockSize: 4, DPSize: 2, DPStartRank: 6, WorkerID: 42})
	for _, c := range []struct {
		hdr  []string
		rank string
	}{
		{[]string{HeaderDPRank, "7"}, "7"},
		{[]string{HeaderEngineDPRank, "7"}, "7"},
		{[]string{HeaderWorkerID, "42", HeaderDPRank, "7"}, "7"},
		// Routed to another worker, fell back here: its rank means nothing here.
		{[]string{HeaderWorkerID, "41", HeaderDPRank, "9"}, "6"},
		{nil, "6"}, // idle ranks: the first
	} {
		resp := post(t, url+"/v1/completions", `{"prompt":"a b c","max_tokens":1}`, c.hdr...)
		if resp.StatusCode != 200 || resp.Header.Get(HeaderDPRank) != c.rank || resp.Header.Get(HeaderWorkerID) != "42" {
			t.Fatalf("headers %v: status %d, served by %s/%s", c.hdr, resp.StatusCode,
				resp.Header.Get(HeaderWorkerID), resp.Header.Get(HeaderDPRank))
		}
	}
}

func TestModelsHealthReset(t *testing.T) {
	_, url := serve(t, Config{Model: "m1", MaxModelLen: 1000})
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m := decodeJSON(t, resp.Body)
	d := m["data"].([]any)[0].(map[string]any)
	if m["object"] != "list" || d["id"] != "m1" || d["max_model_len"] != 1000.0 {
		t.Fatalf("models %v", m)
	}
	if resp, err := http.Get(url + "/health"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", resp, err)
	}
	if resp := post(t, url+"/reset_prefix_cache", ""); resp.StatusCode != 200 {
		t.Fatalf("reset: %d", resp.StatusCode)
	}
}

// scrape reads /metrics into "name{labels}" → value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range bytes.Split(body, []byte("\n")) {
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		i := bytes.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(string(line[i+1:]), 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[string(line[:i])] = v
	}
	return out
}

func TestMetricsScraped(t *testing.T) {
	_, url := serve(t, Config{BlockSize: 4, DPSize: 2})
	for range 2 {
		// 9 prompt tokens, the second time 8 of them from rank 1's cache.
		post(t, url+"/v1/completions", `{"prompt":[1,2,3,4,5,6,7,8,9],"max_tokens":3}`, HeaderDPRank, "1")
	}
	got := scrape(t, url)
	lbl := func(name, engine string) string {
		return name + `{engine="` + engine + `",model_name="mock-model"}`
	}
	for name, want := range map[string]float64{
		lbl("vllm:prefix_cache_queries_total", "1"):                                                            18,
		lbl("vllm:prefix_cache_hits_total", "1"):                                                               8,
		lbl("vllm:prefix_cache_queries_total", "0"):                                                            0,
		lbl("vllm:num_requests_running", "1"):                                                                  0,
		lbl("vllm:num_requests_waiting", "1"):                                                                  0,
		lbl("vllm:kv_cache_usage_perc", "1"):                                                                   0,
		lbl("vllm:prompt_tokens_total", "1"):                                                                   18,
		lbl("vllm:generation_tokens_total", "1"):                                                               6,
		`vllm:request_success_total{engine="1",finished_reason="length",model_name="mock-model"}`:              2,
		lbl("vllm:time_to_first_token_seconds_count", "1"):                                                     2,
		`vllm:cache_config_info{block_size="4",enable_prefix_caching="True",engine="1",num_gpu_blocks="4096"}`: 1,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
}

// FuzzCompletionsBody feeds arbitrary bodies and rank headers to the
// completions and chat handlers: every input gets a JSON answer with a
// status from the API's set, never a panic.
func FuzzCompletionsBody(f *testing.F) {
	w, err := New(fast(Config{BlockSize: 4, NumBlocks: 64, MaxModelLen: 256, VocabSize: 1000, DPSize: 2}))
	if err != nil {
		f.Fatal(err)
	}
	defer w.Close()
	h := w.Handler()
	for _, seed := range []string{
		`{"prompt":"hello world","max_tokens":2}`,
		`{"prompt":[1,2,3],"max_tokens":1,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":[[1,2],[3]],"max_tokens":2}`,
		`{"prompt":["a","b"],"stream":true}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"stream":true}`,
		`{"model":"x"}`, `[]`, `null`, `{"prompt":1e99}`,
	} {
		f.Add(seed, "", false)
		f.Add(seed, "1", true)
	}
	f.Fuzz(func(t *testing.T, body, rank string, chat bool) {
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
		}
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		if rank != "" {
			req.Header.Set(HeaderDPRank, rank)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case 200, 400, 404, 413:
		default:
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body)
		}
		if rec.Code != 200 && !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("error body is not JSON: %q", rec.Body)
		}
	})
}

func tokenizeIDs(t *testing.T, url, body string) []uint32 {
	t.Helper()
	resp := post(t, url+"/tokenize", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/tokenize %s: status %d", body, resp.StatusCode)
	}
	var out struct {
		Count  int      `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Count != len(out.Tokens) {
		t.Fatalf("count %d for %d tokens", out.Count, len(out.Tokens))
	}
	return out.Tokens
}

// /tokenize answers the ids the generation endpoints prefill: after a chat
// request, a completions request with /tokenize's ids for the same messages
// finds all of its full blocks in the prefix cache, and the same holds for a
// text prompt.
func TestTokenizeMatchesWhatCompletionsPrefill(t *testing.T) {
	_, url := serve(t, Config{BlockSize: 4})
	for _, tc := range []struct {
		name, gen, tokenize string
	}{
		{"chat", `/v1/chat/completions", {"messages":[{"role":"system","content":"be brief and exact"},{"role":"user","content":[{"type":"text","text":"what is a KV cache, and why reuse it?"}]}],"max_tokens":1}`,
			`{"messages":[{"role":"system","content":"be brief and exact"},{"role":"user","content":[{"type":"text","text":"what is a KV cache, and why reuse it?"}]}]}`},
		{"prompt", `/v1/completions", {"prompt":"once upon a time there was a cache that remembered every prefix it saw","max_tokens":1}`,
			`{"prompt":"once upon a time there was a cache that remembered every prefix it saw"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, body, _ := strings.Cut(tc.gen, `", `)
			if r := post(t, url+path, body); r.StatusCode != http.StatusOK {
				t.Fatalf("%s: status %d", path, r.StatusCode)
			}
			ids := tokenizeIDs(t, url, tc.tokenize)
			b, _ := json.Marshal(map[string]any{"prompt": ids, "max_tokens": 1})
			m := decodeJSON(t, post(t, url+"/v1/completions", string(b)).Body)
			u := m["usage"].(map[string]any)
			cached := u["prompt_tokens_details"].(map[string]any)["cached_tokens"].(float64)
			if want := float64(len(ids) / 4 * 4); cached != want || u["prompt_tokens"].(float64) != float64(len(ids)) {
				t.Fatalf("usage %v for %d ids: want %v cached tokens", u, len(ids), want)
			}
		})
	}
}

// The mock's chat template is a concatenation of per-message ids delimited by
// special tokens, and add_generation_prompt appends one token: the property
// engines/tokenize verifies before reusing cached conversation prefixes.
func TestTokenizeChatIsConcatenativeAtMessageBorders(t *testing.T) {
	_, url := serve(t, Config{})
	msgs := []string{`{"role":"system","content":"you answer\n\n"}`, `{"role":"user","content":"  spaced out "}`,
		`{"role":"assistant","content":"sure.\n"}`, `{"role":"user","content":"next"}`}
	conv := func(ms []string, gen bool) []uint32 {
		return tokenizeIDs(t, url, `{"model":"mock-model","messages":[`+strings.Join(ms, ",")+`],"add_generation_prompt":`+strconv.FormatBool(gen)+`}`)
	}
	full := conv(msgs, false)
	for j := 1; j < len(msgs); j++ {
		joined := append(conv(msgs[:j], false), conv(msgs[j:], false)...)
		if !slices.Equal(joined, full) {
			t.Fatalf("split at %d: %v != %v", j, joined, full)
		}
	}
	if withGen := conv(msgs, true); len(withGen) != len(full)+1 || !slices.Equal(withGen[:len(full)], full) {
		t.Fatalf("add_generation_prompt: %v vs %v", withGen, full)
	}
	for _, bad := range []string{`{"messages":[]}`, `{"prompt":"a","messages":[{"role":"user","content":"a"}]}`, `{"model":"other","prompt":"a"}`} {
		if r := post(t, url+"/tokenize", bad); r.StatusCode/100 != 4 {
			t.Fatalf("%s: status %d, want 4xx", bad, r.StatusCode)
		}
	}
}

// GET /admin/pool lists each rank's cached blocks: what a request left behind,
// and nothing after a prefix cache reset.
func TestPoolDump(t *testing.T) {
	w, url := serve(t, Config{BlockSize: 4, DPSize: 2, DPStartRank: 3})
	if resp := post(t, url+"/v1/completions", `{"prompt":[1,2,3,4,5,6,7,8,9],"max_tokens":1}`, HeaderDPRank, "4"); resp.StatusCode != 200 {
		t.Fatalf("completion: %d", resp.StatusCode)
	}
	get := func() PoolDump {
		resp, err := http.Get(url + "/admin/pool")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var d PoolDump
		if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || resp.StatusCode != 200 {
			t.Fatalf("pool: %d %v", resp.StatusCode, err)
		}
		return d
	}
	d := get()
	if len(d.Ranks) != 2 || d.Ranks[0].DPRank != 3 || d.Ranks[1].DPRank != 4 || len(d.Ranks[0].Blocks) != 0 {
		t.Fatalf("pool %+v", d)
	}
	var want []uint64
	for _, b := range w.CachedBlocks(4) {
		want = append(want, b.Hash)
	}
	slices.Sort(want)
	if len(want) != 2 || !slices.Equal(d.Ranks[1].Blocks, want) {
		t.Fatalf("rank 4 blocks %v, want the two full prompt blocks %v", d.Ranks[1].Blocks, want)
	}
	if resp := post(t, url+"/reset_prefix_cache", ""); resp.StatusCode != 200 {
		t.Fatalf("reset: %d", resp.StatusCode)
	}
	if d := get(); len(d.Ranks[1].Blocks) != 0 {
		t.Fatalf("pool after reset %+v", d)
	}
}
