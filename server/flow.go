package server

import (
	"flag"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/flow"
)

// Flow control at the gateway (docs/flow-control.md): the order and limits
// of the requests that wait while every worker is busy.
type flowFlags struct {
	mode         string // off, cost, count or fifo
	ttl          time.Duration
	maxBytes     int64
	maxBandBytes int64
	maxTenants   int
}

const flowOff = "off"

// defaultFlowMaxBytes bounds the bytes of waiting request bodies: enough
// for thousands of long prompts, far from a picker's memory.
const defaultFlowMaxBytes = 1 << 30

func (f *flowFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.mode, "flow-control", flowOff, "how waiting requests are ordered while every worker is busy (queueing on: DYN_ROUTER_QUEUE_THRESHOLD): off (Dynamo's router queue policy), or flow control with priority bands (x-llm-d-inference-objective, x-kvselect-priority, REST priority) and fairness between tenants (x-llm-d-inference-fairness-id, REST tenant; --session-as-fairness-id) by `fairness`: cost (uncached prompt plus expected output tokens), count (requests) or fifo")
	fs.DurationVar(&f.ttl, "flow-queue-ttl", flow.DefaultTTL, "longest wait of a request under flow control (`duration`), then 429")
	fs.Int64Var(&f.maxBytes, "flow-max-bytes", defaultFlowMaxBytes, "request `bytes` that may wait under flow control in one partition, all priorities together (0: no bound); a request that does not fit is a 429")
	fs.Int64Var(&f.maxBandBytes, "flow-max-band-bytes", 0, "request `bytes` that may wait at one priority in one partition (0: only --flow-max-bytes)")
	fs.IntVar(&f.maxTenants, "flow-max-tenants", flow.DefaultMaxTenants, "tenants flow control remembers per partition (`n`); past it the longest idle one is forgotten, and while all of them wait a new tenant is a 429")
}

func (f *flowFlags) validate(set map[string]bool) []error {
	errs := inertFlags(set, f.mode == flowOff, "--flow-control off", "flow-queue-ttl", "flow-max-bytes", "flow-max-band-bytes", "flow-max-tenants")
	if f.mode != flowOff {
		if _, err := flow.ParseFairness(f.mode); err != nil {
			errs = append(errs, fmt.Errorf("--flow-control %q: want off, cost, count or fifo", f.mode))
		}
	}
	if f.ttl <= 0 {
		errs = append(errs, fmt.Errorf("--flow-queue-ttl must be positive, got %v", f.ttl))
	}
	if f.maxBytes < 0 || f.maxBandBytes < 0 {
		errs = append(errs, fmt.Errorf("--flow-max-bytes and --flow-max-band-bytes must not be negative"))
	}
	if f.maxTenants <= 0 {
		errs = append(errs, fmt.Errorf("--flow-max-tenants must be positive, got %d", f.maxTenants))
	}
	return errs
}

// apply puts flow control into the service configuration and its events
// into m.
func (f *flowFlags) apply(cfg *selection.Config, m *flowMetrics) {
	if f.mode == flowOff {
		return
	}
	fairness, _ := flow.ParseFairness(f.mode) // validated
	cfg.Flow = &flow.Config{Fairness: fairness, TTL: f.ttl, MaxBytes: f.maxBytes, MaxBandBytes: f.maxBandBytes, MaxTenants: f.maxTenants}
	cfg.OnFlow = m.observe
}

// loadObjectives is the table of InferenceObjective priorities (flow
// control) both fronts look names up in: the config file's, and the
// InferencePool namespace's once discovery watches them. watched is the
// table for discovery to fill, nil with flow control off: then the pool's
// objectives matter to nothing.
func loadObjectives(o *options, file *configFile, log *slog.Logger) (objectives, watched *flow.Objectives, err error) {
	fromFile, err := file.objectives()
	if err != nil {
		return nil, nil, &UsageError{err}
	}
	objectives = new(flow.Objectives)
	objectives.Set(flow.SourceFile, fromFile)
	if o.flow.mode != flowOff {
		return objectives, objectives, nil
	}
	if len(fromFile) > 0 {
		log.Warn("the config file has objectives but --flow-control is off: their priorities order nothing", "file", o.configFile)
	}
	return objectives, nil, nil
}

// tenantBuckets is how many label values tenants are hashed into: the
// series stay bounded whatever tenant ids clients send. GET /flow names the
// tenants themselves.
const tenantBuckets = 16

func tenantBucket(tenant string) string {
	h := fnv.New32a()
	h.Write([]byte(tenant))
	return strconv.Itoa(int(h.Sum32() % tenantBuckets))
}

// priorityLabel bounds the priority label: -10..10 as themselves, beyond as
// "<-10" or ">10".
func priorityLabel(p int) string {
	switch {
	case p < -10:
		return "<-10"
	case p > 10:
		return ">10"
	}
	return strconv.Itoa(p)
}

var (
	descFlowQueued = prometheus.NewDesc("kvselect_flow_queued_requests",
		"Requests waiting under flow control, by partition, priority band and tenant bucket.",
		[]string{"model", "routing_group", "priority", "tenant_bucket"}, nil)
	descFlowQueuedBytes = prometheus.NewDesc("kvselect_flow_queued_bytes",
		"Request bytes waiting under flow control, by partition.", []string{"model", "routing_group"}, nil)
	descFlowEvicted = prometheus.NewDesc("kvselect_flow_evicted_tenants_total",
		"Idle tenants forgotten to stay within --flow-max-tenants, by partition.", []string{"model", "routing_group"}, nil)
)

// flowMetrics are flow control's series: a histogram of the waits by how
// each request left (its count is the outcome counter), and the queues read
// at scrape time.
type flowMetrics struct {
	svc  *selection.Service // set once the service exists
	wait *prometheus.HistogramVec
}

func newFlowMetrics() *flowMetrics {
	return &flowMetrics{wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvselect_flow_wait_seconds",
		Help: "Time requests waited under flow control, by partition, priority band, tenant bucket and outcome (dispatched, expired, shed, rejected, abandoned); shed and rejected requests wait 0.",
		// 1 ms to ~65 s.
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 17),
	}, []string{"model", "routing_group", "priority", "tenant_bucket", "outcome"})}
}

func (m *flowMetrics) observe(ev selection.FlowEvent) {
	m.wait.WithLabelValues(ev.Model, ev.RoutingGroup, priorityLabel(ev.Priority), tenantBucket(ev.Tenant), ev.Outcome).Observe(ev.Wait.Seconds())
}

// Describe implements prometheus.Collector.
func (m *flowMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.wait.Describe(ch)
	ch <- descFlowQueued
	ch <- descFlowQueuedBytes
	ch <- descFlowEvicted
}

// Collect implements prometheus.Collector.
func (m *flowMetrics) Collect(ch chan<- prometheus.Metric) {
	m.wait.Collect(ch)
	if m.svc == nil {
		return
	}
	for _, p := range m.svc.Inspect().FlowState() {
		ch <- prometheus.MustNewConstMetric(descFlowQueuedBytes, prometheus.GaugeValue, float64(p.QueuedBytes), p.ModelName, p.RoutingGroup)
		ch <- prometheus.MustNewConstMetric(descFlowEvicted, prometheus.CounterValue, float64(p.EvictedTenants), p.ModelName, p.RoutingGroup)
		queued := map[[2]string]int{}
		for _, b := range p.Bands {
			for _, t := range b.Tenants {
				if t.Queued > 0 {
					queued[[2]string{priorityLabel(b.Priority), tenantBucket(t.Tenant)}] += t.Queued
				}
			}
		}
		for k, n := range queued {
			ch <- prometheus.MustNewConstMetric(descFlowQueued, prometheus.GaugeValue, float64(n), p.ModelName, p.RoutingGroup, k[0], k[1])
		}
	}
}
