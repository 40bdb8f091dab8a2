package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/engines/kvlisten"
	"github.com/kvselect/kvselect/selection"
)

// envKVEventsBind is --kv-events-bind's variable.
const envKVEventsBind = "KVSELECT_KV_EVENTS_BIND"

// startKVEvents opens the KV-event listeners when KV events are on: one ZMQ
// SUB per registered worker rank, with replay gap recovery (the service
// attaches and detaches ranks as the catalog changes, and --threads writer
// lanes apply the events), and the collector sockets of --kv-events-bind
// (else KVSELECT_KV_EVENTS_BIND), which feed the ranks registered without an
// endpoint of their own. It puts them in cfg; close ends them.
func startKVEvents(ctx context.Context, o *options, lookup func(string) (string, bool), cfg *selection.Config, reg prometheus.Registerer, log *slog.Logger) (close func(), err error) {
	binds := o.kvEventsBind
	if !o.set["kv-events-bind"] {
		if v, ok := lookup(envKVEventsBind); ok && strings.TrimSpace(v) != "" {
			if binds, err = parseList(v, validateBindEndpoint); err != nil {
				return nil, &UsageError{fmt.Errorf("%s: %w", envKVEventsBind, err)}
			}
		}
	}
	if len(binds) > 0 && !cfg.Router.UseKVEvents {
		return nil, &UsageError{errors.New("--kv-events-bind needs KV events on (DYN_ROUTER_USE_KV_EVENTS is false)")}
	}
	if !cfg.Router.UseKVEvents {
		return func() {}, nil
	}
	kv := kvlisten.New(ctx, kvlisten.Options{Logger: log, Lanes: cfg.Router.EventThreads, MaxFrameBytes: o.kvEventsMaxFrame})
	for _, ep := range binds {
		if _, err := kv.Bind(ep); err != nil {
			kv.Close()
			return nil, err
		}
	}
	cfg.Listeners = kv
	cfg.EventsCollector = len(binds) > 0
	reg.MustRegister(kv)
	return kv.Close, nil
}

// newCore builds the selection service from cfg, the tracking key file and
// the engine, disaggregation and flow control flags, and registers its
// metrics.
func newCore(o *options, cfg selection.Config, reg prometheus.Registerer, log *slog.Logger) (*selection.Service, error) {
	if err := loadTrackingKey(&cfg); err != nil {
		return nil, err
	}
	cfg.Engine = o.engines.config()
	o.disagg.apply(&cfg, log)
	flowMetrics := newFlowMetrics()
	o.flow.apply(&cfg, flowMetrics)
	latencyMetrics := newLatencyMetrics()
	o.latency.apply(&cfg, latencyMetrics)
	bookEndMetrics := newBookingEndMetrics()
	o.bookEnd.apply(&cfg, bookEndMetrics)
	svc, err := selection.New(cfg)
	if err != nil {
		// Only configuration reaches New (a key of the wrong size, say).
		if path, ok := cfg.Router.TrackingKeyFile.Get(); ok {
			err = fmt.Errorf("tracking key file %s: %w", path, err)
		}
		return nil, &UsageError{err}
	}
	reg.MustRegister(disaggMetrics{svc: svc})  // kvselect_prefill_decisions_total
	reg.MustRegister(routingMetrics{svc: svc}) // kvselect_selection_*
	flowMetrics.svc = svc
	reg.MustRegister(flowMetrics)    // kvselect_flow_*
	reg.MustRegister(latencyMetrics) // kvselect_latency_*, kvselect_slo_requests_total
	reg.MustRegister(bookEndMetrics) // kvselect_booking_*, kvselect_bookings_ended_by_estimate_total
	if fc := svc.Inspect().FlowConfig(); fc != nil {
		log.Info("flow control on: waiting requests ordered by priority band and tenant fairness", "fairness", fc.Fairness.String(),
			"queue_ttl", fc.TTL.String(), "max_bytes", fc.MaxBytes, "max_band_bytes", fc.MaxBandBytes, "max_tenants", fc.MaxTenants)
	}
	return svc, nil
}
