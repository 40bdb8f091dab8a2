package httpadmin

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvselect/kvselect/engines/tokenize"
	"github.com/kvselect/kvselect/selection/catalog"
)

// Text fields on /select: ignored without a tokenizer (the body still needs
// ids or hashes, as in Dynamo); with one, a text body is routed — here the
// engine fails, so on the text index — and a text field of the wrong shape
// is a 422.
func TestSelectTextNeedsATokenizer(t *testing.T) {
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) }))
	t.Cleanup(dead.Close)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	tk, err := tokenize.New(ctx, tokenize.Config{Mode: tokenize.ModeEndpoint, Endpoints: map[string]string{"m": dead.URL}, Timeout: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		opts   Options
		body   string
		status int
	}{
		{"prompt without tokenizer", Options{}, `{"model_name":"m","prompt":"hello there"}`, http.StatusBadRequest},
		{"messages without tokenizer", Options{}, `{"model_name":"m","messages":[{"role":"user","content":"hi"}]}`, http.StatusBadRequest},
		{"prompt with tokenizer", Options{Tokenizer: tk}, `{"model_name":"m","prompt":"hello there"}`, http.StatusOK},
		{"messages with tokenizer", Options{Tokenizer: tk}, `{"model_name":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"add_generation_prompt":true}`, http.StatusOK},
		{"ids win over text", Options{Tokenizer: tk}, `{"model_name":"m","token_ids":[1,2,3],"prompt":"ignored"}`, http.StatusOK},
		{"prompt of the wrong shape", Options{Tokenizer: tk}, `{"model_name":"m","prompt":[1,2]}`, http.StatusUnprocessableEntity},
		{"content of the wrong shape", Options{Tokenizer: tk}, `{"model_name":"m","messages":[{"role":"user","content":5}]}`, http.StatusUnprocessableEntity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAPI(t, nil, tc.opts)
			if _, err := a.svc.UpsertWorker(context.Background(), catalog.Record{WorkerID: 1, ModelName: "m",
				Endpoint: new("http://10.0.0.1:8000"), BlockSize: new(uint32(4))}); err != nil {
				t.Fatal(err)
			}
			for _, path := range []string{"/select", "/select_and_reserve"} {
				if r := a.do("POST", path, tc.body); r.status != tc.status {
					t.Fatalf("%s: %d %s, want %d", path, r.status, r.raw, tc.status)
				}
			}
		})
	}
}
