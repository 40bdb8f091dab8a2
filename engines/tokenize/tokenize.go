// Package tokenize obtains, for a prompt known only as text, the token ids
// the engine will prefill for it, by asking an engine: vLLM's and SGLang's
// POST /tokenize, or vLLM's render service (`vllm launch render`) for a whole
// pool. kvselect itself never tokenizes: the engine applies its own tokenizer
// and, for chat, its own chat template with the request's template fields,
// so the ids are the engine's (vLLM's /tokenize API:
// vllm/entrypoints/openai/serving_tokenization.py).
//
// Where the ids come from (Config.Mode): a configured endpoint per model
// (Config.Endpoints, a render service), else in ModePool the least-loaded
// schedulable worker of the request's partition. A Tokenize call has a
// budget (Config.Timeout); on timeout, error, a bad answer or no engine it
// fails, counted by reason, and the front routes the text on the approximate
// text index instead. An engine call that outlives the budget still finishes
// in the background (within BackgroundTimeout) and fills the cache.
//
// # The cache, and why its hits are the engine's ids
//
// Tokenization is not prefix-stable at arbitrary byte borders (a BPE merge
// can span them) and chat templates wrap every turn, so a cache must never
// build ids the engine would not produce. Two kinds of hit:
//
//   - Whole request: the ids of an earlier request with the same model,
//     the same /tokenize fields (verbatim) and the same prompt or messages
//     (verbatim), keyed by xxh3-128 of all of them. This is the engine's own
//     answer for identical input; tokenizers are deterministic.
//
//   - Conversation prefix (chat only): a request whose first j messages are
//     those of an earlier conversation reuses that conversation's ids and
//     asks the engine only for messages j.. (with the request's own fields),
//     dropping the tail's template head (BOS and the like). This is right
//     only if the template renders a conversation as its messages' renderings
//     one after the other, a fixed head before the first, and a fixed
//     generation prompt after the last, and if the tokenizer never merges
//     tokens across a message border. Real templates delimit turns with
//     special tokens (<|im_start|>, <|start_header_id|>, <|eot_id|>) that
//     tokenizers split out before any merge, which gives exactly that; but
//     some do not (templates that render a message differently when it is
//     the last one, that insert a default system prompt, or that end turns
//     with plain newlines a following text could merge with). So the
//     property is checked per template, by asking the engine once (probe):
//     conversations of every role, with contents chosen to provoke merges at
//     the borders (trailing and leading whitespace, newlines, punctuation,
//     digits, CJK), are tokenized whole and split at every border, with and
//     without the generation prompt; the template is reused only if every
//     split equals the whole and head and generation prompt are the same in
//     every case. A template is the model plus every /tokenize field except
//     add_generation_prompt (chat_template, chat_template_kwargs, tools, ...
//     verbatim). Until the probe has passed, and forever if it fails, only
//     whole-request hits are served. A composed answer whose tail does not
//     start with the probed head marks the template unusable at once.
//
//     What this does not prove: a border merge that none of the probe's
//     contents provokes. The probe's contents cover the characters BPE
//     pre-tokenizers treat specially at a border; a template whose borders
//     are special tokens cannot merge at all. docs/extproc.md has the
//     argument with the measured check on randomised conversations.
//
// Prefix entries are stored without the generation prompt (the probe
// measured it), so a conversation's next turn, which adds an assistant reply
// and a user message, finds the previous turn's messages.
package tokenize

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvselect/kvselect/selection"
)

// Mode says where ids come from.
type Mode string

// Modes.
const (
	// ModeOff never tokenizes: text routes on the approximate text index.
	ModeOff Mode = "off"
	// ModePool asks the least-loaded schedulable worker of the partition, or
	// the model's configured endpoint when it has one.
	ModePool Mode = "pool"
	// ModeEndpoint asks only the configured endpoints; a model without one
	// is not tokenized.
	ModeEndpoint Mode = "endpoint"
)

// ParseMode reads a Mode by name.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case ModeOff, ModePool, ModeEndpoint:
		return m, nil
	}
	return "", fmt.Errorf("tokenize mode %q: want off, pool or endpoint", s)
}

// Defaults.
const (
	DefaultTimeout = 20 * time.Millisecond
	// DefaultMaxTimeout is the adaptive budget's default cap
	// (Config.MaxTimeout): ten times DefaultTimeout, far below a long
	// prompt's prefill on a busy engine.
	DefaultMaxTimeout = 200 * time.Millisecond
	// DefaultCacheTokens bounds the cache: 4 Mi ids, 16 MiB.
	DefaultCacheTokens = 4 << 20
	// DefaultMaxResponseBytes and DefaultMaxTokens bound an engine's answer:
	// 1 Mi ids is beyond any context window, and 16 MiB beyond its JSON.
	DefaultMaxResponseBytes = 16 << 20
	DefaultMaxTokens        = 1 << 20
	// BackgroundTimeout bounds, by default, an engine call that outlived
	// its request's budget and continues to fill the cache.
	BackgroundTimeout = 2 * time.Second
	// probeTimeout bounds each call of a template probe.
	probeTimeout = 5 * time.Second
	// maxTemplates bounds the templates whose probe result is kept; beyond
	// it new templates get whole-request hits only.
	maxTemplates = 1024
)

// Config configures a Tokenizer.
type Config struct {
	Mode Mode
	// Endpoints maps a model name to a base URL whose POST /tokenize serves
	// it (a render service); it wins over the pool for that model.
	Endpoints map[string]string
	// Timeout is a Tokenize call's budget (DefaultTimeout when 0): the
	// whole budget, or with MaxTimeout the least of it.
	Timeout time.Duration
	// MaxTimeout, when above Timeout, makes the budget adaptive: a prompt
	// waits for its ids up to the prefill time routing on them is predicted
	// to save (the pool's PrefillEstimate of the whole prompt: exact ids can
	// at best save its prefill, where the text index misses), never less
	// than Timeout and never more than MaxTimeout. A long prompt on a busy
	// machine then keeps its exactness; a short one does not wait longer
	// than it could gain.
	MaxTimeout time.Duration
	// BackgroundTimeout bounds an engine call that outlived its request's
	// budget and goes on to fill the cache (BackgroundTimeout when 0).
	BackgroundTimeout time.Duration
	// CacheTokens bounds the cache in ids (DefaultCacheTokens when 0;
	// negative disables the cache).
	CacheTokens int
	// MaxResponseBytes and MaxTokens bound an answer (defaults when 0).
	MaxResponseBytes int64
	MaxTokens        int
	// Client makes the calls; nil means a dedicated keep-alive client.
	Client *http.Client
	Logger *slog.Logger
}

// Pool is what ModePool reads of the selection service: the schedulable
// ranks of a partition and their active load, and the adaptive budget's
// estimate of a prompt's prefill time (PrefillEstimate: the latency model's
// fitted time of tokens prompt tokens prefilled on model's engines).
// (*selection.Service).Inspect() has all three.
type Pool interface {
	Endpoints(key selection.PartitionKey) []selection.RankEndpoint
	Loads(model, group *string) []selection.ModelLoad
	PrefillEstimate(model string, tokens int) time.Duration
}

// Tokenizer implements selection.Tokenizer.
type Tokenizer struct {
	cfg   Config
	pool  Pool
	http  *http.Client
	log   *slog.Logger
	ctx   context.Context // background calls and probes end with it
	cache *cache
	m     *metrics

	mu        sync.Mutex
	inflight  map[key]*call
	templates map[key]*template
	rr        uint64 // rotates ties between equally loaded workers
}

var _ selection.Tokenizer = (*Tokenizer)(nil)

// New returns a Tokenizer; ctx bounds its background engine calls and
// template probes. pool may be nil in ModeEndpoint.
func New(ctx context.Context, cfg Config, pool Pool) (*Tokenizer, error) {
	if cfg.Mode == ModeOff || cfg.Mode == "" {
		return nil, errors.New("tokenize: mode off needs no tokenizer")
	}
	if cfg.Mode == ModePool && pool == nil {
		return nil, errors.New("tokenize: pool mode needs the selection service")
	}
	if cfg.Mode == ModeEndpoint && len(cfg.Endpoints) == 0 {
		return nil, errors.New("tokenize: endpoint mode needs at least one endpoint")
	}
	for model, u := range cfg.Endpoints {
		if err := ValidateEndpoint(u); err != nil {
			return nil, fmt.Errorf("tokenize endpoint for %s: %w", model, err)
		}
	}
	if cfg.BackgroundTimeout <= 0 {
		cfg.BackgroundTimeout = BackgroundTimeout
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.CacheTokens == 0 {
		cfg.CacheTokens = DefaultCacheTokens
	}
	if cfg.MaxResponseBytes <= 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = DefaultMaxTokens
	}
	t := &Tokenizer{cfg: cfg, pool: pool, http: cfg.Client, log: cfg.Logger, ctx: ctx,
		cache: newCache(max(cfg.CacheTokens, 0)), m: newMetrics(),
		inflight: map[key]*call{}, templates: map[key]*template{}}
	if t.http == nil {
		t.http = &http.Client{Transport: &http.Transport{
			Proxy:               nil, // engines are in-cluster; never an environment proxy
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			ForceAttemptHTTP2:   false,
		}}
	}
	if t.log == nil {
		t.log = slog.Default()
	}
	return t, nil
}

// FallbackError is a Tokenize failure with the reason it is counted under.
type FallbackError struct {
	Reason string
	Err    error
}

func (e *FallbackError) Error() string { return "tokenize (" + e.Reason + "): " + e.Err.Error() }
func (e *FallbackError) Unwrap() error { return e.Err }

// Fallback reasons (kvselect_tokenize_fallbacks_total).
const (
	ReasonTimeout     = "timeout"      // the budget ran out
	ReasonUnavailable = "unavailable"  // connection refused, reset, DNS...
	ReasonStatus      = "status"       // the engine answered non-2xx
	ReasonBadResponse = "bad_response" // not a usable token list
	ReasonTooLarge    = "too_large"    // over the byte or token cap
	ReasonNoWorker    = "no_worker"    // pool mode: no schedulable worker with an endpoint
	ReasonNoEndpoint  = "no_endpoint"  // endpoint mode: no endpoint for the model
	ReasonCanceled    = "canceled"     // the request went away first
)

var reasons = []string{ReasonTimeout, ReasonUnavailable, ReasonStatus, ReasonBadResponse, ReasonTooLarge,
	ReasonNoWorker, ReasonNoEndpoint, ReasonCanceled}

// Tokenize returns the engine's ids for req within the budget. The returned
// slice may be shared with the cache: callers must not modify it.
func (t *Tokenizer) Tokenize(ctx context.Context, req *selection.TokenizeRequest) ([]uint32, error) {
	start := time.Now()
	ids, result, err := t.tokenize(ctx, req)
	t.m.observe(start, result, err)
	return ids, err
}

func (t *Tokenizer) tokenize(ctx context.Context, req *selection.TokenizeRequest) ([]uint32, string, error) {
	rk := keysOf(req)
	if ids, ok := t.cache.get(rk.full); ok {
		return ids, resultCache, nil
	}
	ctx, cancel := context.WithTimeout(ctx, t.budget(req))
	defer cancel()
	var tpl *template
	if rk.chat && t.cache.max > 0 { // without a cache there is nothing to compose
		tpl = t.template(req, rk)
	}
	if head, gen, ok := tpl.usable(); ok && len(rk.prefixes) > 1 {
		if j, prefix := t.cache.longest(rk.prefixes[:len(rk.prefixes)-1]); j >= 0 {
			tail := &selection.TokenizeRequest{PartitionKey: req.PartitionKey, Messages: req.Messages[j+1:], Options: req.Options}
			tailIDs, err := t.await(ctx, t.start(keysOf(tail), tail))
			if err != nil {
				return nil, resultFallback, err
			}
			if len(tailIDs) >= len(head) && equal(tailIDs[:len(head)], head) {
				ids := make([]uint32, 0, len(prefix)+len(tailIDs)-len(head))
				ids = append(append(ids, prefix...), tailIDs[len(head):]...)
				t.store(rk, ids, gen, true)
				return ids, resultPrefix, nil
			}
			// The template is not what the probe saw: never compose again.
			tpl.fail("a tail did not start with the probed head")
			t.m.prefixMismatch.Add(1)
		}
	}
	ids, err := t.await(ctx, t.start(rk, req))
	if err != nil {
		return nil, resultFallback, err
	}
	return ids, resultEngine, nil
}

// bytesPerToken estimates a prompt's tokens from its bytes for the
// adaptive budget: about four bytes a token for English text with the
// tokenizers of today's models.
const bytesPerToken = 4

// budget is req's tokenization budget: Config.Timeout, or the adaptive one
// (Config.MaxTimeout).
func (t *Tokenizer) budget(req *selection.TokenizeRequest) time.Duration {
	if t.cfg.MaxTimeout <= t.cfg.Timeout || t.pool == nil {
		return t.cfg.Timeout
	}
	n := len(req.Prompt)
	for _, m := range req.Messages {
		n += len(m)
	}
	b := min(max(t.pool.PrefillEstimate(req.ModelName, n/bytesPerToken), t.cfg.Timeout), t.cfg.MaxTimeout)
	t.m.budget.Observe(b.Seconds())
	return b
}

// store caches a chat answer: whole, and as the conversation prefix of its
// messages (without the generation prompt) when its template is usable.
func (t *Tokenizer) store(rk reqKeys, ids []uint32, gen []uint32, usable bool) {
	t.cache.put(rk.full, ids)
	if !rk.chat || !usable || rk.cont || len(rk.prefixes) == 0 {
		return
	}
	prefix := ids
	if rk.gen {
		if len(ids) < len(gen) || !equal(ids[len(ids)-len(gen):], gen) {
			return
		}
		prefix = ids[:len(ids)-len(gen)]
	}
	t.cache.put(rk.prefixes[len(rk.prefixes)-1], prefix)
}

// call is one engine call, shared by every request that needs the same
// answer while it runs.
type call struct {
	done chan struct{}
	ids  []uint32
	err  error
}

// start returns the running call for k, or starts one. The call runs under
// the Tokenizer's context with Config.BackgroundTimeout, not the request's budget,
// so that an answer arriving late still fills the cache.
func (t *Tokenizer) start(rk reqKeys, req *selection.TokenizeRequest) *call {
	k := rk.full
	t.mu.Lock()
	if c, ok := t.inflight[k]; ok {
		t.mu.Unlock()
		return c
	}
	if ids, ok := t.cache.get(k); ok {
		// The call for k ended between the caller's cache miss and here:
		// it stores its answer before it leaves inflight, so the answer
		// is here and a second engine call would only repeat it.
		t.mu.Unlock()
		c := &call{done: make(chan struct{}), ids: ids}
		close(c.done)
		return c
	}
	c := &call{done: make(chan struct{})}
	t.inflight[k] = c
	t.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(t.ctx, t.cfg.BackgroundTimeout)
		defer cancel()
		c.ids, c.err = t.engine(ctx, req)
		if c.err == nil {
			_, gen, ok := t.lookupTemplate(rk).usable()
			t.store(rk, c.ids, gen, ok)
		}
		t.mu.Lock()
		delete(t.inflight, k)
		t.mu.Unlock()
		close(c.done)
	}()
	return c
}

func (t *Tokenizer) await(ctx context.Context, c *call) ([]uint32, error) {
	select {
	case <-c.done:
		return c.ids, c.err
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, &FallbackError{ReasonTimeout, ctx.Err()}
		}
		return nil, &FallbackError{ReasonCanceled, ctx.Err()}
	}
}

func equal(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
