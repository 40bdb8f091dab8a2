package extproc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/engines/tokenize"
	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/httpadmin"
	"github.com/kvselect/kvselect/mockworker"
	"github.com/kvselect/kvselect/selection"
)

// engineURL serves a real mock worker for the test's model: its /tokenize
// is the engine the picker asks.
func engineURL(t *testing.T) string {
	t.Helper()
	w, err := mockworker.New(mockworker.Config{Model: model, WorkerID: 99})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(w.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

func realTokenizer(t *testing.T, url string, timeout time.Duration) *tokenize.Tokenizer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	tk, err := tokenize.New(ctx, tokenize.Config{Mode: tokenize.ModeEndpoint, Endpoints: map[string]string{model: url}, Timeout: timeout}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// idsOf asks the engine directly.
func idsOf(t *testing.T, url, body string) []uint32 {
	t.Helper()
	resp, err := http.Post(url+"/tokenize", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	ids, err := tokenize.ParseResponse(raw, 1<<20)
	if err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	return ids
}

// A chat or completions text routes on the engine's ids exactly as the same
// ids sent by the client would: a prompt whose ids are cached on worker k
// goes to k, in both body forms. Without the tokenizer the text index,
// which never saw these prompts, has no reason to pick k four times out of
// four.
func TestTextRoutesOnTheEnginesIDs(t *testing.T) {
	h := start(t, setup{})
	url := engineURL(t)
	h.srv.SetTokenizer(realTokenizer(t, url, 5*time.Second), false)
	for k := 1; k <= 4; k++ {
		text := fmt.Sprintf("conversation %d: %s", k, strings.Repeat("about caches and routing ", 20))
		forms := map[string]struct{ body, tokenize string }{
			"chat": {fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, text),
				fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, text)},
			"completions": {fmt.Sprintf(`{"model":%q,"prompt":%q}`, model, text), fmt.Sprintf(`{"model":%q,"prompt":%q}`, model, text)},
		}
		for name, f := range forms {
			ids := idsOf(t, url, f.tokenize)
			id := fmt.Sprintf("seed-%d-%s", k, name)
			if _, err := h.svc.Reserve(context.Background(), &selection.ReservationRequest{PartitionKey: selection.PartitionKey{ModelName: model},
				SelectionID: &id, WorkerID: ptr(uint64(k)), PromptRequest: selection.PromptRequest{TokenIDs: ids}}); err != nil {
				t.Fatal(err)
			}
			if err := h.svc.Free(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: []byte(f.body)})
			if d.Immediate != nil {
				t.Fatalf("immediate %d %s", d.Immediate.Status, d.Immediate.Body)
			}
			if got := workerIDOf(d); got != strconv.Itoa(k) {
				t.Fatalf("%s prompt %d went to worker %s, want %d where its ids are cached", name, k, got, k)
			}
			if string(d.Body) != f.body {
				t.Fatalf("body changed without --tokenize-forward-ids: %s", d.Body)
			}
			x.Close()
			h.idle(t)
		}
	}
}

// When tokenizing fails the request is routed on the text, never refused;
// and a prompt that was once tokenized taught the text index where it went,
// so the fallback still finds that worker.
func TestTokenizeFailureRoutesOnTheTextIndexItTaught(t *testing.T) {
	h := start(t, setup{})
	url := engineURL(t)
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":"question"}]}`,
		model, strings.Repeat("a long shared system prompt. ", 40))
	h.srv.SetTokenizer(realTokenizer(t, url, 5*time.Second), false)
	x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: []byte(body)})
	if d.Immediate != nil {
		t.Fatalf("immediate %d", d.Immediate.Status)
	}
	first := workerIDOf(d)
	x.Close()
	h.idle(t)

	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(dead.Close)
	broken := realTokenizer(t, dead.URL, 5*time.Second)
	h.srv.SetTokenizer(broken, false)
	for i := range 4 {
		x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: []byte(body)})
		if d.Immediate != nil {
			t.Fatalf("a tokenize failure refused the request: %d %s", d.Immediate.Status, d.Immediate.Body)
		}
		if got := workerIDOf(d); got != first {
			t.Fatalf("fallback %d went to worker %s; the text index learned worker %s", i, got, first)
		}
		x.Close()
		h.idle(t)
	}
	if st := broken.Stats(); st.Fallbacks[tokenize.ReasonStatus] != 4 {
		t.Fatalf("fallbacks %+v, want 4 counted as status", st.Fallbacks)
	}
}

// With forwardIDs a completions prompt string reaches the engine as its ids
// (every other field kept); chat bodies and prompt batches are forwarded as
// they came, since their ids cannot stand in for them.
func TestForwardIDsRewritesOnlyASingleCompletionsPrompt(t *testing.T) {
	h := start(t, setup{})
	url := engineURL(t)
	h.srv.SetTokenizer(realTokenizer(t, url, 5*time.Second), true)
	prompt := "rewrite me into ids please"
	ids := idsOf(t, url, fmt.Sprintf(`{"prompt":%q}`, prompt))
	for _, tc := range []struct {
		name, body string
		rewritten  bool
	}{
		{"completions", fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":3,"stream":true}`, model, prompt), true},
		{"batch", fmt.Sprintf(`{"model":%q,"prompt":[%q,"b"]}`, model, prompt), false},
		{"chat", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, prompt), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: []byte(tc.body)})
			defer func() { x.Close(); h.idle(t) }()
			if !tc.rewritten {
				if string(d.Body) != tc.body {
					t.Fatalf("forwarded %s", d.Body)
				}
				return
			}
			var got struct {
				Model     string   `json:"model"`
				Prompt    []uint32 `json:"prompt"`
				MaxTokens int      `json:"max_tokens"`
				Stream    bool     `json:"stream"`
			}
			if err := json.Unmarshal(d.Body, &got); err != nil {
				t.Fatalf("%s: %v", d.Body, err)
			}
			if got.Model != model || got.MaxTokens != 3 || !got.Stream || fmt.Sprint(got.Prompt) != fmt.Sprint(ids) {
				t.Fatalf("forwarded %s, want the prompt as %v and the other fields kept", d.Body, ids)
			}
			if d.SetHeaders["content-length"] != strconv.Itoa(len(d.Body)) {
				t.Fatalf("content-length %s for %d bytes", d.SetHeaders["content-length"], len(d.Body))
			}
		})
	}
}

// REST /select_and_reserve takes the same text path when a tokenizer is
// configured: a chat body without ids routes on the engine's ids; when
// tokenizing fails, REST and the picker flatten chat text the same way, so
// a prompt one front routed on text is found by the other.
func TestRESTTextTakesThePickersPath(t *testing.T) {
	h := start(t, setup{})
	url := engineURL(t)
	good := realTokenizer(t, url, 5*time.Second)
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) }))
	t.Cleanup(dead.Close)
	broken := realTokenizer(t, dead.URL, 5*time.Second)
	rest := func(tk *tokenize.Tokenizer, body string) map[string]any {
		t.Helper()
		srv := httptest.NewServer(httpadmin.New(h.svc, httpadmin.Options{Tokenizer: tk}))
		defer srv.Close()
		resp, err := http.Post(srv.URL+"/select_and_reserve", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d %v %v", resp.StatusCode, out, err)
		}
		if err := h.svc.Free(context.Background(), out["selection_id"].(string)); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for k := 1; k <= 4; k++ {
		msgs := fmt.Sprintf(`[{"role":"system","content":%q},{"role":"user","content":[{"type":"text","text":"hello"}]}]`,
			strings.Repeat(fmt.Sprint("prompt ", k, " shared across both fronts. "), 40))
		ids := idsOf(t, url, `{"messages":`+msgs+`}`)
		id := fmt.Sprint("seed-", k)
		if _, err := h.svc.Reserve(context.Background(), &selection.ReservationRequest{PartitionKey: selection.PartitionKey{ModelName: model},
			SelectionID: &id, WorkerID: ptr(uint64(k)), PromptRequest: selection.PromptRequest{TokenIDs: ids}}); err != nil {
			t.Fatal(err)
		}
		_ = h.svc.Free(context.Background(), id)
		out := rest(good, fmt.Sprintf(`{"model_name":%q,"messages":%s}`, model, msgs))
		if w := int(out["worker_id"].(float64)); w != k || out["isl_tokens"].(float64) != float64(len(ids)) {
			t.Fatalf("REST text went to worker %d with isl %v; want worker %d and the engine's %d ids", w, out["isl_tokens"], k, len(ids))
		}
	}
	// Fallback: a text REST taught is found by the picker, on text alone.
	other := fmt.Sprintf(`[{"role":"user","content":%q}]`, strings.Repeat("only ever routed as text. ", 40))
	first := rest(broken, fmt.Sprintf(`{"model_name":%q,"messages":%s}`, model, other))
	h.srv.SetTokenizer(broken, false)
	x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: fmt.Appendf(nil, `{"model":%q,"messages":%s}`, model, other)})
	if got := workerIDOf(d); got != strconv.Itoa(int(first["worker_id"].(float64))) {
		t.Fatalf("picker chose worker %s for the text REST routed to %v", got, first["worker_id"])
	}
	x.Close()
	h.idle(t)
}
