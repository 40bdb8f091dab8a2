package tokenize

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/kvselect/kvselect/selection"
)

// ValidateEndpoint accepts a tokenize endpoint: an absolute http(s) base URL
// (POST <url>/tokenize is called).
func ValidateEndpoint(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("invalid URL %q: %w", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("invalid URL %q: scheme must be http or https", s)
	}
	if u.Hostname() == "" {
		return fmt.Errorf("invalid URL %q: missing host", s)
	}
	return nil
}

var errNoWorker = errors.New("no schedulable worker with an endpoint")

// target is the base URL to ask for req's partition.
func (t *Tokenizer) target(part selection.PartitionKey) (string, error) {
	if u, ok := t.cfg.Endpoints[part.ModelName]; ok {
		return strings.TrimSuffix(u, "/"), nil
	}
	if t.cfg.Mode != ModePool {
		return "", &FallbackError{ReasonNoEndpoint, fmt.Errorf("no tokenize endpoint for model %q", part.ModelName)}
	}
	eps := t.pool.Endpoints(part)
	if len(eps) == 0 {
		return "", &FallbackError{ReasonNoWorker, errNoWorker}
	}
	model, group := part.ModelName, part.RoutingGroup
	if model == "" {
		model = "default"
	}
	if group == "" {
		group = "default"
	}
	type load struct{ requests, prefill uint64 }
	byWorker := map[uint64]load{}
	for _, ml := range t.pool.Loads(&model, &group) {
		for _, l := range ml.Loads {
			w := byWorker[l.WorkerID]
			w.requests += l.ActiveRequests
			w.prefill += l.PotentialPrefillTokens
			byWorker[l.WorkerID] = w
		}
	}
	// The least-loaded worker, ties broken in turn so that an idle pool
	// shares the calls.
	t.mu.Lock()
	t.rr++
	off := t.rr
	t.mu.Unlock()
	best, bestLoad := "", load{}
	for i := range eps {
		e := eps[(uint64(i)+off)%uint64(len(eps))]
		if e.Endpoint == "" {
			continue
		}
		l := byWorker[e.WorkerID]
		if best == "" || l.requests < bestLoad.requests || (l.requests == bestLoad.requests && l.prefill < bestLoad.prefill) {
			best, bestLoad = e.Endpoint, l
		}
	}
	if best == "" {
		return "", &FallbackError{ReasonNoWorker, errNoWorker}
	}
	if !strings.Contains(best, "://") {
		best = "http://" + best
	}
	return strings.TrimSuffix(best, "/"), nil
}

// engine asks the target's /tokenize for req's ids.
func (t *Tokenizer) engine(ctx context.Context, req *selection.TokenizeRequest) ([]uint32, error) {
	base, err := t.target(req.PartitionKey)
	if err != nil {
		return nil, err
	}
	body := requestBody(req)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, &FallbackError{ReasonUnavailable, err}
	}
	hr.Header.Set("Content-Type", "application/json")
	t.m.engineCalls.Add(1)
	resp, err := t.http.Do(hr)
	if err != nil {
		return nil, classify(ctx, err)
	}
	defer resp.Body.Close()
	// Read one byte past the cap to tell a full answer from a cut one.
	b, err := io.ReadAll(io.LimitReader(resp.Body, t.cfg.MaxResponseBytes+1))
	if err != nil {
		return nil, classify(ctx, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, &FallbackError{ReasonStatus, fmt.Errorf("POST %s/tokenize: status %d: %s", base, resp.StatusCode, short(string(b)))}
	}
	if int64(len(b)) > t.cfg.MaxResponseBytes {
		return nil, &FallbackError{ReasonTooLarge, fmt.Errorf("POST %s/tokenize: answer over %d bytes", base, t.cfg.MaxResponseBytes)}
	}
	ids, err := ParseResponse(b, t.cfg.MaxTokens)
	switch {
	case errors.Is(err, errTooLarge):
		return nil, &FallbackError{ReasonTooLarge, err}
	case err != nil:
		return nil, &FallbackError{ReasonBadResponse, err}
	}
	return ids, nil
}

func classify(ctx context.Context, err error) error {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return &FallbackError{ReasonTimeout, err}
	case ctx.Err() != nil:
		return &FallbackError{ReasonCanceled, err}
	}
	return &FallbackError{ReasonUnavailable, err}
}

// requestBody is vLLM's TokenizeCompletionRequest or TokenizeChatRequest:
// the model, the prompt or the messages verbatim, and the request's fields.
func requestBody(req *selection.TokenizeRequest) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":`)
	writeJSONString(&b, req.ModelName)
	if req.Messages != nil {
		b.WriteString(`,"messages":[`)
		for i, m := range req.Messages {
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(m)
		}
		b.WriteByte(']')
	} else {
		b.WriteString(`,"prompt":`)
		writeJSONString(&b, req.Prompt)
	}
	for _, o := range req.Options {
		if req.Messages == nil && o.Name != "add_special_tokens" {
			continue // the completion form takes no chat fields
		}
		b.WriteString(`,`)
		writeJSONString(&b, o.Name)
		b.WriteByte(':')
		b.Write(o.Value)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// writeJSONString writes s as a JSON string (strconv.Quote's escapes are Go's,
// not JSON's, for control and non-printable characters).
func writeJSONString(b *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

// jsonString is s as a JSON string.
func jsonString(s string) string {
	var b bytes.Buffer
	writeJSONString(&b, s)
	return b.String()
}
