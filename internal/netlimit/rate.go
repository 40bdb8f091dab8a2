package netlimit

import (
	"container/list"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// DefaultMaxClients is how many clients a RateLimiter remembers when
// RateLimits.MaxClients is not set. Each costs about 200 bytes, so the table
// stays under 4 MB however many addresses send requests.
const DefaultMaxClients = 16384

// RateLimits configures a RateLimiter.
type RateLimits struct {
	// Rate is the sustained requests per second allowed to one client IP
	// address; it must be positive and finite.
	Rate float64
	// Burst is the most requests a client may send at once after a pause
	// (the bucket's size); values below 1 are read as 1.
	Burst int
	// MaxClients bounds the clients remembered; DefaultMaxClients when not
	// positive. Beyond it the least recently seen client is forgotten (and
	// counted), so a flood of source addresses costs a bounded table, at worst
	// a fresh bucket for a client forgotten too early.
	MaxClients int
	// Exempt lists request paths never limited, compared exactly with
	// URL.Path: health probes must not fail because the client that probes
	// also sends traffic.
	Exempt []string
	// Now is the clock; time.Now when nil. Tests give a fake one.
	Now func() time.Time
	// MetricPrefix starts the metric names; DefaultMetricPrefix when empty.
	MetricPrefix string
}

// RateLimiter is a token bucket per client IP address.
type RateLimiter struct {
	lim    RateLimits
	exempt map[string]bool
	// idleAfter is how long an empty bucket takes to fill up again: a client
	// unseen for that long has a full bucket, the same as a client never
	// seen, so forgetting it changes no decision.
	idleAfter time.Duration

	mu      sync.Mutex
	clients map[netip.Addr]*list.Element
	lru     list.List // of *client; the most recently seen at the front

	limited, evicted atomic.Uint64

	descLimited, descClients, descEvicted *prometheus.Desc
}

// client is one remembered bucket.
type client struct {
	addr   netip.Addr
	bucket *rate.Limiter
	seen   time.Time // the last request's time
}

// RateStats is a snapshot of a RateLimiter.
type RateStats struct {
	Clients int    // clients remembered now
	Limited uint64 // requests refused with 429
	Evicted uint64 // clients forgotten before their bucket refilled (MaxClients reached)
}

// NewRateLimiter returns a limiter. A Rate that is not positive and finite is
// a programming error: the caller decides whether limiting is on at all.
func NewRateLimiter(lim RateLimits) *RateLimiter {
	if !(lim.Rate > 0) || math.IsInf(lim.Rate, 0) {
		panic(fmt.Sprintf("netlimit: rate %v: want a positive finite number of requests per second", lim.Rate))
	}
	lim.Burst = max(lim.Burst, 1)
	if lim.MaxClients <= 0 {
		lim.MaxClients = DefaultMaxClients
	}
	if lim.Now == nil {
		lim.Now = time.Now
	}
	if lim.MetricPrefix == "" {
		lim.MetricPrefix = DefaultMetricPrefix
	}
	exempt := make(map[string]bool, len(lim.Exempt))
	for _, p := range lim.Exempt {
		exempt[p] = true
	}
	p := lim.MetricPrefix
	return &RateLimiter{
		lim:       lim,
		exempt:    exempt,
		idleAfter: time.Duration(float64(lim.Burst) / lim.Rate * float64(time.Second)),
		clients:   make(map[netip.Addr]*list.Element),
		descLimited: prometheus.NewDesc(p+"_rate_limited_requests_total",
			"Requests answered 429 because their client IP address was over its request rate.", nil, nil),
		descClients: prometheus.NewDesc(p+"_rate_limit_clients",
			"Client IP addresses whose request rate is being tracked.", nil, nil),
		descEvicted: prometheus.NewDesc(p+"_rate_limit_evictions_total",
			"Tracked clients forgotten before their bucket refilled, because the table was full (many source addresses at once).", nil, nil),
	}
}

// Limits returns the limits in force (defaults filled in).
func (l *RateLimiter) Limits() RateLimits { return l.lim }

// Allow takes one request's token from addr's bucket. When the bucket is
// empty it reports false and how long until a token is there.
func (l *RateLimiter) Allow(addr netip.Addr) (ok bool, retryAfter time.Duration) {
	now := l.lim.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.touch(addr, now)
	if c.bucket.AllowN(now, 1) {
		return true, 0
	}
	l.limited.Add(1)
	missing := 1 - c.bucket.TokensAt(now)
	return false, time.Duration(missing / l.lim.Rate * float64(time.Second))
}

// touch returns addr's bucket, seen now, remembering it if it was not, and
// forgets the clients that went idle or, past MaxClients, the least recently
// seen. Under l.mu.
func (l *RateLimiter) touch(addr netip.Addr, now time.Time) *client {
	if e, ok := l.clients[addr]; ok {
		c := e.Value.(*client)
		c.seen = now
		l.lru.MoveToFront(e)
		l.forgetIdle(now)
		return c
	}
	l.forgetIdle(now)
	for len(l.clients) >= l.lim.MaxClients {
		oldest := l.lru.Back()
		delete(l.clients, oldest.Value.(*client).addr)
		l.lru.Remove(oldest)
		l.evicted.Add(1)
	}
	c := &client{addr: addr, bucket: rate.NewLimiter(rate.Limit(l.lim.Rate), l.lim.Burst), seen: now}
	l.clients[addr] = l.lru.PushFront(c)
	return c
}

// forgetIdle drops, from the least recently seen end, the clients whose
// bucket has filled up again. Each client is dropped once, so the work is
// constant per request on average. Under l.mu.
func (l *RateLimiter) forgetIdle(now time.Time) {
	for e := l.lru.Back(); e != nil; e = l.lru.Back() {
		c := e.Value.(*client)
		if now.Sub(c.seen) < l.idleAfter {
			return
		}
		delete(l.clients, c.addr)
		l.lru.Remove(e)
	}
}

// Middleware limits next: a request from a client over its rate gets 429,
// Retry-After (whole seconds, at least 1) and {"error": "..."} as
// application/json, the REST API's error envelope. Exempt paths, and requests
// whose RemoteAddr carries no IP address (a Unix socket), pass unlimited.
func (l *RateLimiter) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l.exempt[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil {
			next.ServeHTTP(w, r)
			return
		}
		ok, wait := l.Allow(ap.Addr().Unmap())
		if ok {
			next.ServeHTTP(w, r)
			return
		}
		secs := max(1, int64(math.Ceil(wait.Seconds())))
		body, _ := json.Marshal(struct {
			Error string `json:"error"`
		}{fmt.Sprintf("too many requests: this client may send %g per second (bursts of %d); retry after %d s", l.lim.Rate, l.lim.Burst, secs)})
		h := w.Header()
		h.Set("Retry-After", strconv.FormatInt(secs, 10))
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write(body)
	})
}

// Stats returns the current counts.
func (l *RateLimiter) Stats() RateStats {
	l.mu.Lock()
	n := len(l.clients)
	l.mu.Unlock()
	return RateStats{Clients: n, Limited: l.limited.Load(), Evicted: l.evicted.Load()}
}

// Describe implements prometheus.Collector.
func (l *RateLimiter) Describe(ch chan<- *prometheus.Desc) {
	ch <- l.descLimited
	ch <- l.descClients
	ch <- l.descEvicted
}

// Collect implements prometheus.Collector.
func (l *RateLimiter) Collect(ch chan<- prometheus.Metric) {
	st := l.Stats()
	ch <- prometheus.MustNewConstMetric(l.descLimited, prometheus.CounterValue, float64(st.Limited))
	ch <- prometheus.MustNewConstMetric(l.descClients, prometheus.GaugeValue, float64(st.Clients))
	ch <- prometheus.MustNewConstMetric(l.descEvicted, prometheus.CounterValue, float64(st.Evicted))
}
