// Package relay plays Envoy's part for benchmarks on one machine: it asks the
// endpoint picker for a decision over ext_proc (envoysim), sends the request
// to the chosen worker with the headers the picker set, and relays the
// worker's response back through the same exchange, so the picker sees the
// response path (prefill completion, output tokens, the free) exactly as
// behind a gateway. Along the way it times the decision, the first generated
// token and every streamed event after it.
package relay

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/kvselect/kvselect/envoysim"
)

// Completion is an OpenAI completions request as the harnesses send it.
type Completion struct {
	Model     string `json:"model"`
	Prompt    any    `json:"prompt"` // token ids ([]uint32) or text
	MaxTokens int    `json:"max_tokens"`
	Stream    bool   `json:"stream"`
	// StreamOptions asks for the final usage event, whose cached_tokens
	// the picker's engine hit-rate series read.
	StreamOptions *StreamOptions `json:"stream_options,omitempty"`
}

// StreamOptions are a streamed completion's options.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// Relay sends requests through a picker to workers. The zero options relay
// the whole response in 8 KiB reads, as a well-behaved client and Envoy do;
// the others make the client misbehave the way the soak run's faults need.
type Relay struct {
	Picker *envoysim.Client
	HTTP   *http.Client
	// ReadSize is the size of each read of the worker's response, so of each
	// body chunk relayed (8 KiB when 0); ReadDelay pauses after each chunk:
	// a client on a slow link.
	ReadSize  int
	ReadDelay time.Duration
	// Abandon is where the client gives up on purpose, the exchange then
	// aborted as Envoy resets the stream of a client that went away; for
	// StageRequest the client gives up AbandonAfter after it began.
	Abandon      Stage
	AbandonAfter time.Duration
	// Envoy503 answers a worker that cannot be reached as Envoy does: its
	// own 503 passes the ext_proc filter like a worker's answer, so the
	// picker sees the failure (and its passive health check counts it).
	Envoy503 bool
}

// Stage is a point of a request's path through the picker.
type Stage int

// The stages at which a client may abandon a request.
const (
	StageNone            Stage = iota
	StageRequest               // while the picker decides
	StageRouted                // after the decision, before the worker answers
	StageResponseHeaders       // after the response headers went through the picker
	StageResponseBody          // after the first chunk of the body did
)

func (s Stage) String() string {
	return [...]string{"", "during the request", "after the decision", "after the response headers", "mid response body"}[s]
}

// PickerError is a failure of the exchange with the picker itself — it
// could not be reached, or the stream broke at Step — as opposed to one of
// the worker's.
type PickerError struct {
	Step string // "" for the request, or where the response path broke
	Err  error
}

func (e *PickerError) Error() string {
	if e.Step == "" {
		return e.Err.Error()
	}
	return e.Step + ": " + e.Err.Error()
}

func (e *PickerError) Unwrap() error { return e.Err }

// Result is one request's path and timings, from the moment Do was called.
type Result struct {
	Decision *envoysim.Decision
	Status   int           // the worker's HTTP status (or Envoy's 503); 0 when none answered
	Pick     time.Duration // to the picker's decision
	TTFT     time.Duration // to the first generated token (0 if none came)
	// Events are the arrival times of the streamed events that carry
	// generated text, the first included: their gaps are the inter-token
	// latencies a client sees (one event per token for OpenAI streams).
	Events []time.Duration
	// WorkerID is the answer's x-kvselect-worker-id header (Direct only):
	// kvselect's mock workers name themselves, which tells who served a
	// request a gateway routed; "" when absent.
	WorkerID string
	// Abandoned is where the client gave up (Relay.Abandon); StageNone when
	// it did not. An abandoned request is no error.
	Abandoned Stage
}

// errAbandoned stops reading the response where the client gives up.
var errAbandoned = errors.New("abandoned")

// upstreamFailure is the body of Envoy's 503 for an unreachable upstream.
const upstreamFailure = "upstream connect error or disconnect/reset before headers. reset reason: connection failure"

// Do sends body to path through the picker. headers go to the picker and,
// with the picker's own, to the worker. An answer other than 200 from the
// worker is an error after the exchange has seen it; an immediate response
// from the picker is an error carrying its status in Result.Decision; a
// failure of the exchange itself is a *PickerError.
func (r *Relay) Do(ctx context.Context, path string, body []byte, headers ...envoysim.Header) (Result, error) {
	begin := time.Now()
	hs := append([]envoysim.Header{{Key: "content-type", Value: "application/json"}}, headers...)
	x, res, err := r.decide(ctx, path, body, hs, begin)
	if x == nil {
		return res, err
	}
	d := res.Decision
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.Endpoint+path, bytes.NewReader(d.Body))
	if err != nil {
		x.Abort()
		return res, err
	}
	for _, h := range hs {
		req.Header.Set(h.Key, h.Value)
	}
	for k, v := range d.SetHeaders {
		if !strings.HasPrefix(k, ":") && k != "content-length" {
			req.Header.Set(k, v)
		}
	}
	resp, err := r.HTTP.Do(req)
	if err != nil {
		if r.Envoy503 && ctx.Err() == nil && r.envoy503(x, d.Endpoint) {
			res.Status = http.StatusServiceUnavailable
			return res, err
		}
		x.Abort()
		return res, err
	}
	defer resp.Body.Close()
	return r.respond(x, resp, d.Endpoint, begin, res)
}

// decide runs the request through the picker up to its decision. It
// returns the exchange to go on with, or none when the request ended there:
// the picker answered itself, could not be reached, or the client gave up.
func (r *Relay) decide(ctx context.Context, path string, body []byte, hs []envoysim.Header, begin time.Time) (*envoysim.Exchange, Result, error) {
	sctx := ctx
	if r.Abandon == StageRequest {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeout(ctx, r.AbandonAfter)
		defer cancel()
	}
	x, d, err := r.Picker.Start(sctx, &envoysim.Request{Path: path, Body: body, Modes: envoysim.GIE, Headers: hs})
	if err != nil {
		if r.Abandon == StageRequest && ctx.Err() == nil {
			return nil, Result{Abandoned: StageRequest}, nil
		}
		return nil, Result{}, &PickerError{Err: err}
	}
	res := Result{Decision: d, Pick: time.Since(begin)}
	if d.Immediate != nil {
		x.Close()
		return nil, res, fmt.Errorf("picker answered %d: %s", d.Immediate.Status, d.Immediate.Body)
	}
	if r.Abandon == StageRequest || r.Abandon == StageRouted {
		x.Abort()
		res.Abandoned = StageRouted
		return nil, res, nil
	}
	return x, res, nil
}

// respond relays the worker's response through the exchange: its headers,
// then its body chunk by chunk, timing every text event.
func (r *Relay) respond(x *envoysim.Exchange, resp *http.Response, endpoint string, begin time.Time, res Result) (Result, error) {
	res.Status = resp.StatusCode
	rh := make([]envoysim.Header, 0, len(resp.Header))
	for k, vs := range resp.Header {
		rh = append(rh, envoysim.Header{Key: strings.ToLower(k), Value: vs[0]})
	}
	if _, err := x.ResponseHeaders(envoysim.Response{Status: resp.StatusCode, Headers: rh, Served: endpoint}, false); err != nil {
		x.Abort()
		return res, &PickerError{Step: "response headers", Err: err}
	}
	if r.Abandon == StageResponseHeaders {
		x.Abort()
		res.Abandoned = StageResponseHeaders
		return res, nil
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if r.Abandon == StageResponseBody {
			_, _ = x.ResponseBody(b, false)
			x.Abort()
			res.Abandoned = StageResponseBody
			return res, nil
		}
		_, _ = x.ResponseBody(b, true)
		x.Close()
		return res, fmt.Errorf("worker %s answered %s: %s", endpoint, resp.Status, bytes.TrimSpace(b))
	}
	var err error
	res.Events, err = r.readEvents(resp.Body, begin, func(chunk []byte) error {
		if _, err := x.ResponseBody(chunk, false); err != nil {
			return &PickerError{Step: "response body", Err: err}
		}
		if r.Abandon == StageResponseBody {
			return errAbandoned
		}
		return nil
	})
	if err == nil {
		if _, err = x.ResponseBody(nil, true); err != nil {
			err = &PickerError{Step: "end of stream", Err: err}
		}
	}
	if err != nil {
		x.Abort()
		if errors.Is(err, errAbandoned) {
			res.Abandoned = StageResponseBody
			return res, nil
		}
		return res, err
	}
	x.Close()
	if len(res.Events) > 0 {
		res.TTFT = res.Events[0]
	}
	return res, nil
}

// envoy503 passes Envoy's own 503 for an unreachable endpoint through the
// exchange and closes it; false when the picker's stream broke meanwhile.
func (r *Relay) envoy503(x *envoysim.Exchange, endpoint string) bool {
	if _, err := x.ResponseHeaders(envoysim.Response{Status: http.StatusServiceUnavailable, Served: endpoint}, false); err != nil {
		return false
	}
	if _, err := x.ResponseBody([]byte(upstreamFailure), true); err != nil {
		return false
	}
	x.Close()
	return true
}

// Direct sends body straight to a worker's url, without a picker, and times
// it the way Do does (Decision and Pick stay zero).
func Direct(ctx context.Context, hc *http.Client, url string, body []byte) (Result, error) {
	begin := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return Result{}, err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return Result{}, err
	}
	defer resp.Body.Close()
	res := Result{Status: resp.StatusCode, WorkerID: resp.Header.Get("x-kvselect-worker-id")}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return res, fmt.Errorf("worker %s answered %s: %s", url, resp.Status, bytes.TrimSpace(b))
	}
	if res.Events, err = (&Relay{}).readEvents(resp.Body, begin, nil); err != nil {
		return res, err
	}
	if len(res.Events) > 0 {
		res.TTFT = res.Events[0]
	}
	return res, nil
}

// readEvents reads a response body to its end, r.ReadSize at a time and
// r.ReadDelay apart, handing every chunk to relay (when set) and noting when
// each text event arrived.
func (r *Relay) readEvents(body io.Reader, begin time.Time, relay func([]byte) error) ([]time.Duration, error) {
	var sse eventScanner
	var events []time.Duration
	buf := make([]byte, cmp.Or(r.ReadSize, 8192))
	for {
		n, err := body.Read(buf)
		if n > 0 {
			at := time.Since(begin)
			for range sse.feed(buf[:n]) {
				events = append(events, at)
			}
			if relay != nil {
				if err := relay(buf[:n]); err != nil {
					return events, err
				}
			}
			if r.ReadDelay > 0 {
				time.Sleep(r.ReadDelay)
			}
		}
		if err == io.EOF {
			return events, nil
		}
		if err != nil {
			return events, err
		}
	}
}

// ITLs are the gaps between consecutive token events.
func (r Result) ITLs() []time.Duration {
	if len(r.Events) < 2 {
		return nil
	}
	out := make([]time.Duration, len(r.Events)-1)
	for i := 1; i < len(r.Events); i++ {
		out[i-1] = r.Events[i] - r.Events[i-1]
	}
	return out
}

// eventScanner splits an SSE stream into events across reads and counts
// those that carry generated text: a chat delta's non-empty content or a
// completion choice's non-empty text. The chat stream's first event (the
// role) and the usage and [DONE] events do not count.
type eventScanner struct{ pending []byte }

// feed returns how many text events the bytes completed.
func (s *eventScanner) feed(b []byte) int {
	s.pending = append(s.pending, b...)
	n := 0
	for {
		i := bytes.Index(s.pending, []byte("\n\n"))
		if i < 0 {
			return n
		}
		if HasText(s.pending[:i]) {
			n++
		}
		s.pending = s.pending[i+2:]
	}
}

// HasText reports whether an OpenAI response (or a piece of one) carries
// generated text: a chat delta with non-empty content or a completion
// choice with non-empty text.
func HasText(b []byte) bool {
	for _, key := range [][]byte{[]byte(`"content":"`), []byte(`"text":"`)} {
		for rest := b; ; {
			i := bytes.Index(rest, key)
			if i < 0 || i+len(key) >= len(rest) {
				break
			}
			if rest[i+len(key)] != '"' {
				return true
			}
			rest = rest[i+len(key):]
		}
	}
	return false
}
