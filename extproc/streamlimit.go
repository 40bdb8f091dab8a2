package extproc

import (
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Stream limit metrics. They are the StreamLimiter's own collector rather
// than the picker's: the limiter belongs to the grpc.Server, which is built
// with it before (and apart from) any picker.
var (
	descStreamsRejected = prometheus.NewDesc("kvselect_extproc_streams_rejected_total",
		"ext_proc streams refused with RESOURCE_EXHAUSTED because --extproc-max-streams were in flight (the gateway applies its failure mode).", nil, nil)
	descStreamsLimit = prometheus.NewDesc("kvselect_extproc_streams_limit",
		"The most ext_proc streams served at once (--extproc-max-streams); 0 means unlimited.", nil, nil)
)

// processPrefix starts the full method names the limit applies to.
const processPrefix = "/" + ServiceName + "/"

// StreamLimiter bounds the ext_proc streams in flight across all connections.
// Each stream is one HTTP request that holds a goroutine, its buffers and
// usually a booking for as long as the response lasts; past the bound a new
// stream is refused at once with RESOURCE_EXHAUSTED, so that the gateway
// applies its failure mode (fail open to its own load balancing, or fail the
// request) instead of queueing behind streams that may last minutes.
//
// Only the ext_proc service is limited. The gRPC health service is not: a
// picker at its limit is busy, not unhealthy, and a health check refused
// because of traffic would make the gateway eject a working picker (Envoy's
// and Kubernetes' checks are unary Check calls, which a stream interceptor
// does not see anyway; Watch streams are let through too).
type StreamLimiter struct {
	max      int64
	active   atomic.Int64
	rejected atomic.Uint64
}

// NewStreamLimiter returns a limiter of max concurrent streams; max <= 0
// means unlimited (ServerOption adds nothing, the metrics still report).
func NewStreamLimiter(max int) *StreamLimiter {
	return &StreamLimiter{max: int64(max)}
}

// ServerOption installs the limiter on a grpc.Server; pass it with
// ServerOptions(). It chains, so other stream interceptors may be added
// before or after it. A nil or unlimited limiter adds nothing.
func (l *StreamLimiter) ServerOption() grpc.ServerOption {
	if l == nil || l.max <= 0 {
		return grpc.EmptyServerOption{}
	}
	return grpc.ChainStreamInterceptor(l.Intercept)
}

// Intercept is the grpc.StreamServerInterceptor: a stream of the ext_proc
// service takes a place or is refused before its handler runs, and frees the
// place when the handler returns.
func (l *StreamLimiter) Intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if l.max <= 0 || !strings.HasPrefix(info.FullMethod, processPrefix) {
		return handler(srv, ss)
	}
	if !l.acquire() {
		l.rejected.Add(1)
		return status.Errorf(codes.ResourceExhausted, "kvselect: %d ext_proc streams in flight, the most this picker serves (--extproc-max-streams)", l.max)
	}
	defer l.active.Add(-1)
	return handler(srv, ss)
}

// acquire takes a place if one is free. A compare-and-swap rather than an add
// then a check: two streams racing for the last place never both lose.
func (l *StreamLimiter) acquire() bool {
	for {
		n := l.active.Load()
		if n >= l.max {
			return false
		}
		if l.active.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Active is the number of limited streams in flight.
func (l *StreamLimiter) Active() int64 { return l.active.Load() }

// Rejected is the number of streams refused.
func (l *StreamLimiter) Rejected() uint64 { return l.rejected.Load() }

// Describe implements prometheus.Collector.
func (l *StreamLimiter) Describe(ch chan<- *prometheus.Desc) {
	ch <- descStreamsRejected
	ch <- descStreamsLimit
}

// Collect implements prometheus.Collector. The streams in flight are the
// picker's kvselect_extproc_streams_active.
func (l *StreamLimiter) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descStreamsRejected, prometheus.CounterValue, float64(l.rejected.Load()))
	ch <- prometheus.MustNewConstMetric(descStreamsLimit, prometheus.GaugeValue, float64(max(l.max, 0)))
}

var (
	_ grpc.StreamServerInterceptor = (*StreamLimiter)(nil).Intercept
	_ prometheus.Collector         = (*StreamLimiter)(nil)
)
