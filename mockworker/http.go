package mockworker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Headers that pin a request to a data-parallel rank. kvselect's ext_proc
// front sets HeaderWorkerID and HeaderDPRank on the request it routes;
// HeaderEngineDPRank is the one vLLM's own server honours.
const (
	HeaderWorkerID     = "x-kvselect-worker-id"
	HeaderDPRank       = "x-kvselect-dp-rank"
	HeaderEngineDPRank = "x-data-parallel-rank"
)

// DefaultMaxTokens is the output length when a request names none (the
// OpenAI completions default; the mock uses it for chat too, where vLLM would
// fill the context).
const DefaultMaxTokens = 16

// maxBody bounds a request body: a 32k-token prompt as a JSON array of ids is
// well under 1 MiB.
const maxBody = 16 << 20

// Handler serves the OpenAI-compatible API: POST /v1/completions and
// /v1/chat/completions (streaming or not), POST /tokenize, GET /v1/models,
// /health and /metrics, and POST /reset_prefix_cache; GET and POST
// /admin/faults read and switch the injected faults (faults.go); GET
// /admin/pool lists every rank's prefix cache.
func (w *Worker) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", w.sidecar(w.serveCompletions))
	mux.HandleFunc("POST /v1/chat/completions", w.sidecar(w.serveChat))
	mux.HandleFunc("GET /v1/models", w.serveModels)
	mux.HandleFunc("POST /tokenize", w.serveTokenize)
	mux.HandleFunc("GET /health", w.serveHealth)
	mux.HandleFunc("GET /admin/faults", w.serveFaults)
	mux.HandleFunc("POST /admin/faults", w.serveFaults)
	mux.HandleFunc("POST /reset_prefix_cache", w.serveReset)
	mux.HandleFunc("GET /admin/pool", w.servePool)
	mux.Handle("GET /metrics", promhttp.HandlerFor(w.metrics.reg, promhttp.HandlerOpts{}))
	return mux
}

// ---- errors ----

// apiError is an error with the HTTP status and OpenAI error type to answer.
type apiError struct {
	status int
	typ    string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, a ...any) *apiError {
	return &apiError{http.StatusBadRequest, "BadRequestError", fmt.Sprintf(format, a...)}
}

// toAPIError maps Generate's errors onto statuses.
func toAPIError(err error) *apiError {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, ErrInvalidRequest):
		return &apiError{http.StatusBadRequest, "BadRequestError", err.Error()}
	case errors.Is(err, ErrClosed):
		return &apiError{http.StatusServiceUnavailable, "ServiceUnavailableError", err.Error()}
	}
	return &apiError{http.StatusInternalServerError, "InternalServerError", err.Error()}
}

// errorBody is the OpenAI error envelope vLLM answers with.
func errorBody(e *apiError) map[string]any {
	return map[string]any{"error": map[string]any{"message": e.msg, "type": e.typ, "param": nil, "code": e.status}}
}

func writeJSON(rw http.ResponseWriter, status int, v any) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	_ = json.NewEncoder(rw).Encode(v)
}

func writeError(rw http.ResponseWriter, err error) {
	e := toAPIError(err)
	writeJSON(rw, e.status, errorBody(e))
}

// ---- request parsing ----

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// common holds the fields both endpoints share.
type common struct {
	Model               string         `json:"model"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	N                   *int           `json:"n"`
	// KVTransferParams are vLLM's KV connector parameters of a
	// disaggregated request (pd.go).
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

type completionRequest struct {
	common
	Prompt json.RawMessage `json:"prompt"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type chatRequest struct {
	common
	Messages []chatMessage `json:"messages"`
	// AddGenerationPrompt is vLLM's chat field: whether the template ends
	// with the assistant's opening (default true).
	AddGenerationPrompt *bool `json:"add_generation_prompt"`
}

func decodeBody(rw http.ResponseWriter, req *http.Request, v any) error {
	body := http.MaxBytesReader(rw, req.Body, maxBody)
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &apiError{http.StatusRequestEntityTooLarge, "BadRequestError", fmt.Sprintf("request body exceeds %d bytes", maxBody)}
		}
		return badRequest("invalid JSON body: %v", err)
	}
	if dec.More() {
		return badRequest("invalid JSON body: trailing data after the object")
	}
	return nil
}

// check validates the shared fields and returns the output length.
func (w *Worker) check(c *common) (int, error) {
	if c.Model != "" && c.Model != w.cfg.Model {
		return 0, &apiError{http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", c.Model)}
	}
	if c.N != nil && *c.N != 1 {
		return 0, badRequest("n must be 1: the mock worker generates one choice per prompt")
	}
	if c.StreamOptions != nil && !c.Stream {
		return 0, badRequest("stream_options is only allowed when stream is true")
	}
	n := DefaultMaxTokens
	switch {
	case c.MaxCompletionTokens != nil:
		n = *c.MaxCompletionTokens
	case c.MaxTokens != nil:
		n = *c.MaxTokens
	}
	if n < 1 {
		return 0, badRequest("max_tokens must be at least 1, got %d", n)
	}
	return n, nil
}

// parsePrompt reads the completions prompt: a string, an array of token ids,
// an array of strings or an array of token arrays.
func (w *Worker) parsePrompt(raw json.RawMessage) ([][]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return [][]uint32{Tokenize(s, w.cfg.VocabSize)}, nil
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err == nil {
		if len(ids) == 0 {
			return nil, badRequest("prompt is empty")
		}
		return [][]uint32{ids}, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil || len(list) == 0 {
		return nil, badRequest("prompt must be a string, an array of token ids, an array of strings or an array of token id arrays")
	}
	out := make([][]uint32, 0, len(list))
	for i, item := range list {
		if json.Unmarshal(item, &s) == nil {
			out = append(out, Tokenize(s, w.cfg.VocabSize))
			continue
		}
		ids = nil
		if err := json.Unmarshal(item, &ids); err != nil {
			return nil, badRequest("prompt[%d] must be a string or an array of non-negative 32-bit token ids", i)
		}
		out = append(out, ids)
	}
	return out, nil
}

// chatPrompt renders the messages with the mock's chat template and
// tokenizes the result: per message a role token, the content's tokens and an
// end-of-turn token, then, with addGenerationPrompt, the assistant role token
// that opens the reply. The role and end tokens are special tokens (ids below
// firstWordID that no text produces), as a real template's <|im_start|> and
// <|im_end|> are: the tokenizer never merges them with the text around them,
// so a conversation's ids are the concatenation of its messages' ids. That is
// the property kvselect's tokenize cache checks for before it reuses a cached
// conversation prefix (engines/tokenize).
func (w *Worker) chatPrompt(msgs []chatMessage, addGenerationPrompt bool) ([]uint32, error) {
	if len(msgs) == 0 {
		return nil, badRequest("messages must not be empty")
	}
	var out []uint32
	for i, m := range msgs {
		if m.Role == "" {
			return nil, badRequest("messages[%d].role is required", i)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return nil, badRequest("messages[%d].content: %v", i, err)
		}
		out = append(out, roleToken(m.Role))
		out = append(out, Tokenize(text, w.cfg.VocabSize)...)
		out = append(out, endOfTurnToken)
	}
	if addGenerationPrompt {
		out = append(out, roleToken("assistant"))
	}
	return out, nil
}

// messageText reads a message content: a string, null, or an array of parts
// of which the "text" ones count.
func messageText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or an array of content parts")
	}
	var b strings.Builder
	for i, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("part %d has type %q; the mock worker accepts text parts only", i, p.Type)
		}
		if p.Text == nil {
			return "", fmt.Errorf("part %d has no text", i)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// pinnedRank reads the rank headers. A worker id header naming another worker
// means the gateway fell back to this endpoint: its rank does not apply here.
func (w *Worker) pinnedRank(h http.Header) (*int, error) {
	if id := h.Get(HeaderWorkerID); id != "" {
		v, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			return nil, badRequest("%s: %q is not a worker id", HeaderWorkerID, id)
		}
		if v != w.cfg.WorkerID {
			return nil, nil
		}
	}
	for _, name := range []string{HeaderDPRank, HeaderEngineDPRank} {
		v := h.Get(name)
		if v == "" {
			continue
		}
		r, err := strconv.Atoi(v)
		if err != nil || r < 0 {
			return nil, badRequest("%s: %q is not a data-parallel rank", name, v)
		}
		if r < w.cfg.DPStartRank || r >= w.cfg.DPStartRank+w.cfg.DPSize {
			return nil, badRequest("%s: rank %d is not served here (ranks %d..%d)", name, r,
				w.cfg.DPStartRank, w.cfg.DPStartRank+w.cfg.DPSize-1)
		}
		return &r, nil
	}
	return nil, nil
}

// ---- responses ----

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details"`
}

func (u *usage) add(res Result) {
	u.PromptTokens += res.PromptTokens
	u.CompletionTokens += len(res.Output)
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if u.PromptTokensDetails == nil {
		u.PromptTokensDetails = &promptDetails{}
	}
	u.PromptTokensDetails.CachedTokens += res.CachedTokens
}

func detokenize(toks []uint32) string {
	var b strings.Builder
	for _, t := range toks {
		b.WriteString(tokenText(t))
	}
	return b.String()
}

// job is one prompt of a request, run by generate.
type job struct {
	index  int
	tokens []uint32
}

// generate runs the prompts of one request concurrently on rank and calls
// onToken (serialized) for every token; it returns the results by prompt
// index, or the first error.
func (w *Worker) generate(req *http.Request, c *common, jobs []job, maxTokens int, rank *int,
	onToken func(index, i int, tok uint32, last bool) error) ([]Result, error) {
	results := make([]Result, len(jobs))
	errs := make([]error, len(jobs))
	var mu sync.Mutex
	var wg sync.WaitGroup
	remotePrefill, remoteDecode := kvTransferParams(c.KVTransferParams)
	for k, j := range jobs {
		gr := Request{Tokens: j.tokens, MaxTokens: maxTokens, DPRank: rank, RemotePrefill: remotePrefill, RemoteDecode: remoteDecode}
		if onToken != nil {
			gr.OnToken = func(i int, tok uint32) error {
				mu.Lock()
				defer mu.Unlock()
				return onToken(j.index, i, tok, i+1 == maxTokens)
			}
		}
		wg.Go(func() { results[k], errs[k] = w.Generate(req.Context(), gr) })
	}
	wg.Wait()
	return results, errors.Join(errs...)
}

// sse writes server-sent events, flushing after each.
type sse struct {
	rw  http.ResponseWriter
	rc  *http.ResponseController
	err error
}

func newSSE(rw http.ResponseWriter) *sse {
	h := rw.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	rw.WriteHeader(http.StatusOK)
	return &sse{rw: rw, rc: http.NewResponseController(rw)}
}

func (s *sse) data(v any) error {
	if s.err != nil {
		return s.err
	}
	b, err := json.Marshal(v)
	if err != nil {
		s.err = err
		return err
	}
	if _, s.err = fmt.Fprintf(s.rw, "data: %s\n\n", b); s.err == nil {
		s.err = s.rc.Flush()
	}
	return s.err
}

func (s *sse) done() {
	if s.err == nil {
		_, s.err = fmt.Fprint(s.rw, "data: [DONE]\n\n")
		if s.err == nil {
			s.err = s.rc.Flush()
		}
	}
}

// streamError ends a stream that failed after its headers went out, as vLLM
// does: an error event, then [DONE].
func (s *sse) streamError(err error) {
	_ = s.data(errorBody(toAPIError(err)))
	s.done()
}

func (w *Worker) setRankHeaders(rw http.ResponseWriter, rank int) {
	rw.Header().Set(HeaderWorkerID, strconv.FormatUint(w.cfg.WorkerID, 10))
	rw.Header().Set(HeaderDPRank, strconv.Itoa(rank))
}

// resolveRank fixes the rank a request runs on before any byte is written, so
// the response headers can name it: the pinned rank, or the least loaded.
func (w *Worker) resolveRank(h http.Header) (int, error) {
	pinned, err := w.pinnedRank(h)
	if err != nil {
		return 0, err
	}
	if pinned != nil {
		return *pinned, nil
	}
	r, err := w.pick(nil)
	if err != nil {
		return 0, err
	}
	return r.global, nil
}

func newID(prefix string) string {
	return fmt.Sprintf("%s-%016x%016x", prefix, rand.Uint64(), rand.Uint64())
}

// ---- handlers ----

func (w *Worker) serveCompletions(rw http.ResponseWriter, req *http.Request) {
	if w.injectFault(rw, req) {
		return
	}
	var body completionRequest
	if err := decodeBody(rw, req, &body); err != nil {
		writeError(rw, err)
		return
	}
	maxTokens, err := w.check(&body.common)
	if err != nil {
		writeError(rw, err)
		return
	}
	prompts, err := w.parsePrompt(body.Prompt)
	if err != nil {
		writeError(rw, err)
		return
	}
	rank, err := w.resolveRank(req.Header)
	if err != nil {
		writeError(rw, err)
		return
	}
	jobs := make([]job, len(prompts))
	for i, p := range prompts {
		jobs[i] = job{index: i, tokens: p}
		// Reject what can never run before streaming starts.
		if err := w.Validate(Request{Tokens: p, MaxTokens: maxTokens, DPRank: &rank}); err != nil {
			writeError(rw, fmt.Errorf("prompt %d: %w", i, err))
			return
		}
	}
	id, created, model := newID("cmpl"), time.Now().Unix(), w.cfg.Model
	w.setRankHeaders(rw, rank)
	choice := func(index int, text string, finish any) map[string]any {
		return map[string]any{"index": index, "text": text, "logprobs": nil, "finish_reason": finish, "stop_reason": nil}
	}
	if !body.Stream {
		results, err := w.generate(req, &body.common, jobs, maxTokens, &rank, nil)
		if err != nil {
			writeError(rw, err)
			return
		}
		var u usage
		choices := make([]map[string]any, len(results))
		for i, res := range results {
			u.add(res)
			c := choice(i, detokenize(res.Output), res.FinishReason)
			c["prompt_logprobs"] = nil
			choices[i] = c
		}
		answer := map[string]any{"id": id, "object": "text_completion", "created": created,
			"model": model, "choices": choices, "usage": u}
		if _, remoteDecode := kvTransferParams(body.KVTransferParams); remoteDecode {
			answer["kv_transfer_params"] = w.transferParams(req, results[0])
		}
		writeJSON(rw, http.StatusOK, answer)
		return
	}
	s := newSSE(rw)
	results, err := w.generate(req, &body.common, jobs, maxTokens, &rank, func(index, _ int, tok uint32, last bool) error {
		var finish any
		if last {
			finish = "length"
		}
		return s.data(map[string]any{"id": id, "object": "text_completion", "created": created, "model": model,
			"choices": []any{choice(index, tokenText(tok), finish)}})
	})
	if err != nil {
		s.streamError(err)
		return
	}
	if body.StreamOptions != nil && body.StreamOptions.IncludeUsage {
		var u usage
		for _, res := range results {
			u.add(res)
		}
		_ = s.data(map[string]any{"id": id, "object": "text_completion", "created": created, "model": model,
			"choices": []any{}, "usage": u})
	}
	s.done()
}

func (w *Worker) serveChat(rw http.ResponseWriter, req *http.Request) {
	if w.injectFault(rw, req) {
		return
	}
	var body chatRequest
	if err := decodeBody(rw, req, &body); err != nil {
		writeError(rw, err)
		return
	}
	maxTokens, err := w.check(&body.common)
	if err != nil {
		writeError(rw, err)
		return
	}
	prompt, err := w.chatPrompt(body.Messages, body.AddGenerationPrompt == nil || *body.AddGenerationPrompt)
	if err != nil {
		writeError(rw, err)
		return
	}
	rank, err := w.resolveRank(req.Header)
	if err != nil {
		writeError(rw, err)
		return
	}
	if err := w.Validate(Request{Tokens: prompt, MaxTokens: maxTokens, DPRank: &rank}); err != nil {
		writeError(rw, err)
		return
	}
	jobs := []job{{index: 0, tokens: prompt}}
	id, created, model := newID("chatcmpl"), time.Now().Unix(), w.cfg.Model
	w.setRankHeaders(rw, rank)
	if !body.Stream {
		results, err := w.generate(req, &body.common, jobs, maxTokens, &rank, nil)
		if err != nil {
			writeError(rw, err)
			return
		}
		var u usage
		u.add(results[0])
		answer := map[string]any{"id": id, "object": "chat.completion", "created": created,
			"model": model, "usage": u, "choices": []any{map[string]any{
				"index": 0, "logprobs": nil, "finish_reason": results[0].FinishReason, "stop_reason": nil,
				"message": map[string]any{"role": "assistant", "content": detokenize(results[0].Output)},
			}}}
		if _, remoteDecode := kvTransferParams(body.KVTransferParams); remoteDecode {
			answer["kv_transfer_params"] = w.transferParams(req, results[0])
		}
		writeJSON(rw, http.StatusOK, answer)
		return
	}
	s := newSSE(rw)
	chunk := func(delta map[string]any, finish any) map[string]any {
		return map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}}}
	}
	// The first chunk carries the role, as OpenAI's and vLLM's do.
	if err := s.data(chunk(map[string]any{"role": "assistant", "content": ""}, nil)); err != nil {
		return
	}
	results, err := w.generate(req, &body.common, jobs, maxTokens, &rank, func(_, _ int, tok uint32, last bool) error {
		var finish any
		if last {
			finish = "length"
		}
		return s.data(chunk(map[string]any{"content": tokenText(tok)}, finish))
	})
	if err != nil {
		s.streamError(err)
		return
	}
	if body.StreamOptions != nil && body.StreamOptions.IncludeUsage {
		var u usage
		u.add(results[0])
		_ = s.data(map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
			"choices": []any{}, "usage": u})
	}
	s.done()
}

func (w *Worker) serveModels(rw http.ResponseWriter, _ *http.Request) {
	writeJSON(rw, http.StatusOK, map[string]any{"object": "list", "data": []any{map[string]any{
		"id": w.cfg.Model, "object": "model", "created": time.Now().Unix(), "owned_by": "kvselect-mockworker",
		"root": w.cfg.Model, "parent": nil, "max_model_len": w.cfg.MaxModelLen,
	}}})
}

func (w *Worker) serveReset(rw http.ResponseWriter, _ *http.Request) {
	if err := w.ResetPrefixCache(); err != nil {
		writeError(rw, &apiError{http.StatusConflict, "ConflictError", err.Error()})
		return
	}
	rw.WriteHeader(http.StatusOK)
}

// PoolDump is GET /admin/pool's answer: the engine block hashes in every
// rank's prefix cache, the ground truth the rank's KV events describe (a
// test or soak run compares it with an endpoint picker's index). Not a vLLM
// endpoint.
type PoolDump struct {
	Ranks []RankPool `json:"ranks"`
}

// RankPool is one data-parallel rank's prefix cache, hashes in ascending order.
type RankPool struct {
	DPRank int      `json:"dp_rank"`
	Blocks []uint64 `json:"blocks"`
}

func (w *Worker) servePool(rw http.ResponseWriter, _ *http.Request) {
	d := PoolDump{Ranks: make([]RankPool, 0, len(w.ranks))}
	for i := range w.ranks {
		rank := w.cfg.DPStartRank + i
		blocks := w.CachedBlocks(rank)
		hs := make([]uint64, len(blocks))
		for j, b := range blocks {
			hs[j] = b.Hash
		}
		slices.Sort(hs)
		d.Ranks = append(d.Ranks, RankPool{DPRank: rank, Blocks: hs})
	}
	writeJSON(rw, http.StatusOK, d)
}

// tokenizeRequest is vLLM's POST /tokenize body: a completions prompt, or
// chat messages rendered with the chat template as a chat request would be.
type tokenizeRequest struct {
	Model               string        `json:"model"`
	Prompt              *string       `json:"prompt"`
	Messages            []chatMessage `json:"messages"`
	AddGenerationPrompt *bool         `json:"add_generation_prompt"`
}

// serveTokenize answers vLLM's /tokenize
// (vllm/entrypoints/openai/serving_tokenization.py): {"count", "max_model_len",
// "tokens"}, the ids the completions or chat endpoint prefills for the same
// prompt or messages. Other fields (add_special_tokens, chat_template, ...)
// are accepted and change nothing: the mock has no BOS token and one template.
func (w *Worker) serveTokenize(rw http.ResponseWriter, req *http.Request) {
	var body tokenizeRequest
	if err := decodeBody(rw, req, &body); err != nil {
		writeError(rw, err)
		return
	}
	if body.Model != "" && body.Model != w.cfg.Model {
		writeError(rw, &apiError{http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", body.Model)})
		return
	}
	var tokens []uint32
	switch {
	case body.Prompt != nil && body.Messages != nil:
		writeError(rw, badRequest("give prompt or messages, not both"))
		return
	case body.Prompt != nil:
		tokens = Tokenize(*body.Prompt, w.cfg.VocabSize)
	default:
		var err error
		if tokens, err = w.chatPrompt(body.Messages, body.AddGenerationPrompt == nil || *body.AddGenerationPrompt); err != nil {
			writeError(rw, err)
			return
		}
	}
	if tokens == nil {
		tokens = []uint32{}
	}
	writeJSON(rw, http.StatusOK, map[string]any{"count": len(tokens), "max_model_len": w.cfg.MaxModelLen, "tokens": tokens})
}
