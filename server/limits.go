package server

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/internal/netlimit"
)

// limitFlags are the per-client and per-connection limits of both ports: what
// one client may hold of the REST port (connections, request rate, header
// size, time to send a request, time to take an answer) and how many ext_proc
// streams the picker serves at once. build makes the limiters themselves
// (internal/netlimit, extproc.StreamLimiter), once, so that the listener, the
// middleware and the metrics count the same connections and requests.
type limitFlags struct {
	maxConnsPerClient int
	ratePerClient     float64
	rateBurst         int // 0: max(1, 2 × ratePerClient)
	maxHeaderBytes    int
	readTimeout       time.Duration
	writeTimeout      time.Duration
	extprocMaxStreams int

	// headerTimeout replaces rest.go's readHeaderTimeout when set; not a flag,
	// it lets a test watch a slowloris be cut off in a fraction of a second.
	headerTimeout time.Duration
}

// limiters are what limitFlags build, never changed after: the metrics
// handler's goroutines read them.
type limiters struct {
	conns   *netlimit.ConnLimiter
	rate    *netlimit.RateLimiter // nil: rate limiting off
	streams *extproc.StreamLimiter
}

// Defaults of the limit flags (their help says why).
const (
	defaultMaxConnsPerClient = 512
	defaultMaxHeaderBytes    = 64 << 10
	defaultHTTPReadTimeout   = time.Minute
	// maxRatePerClient keeps the default burst (twice the rate) an int with
	// room to spare; a million requests per second per client is no limit.
	maxRatePerClient = 1e6
	// minMaxHeaderBytes: a request line and the few headers Dynamo's
	// clients send must fit.
	minMaxHeaderBytes = 1024
)

// rateExempt are the paths never rate-limited: the probes. A kubelet or a
// load balancer probing from the address that also sends traffic must not see
// the server unhealthy because that traffic is being limited.
var rateExempt = []string{"/health", "/ready"}

func (l *limitFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&l.maxConnsPerClient, "max-conns-per-client", defaultMaxConnsPerClient, "most connections one client IP address may hold open on the REST port at once (`n`; 0 = unlimited); a connection over it is closed as soon as it is accepted (kvselect_http_connections_rejected_total). The default is far above what a client's connection pool opens (tens, for Python's urllib3 or Go's http.Client) and keeps one host from taking every file descriptor and goroutine; clients behind one proxy or NAT share an address and this limit")
	fs.Float64Var(&l.ratePerClient, "rate-limit-per-client", 0, "sustained REST `requests` per second allowed from one client IP address; over it a request gets 429 with Retry-After (kvselect_http_rate_limited_requests_total). /health and /ready are never limited. Default 0 = off: kvselect is an internal hop whose callers (a gateway, a Ray driver) often send everything from one address, so only a deployment that knows its clients can pick a rate")
	fs.IntVar(&l.rateBurst, "rate-limit-burst", 0, "requests one client may send at once, above --rate-limit-per-client, after a pause (`n`); 0 = max(1, 2 × the rate), two seconds' worth, so that a client that batches its calls is not refused for it")
	fs.IntVar(&l.maxHeaderBytes, "max-header-bytes", defaultMaxHeaderBytes, "largest request line and headers a REST request may have, in `bytes` (>= 1024); a larger one gets 431. The default fits long bearer tokens and tracing headers many times over, while Go's own default (1 MiB) would let every connection pin a megabyte")
	fs.DurationVar(&l.readTimeout, "http-read-timeout", defaultHTTPReadTimeout, "time a REST client has to send a whole request, headers and body (`duration`; 0 = no limit). Headers alone must arrive within "+readHeaderTimeout.String()+". The default lets the largest body (8 MiB) arrive at about 1.2 Mbit/s and cuts off a client that trickles one; it ends when the body has been read, so a selection waiting in the scheduler queue is not affected")
	fs.DurationVar(&l.writeTimeout, "http-write-timeout", 0, "time from the end of a REST request's headers to the end of its answer (`duration`). Default 0 = none: a selection may wait in the scheduler queue for as long as its client allows, and an answer cut off by a deadline is lost — after /select_and_reserve booked a worker, the client would never learn its reservation, which would hold the load until it expired. Answers are small (but /dump and /metrics), and a client that stops reading holds only its own connections, which --max-conns-per-client bounds")
	fs.IntVar(&l.extprocMaxStreams, "extproc-max-streams", 0, "most ext_proc streams (HTTP requests through the gateway) the picker serves at once, over all connections (`n`; 0 = unlimited); a stream over it is refused at once with RESOURCE_EXHAUSTED and the gateway applies its failure mode (kvselect_extproc_streams_rejected_total). Default 0: a stream costs the picker little and the gateway bounds its own concurrency; set it to cap a runaway gateway")
}

func (l *limitFlags) validate() []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if l.maxConnsPerClient < 0 {
		add("--max-conns-per-client %d: must be 0 (unlimited) or positive", l.maxConnsPerClient)
	}
	if math.IsNaN(l.ratePerClient) || l.ratePerClient < 0 || l.ratePerClient > maxRatePerClient {
		add("--rate-limit-per-client %g: must be 0 (off) or a rate up to %g requests per second", l.ratePerClient, float64(maxRatePerClient))
	}
	switch {
	case l.rateBurst < 0:
		add("--rate-limit-burst %d: must be 0 (twice the rate) or positive", l.rateBurst)
	case l.rateBurst > 0 && l.ratePerClient == 0:
		errs = append(errs, errors.New("--rate-limit-burst requires --rate-limit-per-client"))
	}
	if l.maxHeaderBytes < minMaxHeaderBytes {
		add("--max-header-bytes %d: must be at least %d", l.maxHeaderBytes, minMaxHeaderBytes)
	}
	if l.readTimeout < 0 {
		add("--http-read-timeout %s: must be 0 (no limit) or positive", l.readTimeout)
	}
	if l.writeTimeout < 0 {
		add("--http-write-timeout %s: must be 0 (no limit) or positive", l.writeTimeout)
	}
	if l.extprocMaxStreams < 0 {
		add("--extproc-max-streams %d: must be 0 (unlimited) or positive", l.extprocMaxStreams)
	}
	return errs
}

// burst is --rate-limit-burst with its default applied.
func (l *limitFlags) burst() int {
	if l.rateBurst > 0 {
		return l.rateBurst
	}
	return max(1, int(math.Ceil(2*l.ratePerClient)))
}

// build makes the limiters; they are also the Prometheus collector of
// kvselect_http_connections_*, kvselect_http_rate_limit* (when rate limiting
// is on) and kvselect_extproc_streams_rejected_total / _limit.
func (l *limitFlags) build() *limiters {
	b := &limiters{
		conns:   netlimit.NewConnLimiter(netlimit.ConnLimits{PerClient: l.maxConnsPerClient}),
		streams: extproc.NewStreamLimiter(l.extprocMaxStreams),
	}
	if l.ratePerClient > 0 {
		b.rate = netlimit.NewRateLimiter(netlimit.RateLimits{Rate: l.ratePerClient, Burst: l.burst(), Exempt: rateExempt})
	}
	return b
}

// listener wraps the REST listener with the per-client connection limit.
// Wrap it inside any TLS listener, so that a refused connection costs no
// handshake. It always wraps, even unlimited: kvselect_http_connections_active
// is worth having either way.
func (b *limiters) listener(ln net.Listener) net.Listener {
	return b.conns.Listener(ln)
}

// applyHTTP sets the REST server's header size and timeouts. The header
// timeout is rest.go's readHeaderTimeout (or headerTimeout), no longer than a
// shorter --http-read-timeout: that one bounds the whole request.
func (l *limitFlags) applyHTTP(srv *http.Server) {
	srv.MaxHeaderBytes = l.maxHeaderBytes
	srv.ReadTimeout = l.readTimeout
	srv.WriteTimeout = l.writeTimeout
	srv.ReadHeaderTimeout = cmp.Or(l.headerTimeout, readHeaderTimeout)
	if l.readTimeout > 0 {
		srv.ReadHeaderTimeout = min(srv.ReadHeaderTimeout, l.readTimeout)
	}
}

// middleware applies the per-client request rate to h; h itself when rate
// limiting is off. It does not wrap the ResponseWriter, so the REST front can
// still hijack the connection to answer an oversized body.
func (b *limiters) middleware(h http.Handler) http.Handler {
	if b.rate != nil {
		return b.rate.Middleware(h)
	}
	return h
}

// streamOption is the picker's stream limit, for grpc.NewServer beside
// extproc.ServerOptions(); it adds nothing with --extproc-max-streams 0.
func (b *limiters) streamOption() grpc.ServerOption {
	return b.streams.ServerOption()
}

// Describe implements prometheus.Collector.
func (b *limiters) Describe(ch chan<- *prometheus.Desc) {
	b.conns.Describe(ch)
	if b.rate != nil {
		b.rate.Describe(ch)
	}
	b.streams.Describe(ch)
}

// Collect implements prometheus.Collector.
func (b *limiters) Collect(ch chan<- prometheus.Metric) {
	b.conns.Collect(ch)
	if b.rate != nil {
		b.rate.Collect(ch)
	}
	b.streams.Collect(ch)
}
