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
	"context"
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

// Relay sends requests through a picker to workers.
type Relay struct {
	Picker *envoysim.Client
	HTTP   *http.Client
}

// Result is one request's path and timings, from the moment Do was called.
type Result struct {
	Decision *envoysim.Decision
	Status   int           // the worker's HTTP status; 0 when none answered
	Pick     time.Duration // to the picker's decision
	TTFT     time.Duration // to the first generated token (0 if none came)
	// Events are the arrival times of the streamed events that carry
	// generated text, the first included: their gaps are the inter-token
	// latencies a client sees (one event per token for OpenAI streams).
	Events []time.Duration
}

// Do sends body to path through the picker. headers go to the picker and,
// with the picker's own, to the worker. An answer other than 200 from the
// worker is an error after the exchange has seen it; an immediate response
// from the picker is an error carrying its status in Result.Decision.
func (r *Relay) Do(ctx context.Context, path string, body []byte, headers ...envoysim.Header) (Result, error) {
	begin := time.Now()
	hs := append([]envoysim.Header{{Key: "content-type", Value: "application/json"}}, headers...)
	x, d, err := r.Picker.Start(ctx, &envoysim.Request{Path: path, Body: body, Modes: envoysim.GIE, Headers: hs})
	if err != nil {
		return Result{}, err
	}
	res := Result{Decision: d, Pick: time.Since(begin)}
	if d.Immediate != nil {
		x.Close()
		return res, fmt.Errorf("picker answered %d: %s", d.Immediate.Status, d.Immediate.Body)
	}
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
		x.Abort()
		return res, err
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	rh := make([]envoysim.Header, 0, len(resp.Header))
	for k, vs := range resp.Header {
		rh = append(rh, envoysim.Header{Key: strings.ToLower(k), Value: vs[0]})
	}
	if _, err := x.ResponseHeaders(envoysim.Response{Status: resp.StatusCode, Headers: rh, Served: d.Endpoint}, false); err != nil {
		x.Abort()
		return res, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		_, _ = x.ResponseBody(b, true)
		x.Close()
		return res, fmt.Errorf("worker %s answered %s: %s", d.Endpoint, resp.Status, bytes.TrimSpace(b))
	}
	res.Events, err = readEvents(resp.Body, begin, func(chunk []byte) error {
		_, err := x.ResponseBody(chunk, false)
		return err
	})
	if err == nil {
		_, err = x.ResponseBody(nil, true)
	}
	if err != nil {
		x.Abort()
		return res, err
	}
	x.Close()
	if len(res.Events) > 0 {
		res.TTFT = res.Events[0]
	}
	return res, nil
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
	res := Result{Status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return res, fmt.Errorf("worker %s answered %s: %s", url, resp.Status, bytes.TrimSpace(b))
	}
	if res.Events, err = readEvents(resp.Body, begin, nil); err != nil {
		return res, err
	}
	if len(res.Events) > 0 {
		res.TTFT = res.Events[0]
	}
	return res, nil
}

// readEvents reads a response body to its end, handing every chunk to relay
// (when set) and noting when each text event arrived.
func readEvents(body io.Reader, begin time.Time, relay func([]byte) error) ([]time.Duration, error) {
	var sse eventScanner
	var events []time.Duration
	buf := make([]byte, 8192)
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
