package metrics

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// newClient is the HTTP client scrapes and probes go through when Options
// names none: keep-alive HTTP/1.1 from fasthttp, which writes a request and
// reads its answer on the calling goroutine into pooled buffers. net/http's
// client hands every request to a writer and a reader goroutine per
// connection and streams the body back through a pipe; for a 10 KB payload
// fetched five times a second from every engine that client was about half of
// a scrape's CPU (docs/benchmarks.md, "Engine metrics: scrape cost").
func newClient(o Options) *fasthttp.Client {
	return &fasthttp.Client{
		Name:                "kvselect",
		DialDualStack:       true, // fasthttp dials IPv4 only unless told
		MaxIdleConnDuration: 90 * time.Second,
		MaxResponseBodySize: o.MaxBodyBytes,
		// Read buffers are lent per request, not held per connection: one
		// large enough for a whole payload reads it in a system call or two
		// instead of one per 4 KiB.
		ReadBufferSize: 64 << 10,
		TLSConfig:      &tls.Config{MinVersion: tls.VersionTLS12},
		// A metrics payload is small and local: no Accept-Encoding is sent,
		// so the engine answers uncompressed (inflating gzip costs more CPU
		// than the bytes save).
	}
}

// maxRedirects is how many redirects a scrape or probe follows, as net/http's
// client does: a metrics app mounted under a path answers /metrics with a
// redirect to /metrics/ (Starlette's Mount; vLLM works around it on its side,
// vllm/entrypoints/openai/api_server.py, a server that does not would
// otherwise never be scraped).
const maxRedirects = 10

// get GETs url with the given Accept header (none when empty) into resp,
// following redirects, each request within timeout and ctx's deadline,
// whichever is sooner. The client has no context: a cancelled ctx ends the
// visit at the timeout, which bounds it.
func get(ctx context.Context, c *fasthttp.Client, url, accept string, timeout time.Duration, resp *fasthttp.Response) error {
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if timeout <= 0 {
		// fasthttp reads a request without a positive timeout as one
		// without any.
		return context.DeadlineExceeded
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI(url)
	req.Header.SetMethod(fasthttp.MethodGet)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	req.SetTimeout(timeout)
	return c.DoRedirects(req, resp, maxRedirects)
}

// errReason is the scrape outcome label of a failed request.
func errReason(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, fasthttp.ErrDialTimeout),
		errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return "too_large"
	}
	return "http_error"
}

// requestError wraps a failed GET of url for the snapshot and the log;
// limit is the client's body limit.
func requestError(url string, err error, limit int) error {
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		return fmt.Errorf("GET %s: %w: over %d bytes", url, errTooLarge, limit)
	}
	return fmt.Errorf("GET %s: %w", url, err)
}
