package server

import (
	"flag"
	"fmt"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// Disaggregated prefill/decode (docs/disaggregation.md): where a model's
// prefill pool is, whether the picker decides P/D, and the header that names
// the prefill worker to the decode pod. The conditional rules themselves are
// the router configuration's (DYN_ROUTER_CONDITIONAL_DISAGG_*).
type disaggFlags struct {
	prefillGroup  string
	mode          string // auto or off
	prefillHeader string
}

const (
	disaggAuto = "auto"
	disaggOff  = "off"
)

func (d *disaggFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.prefillGroup, "prefill-routing-group", selection.DefaultPrefillRoutingGroup, "routing `group` of every model's prefill workers; workers registered with role prefill and no routing group join it, and a model is disaggregated while it has schedulable workers there")
	fs.StringVar(&d.mode, "disaggregation", disaggAuto, "the picker's prefill/decode `mode`: auto decides for every request of a model with a prefill pool (remote prefill names the prefill worker in --prefill-header; DYN_ROUTER_CONDITIONAL_DISAGG_* decide when the decode worker prefills locally), off routes every request as aggregated. The REST API decides for requests with \"disaggregated\": true")
	fs.StringVar(&d.prefillHeader, "prefill-header", extproc.HeaderPrefiller, "request `header` that names the prefill worker's host:port to the decode worker (llm-d's routing sidecar reads x-prefiller-host-port); kvselect also sets "+extproc.HeaderPrefillEndpoint)
}

func (d *disaggFlags) validate() []error {
	var errs []error
	if strings.TrimSpace(d.prefillGroup) == "" {
		errs = append(errs, fmt.Errorf("--prefill-routing-group: empty group name"))
	}
	if d.mode != disaggAuto && d.mode != disaggOff {
		errs = append(errs, fmt.Errorf("--disaggregation %q: want auto or off", d.mode))
	}
	if !validHeaderName(d.prefillHeader) {
		errs = append(errs, fmt.Errorf("--prefill-header %q: want a lower-case HTTP header name (letters, digits, '-')", d.prefillHeader))
	}
	return errs
}

// validHeaderName accepts the lower-case token names HTTP/2 and Envoy's
// header mutations require, and no pseudo-header.
func validHeaderName(h string) bool {
	if h == "" {
		return false
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// apply puts the flags into the service configuration; the pool transitions
// go to the log, once per change.
func (d *disaggFlags) apply(cfg *selection.Config, log *slog.Logger) {
	cfg.PrefillRoutingGroup = d.prefillGroup
	cfg.OnPrefillPool = func(model string, usable bool, reason string) {
		if usable {
			log.Info("prefill pool usable again: disaggregated requests prefill remotely when the rules say so", "model", model, "routing_group", d.prefillGroup)
			return
		}
		log.Warn("prefill pool cannot take requests: decode workers prefill locally", "model", model, "routing_group", d.prefillGroup, "reason", reason)
	}
}

var descDisaggDecisions = prometheus.NewDesc("kvselect_prefill_decisions_total",
	"Prefill/decode decisions for requests to models with a prefill pool, by decision (remote_prefill or local_prefill) and reason (Dynamo's conditional-disaggregation outcomes, no_prefill_workers, prefill_unavailable).",
	[]string{"decision", "reason"}, nil)

// disaggMetrics exposes the service's prefill/decode decisions.
type disaggMetrics struct{ svc *selection.Service }

func (disaggMetrics) Describe(ch chan<- *prometheus.Desc) { ch <- descDisaggDecisions }

func (m disaggMetrics) Collect(ch chan<- prometheus.Metric) {
	st := m.svc.Inspect().DisaggStats()
	for _, reason := range scheduler.DisaggReasons {
		decision := "local_prefill"
		if scheduler.ReasonRemote(reason) {
			decision = "remote_prefill"
		}
		ch <- prometheus.MustNewConstMetric(descDisaggDecisions, prometheus.CounterValue, float64(st[reason]), decision, reason)
	}
}
