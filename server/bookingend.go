package server

import (
	"flag"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/bookingend"
)

// bookingEndFlags say what ends a booking whose end the picker cannot see
// (docs/extproc.md, "Booking end"): a gateway that never sends the ext_proc
// response phase, such as NGINX Gateway Fabric's shim.
type bookingEndFlags struct {
	mode         extproc.BookingEnd
	rest         string // restEndFree or restEndEstimate
	max          time.Duration
	outputTokens int
}

// --rest-booking-end modes.
const (
	restEndFree     = "free"
	restEndEstimate = "estimate"
)

// keepsEnds reports whether any front may keep a booking to an estimated
// end, so that the server runs KeepEnds.
func (f *bookingEndFlags) keepsEnds() bool {
	return f.mode != extproc.BookingEndResponse || f.rest == restEndEstimate
}

func (f *bookingEndFlags) register(fs *flag.FlagSet) {
	fs.Func("booking-end", "what ends a picker booking whose response the ext_proc stream does not show (`mode`): auto (keep it to its estimated end when the gateway hangs up cleanly after the decision without protocol_config or response phase, as NGINX Gateway Fabric's shim does; else free at the stream's end), response (always free at the stream's end), estimate (always keep it to its estimated end) (default auto)",
		func(s string) error {
			m, err := extproc.ParseBookingEnd(s)
			if err != nil {
				return err
			}
			f.mode = m
			return nil
		})
	f.rest = restEndFree
	fs.Func("rest-booking-end", "what ends a booking made over REST (/select_and_reserve, /reservations) (`mode`): free (its caller's DELETE /reservations/{id}, else the 300 s active-request expiry, as in Dynamo) or estimate (also its estimated end, for callers that book and never free) (default free)",
		func(s string) error {
			switch s {
			case restEndFree, restEndEstimate:
				f.rest = s
				return nil
			}
			return fmt.Errorf("REST booking end %q: want free or estimate", s)
		})
	fs.DurationVar(&f.max, "booking-estimate-max", bookingend.DefaultMax, "hard cap of a booking's estimated lifetime (`duration`, from its decision); the active-request expiry reclaims every booking after 300 s anyway")
	fs.IntVar(&f.outputTokens, "booking-estimate-output-tokens", bookingend.DefaultOutputTokens, "output tokens (`n`) expected of a request that states none, until the model's seen responses (8 or more) give their own length")
}

func (f *bookingEndFlags) validate() []error {
	var errs []error
	if f.max <= 0 {
		errs = append(errs, fmt.Errorf("--booking-estimate-max must be positive, got %v", f.max))
	}
	if f.outputTokens < 1 {
		errs = append(errs, fmt.Errorf("--booking-estimate-output-tokens must be at least 1, got %d", f.outputTokens))
	}
	return errs
}

func (f *bookingEndFlags) apply(cfg *selection.Config, m *bookingEndMetrics) {
	cfg.BookingEnd = bookingend.Config{Max: f.max, OutputTokens: f.outputTokens}
	cfg.OnBookingEnd = m.observe
	cfg.KeepsEstimatedEnds = f.keepsEnds()
}

// bookingEndMetrics compare the estimated lifetimes of bookings with the
// lifetimes they had, where those are known (a caller freed the booking:
// the response phase ended, or a REST caller freed it), and count the
// bookings ended by their estimate.
type bookingEndMetrics struct {
	estimated *prometheus.HistogramVec // by model and end (estimate, seen)
	actual    *prometheus.HistogramVec // by model
	relErr    *prometheus.HistogramVec // by model
	ended     *prometheus.CounterVec   // by model and how
	firstErr  *prometheus.HistogramVec // by model
	decoded   *prometheus.CounterVec   // by model
}

func newBookingEndMetrics() *bookingEndMetrics {
	lifetimes := prometheus.ExponentialBuckets(0.05, 2, 14) // 50 ms to ~7 min
	return &bookingEndMetrics{
		estimated: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvselect_booking_estimated_lifetime_seconds",
			Help:    "Estimated lifetimes of bookings (decision to end: predicted TTFT plus expected output tokens at the predicted ITL, capped), by model and end: estimate for the bookings kept to it (the picker could not see their end), seen for the bookings whose end was seen (what the estimate would have been).",
			Buckets: lifetimes,
		}, []string{"model", "end"}),
		actual: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvselect_booking_lifetime_seconds",
			Help:    "Lifetimes of traced bookings whose end was seen (decision to free), by model.",
			Buckets: lifetimes,
		}, []string{"model"}),
		relErr: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvselect_booking_lifetime_relative_error",
			Help:    "(estimated − actual) / actual lifetime of each traced booking whose end was seen (actual floored at 1 ms), by model: negative when the estimate would have freed it early.",
			Buckets: []float64{-0.9, -0.75, -0.5, -0.25, -0.1, 0, 0.1, 0.25, 0.5, 1, 2, 5, 10},
		}, []string{"model"}),
		firstErr: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvselect_booking_first_token_error_seconds",
			Help:    "Estimated minus seen time to first token of each booking kept to an estimated end whose first token its engine's KV events showed (the prompt's last block stored), by model: negative when the estimate was early (the request waited in the engine's queue); its end moved by as much.",
			Buckets: []float64{-5, -1, -0.5, -0.25, -0.1, -0.05, -0.01, 0, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 5},
		}, []string{"model"}),
		decoded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvselect_booking_decode_blocks_seen_total",
			Help: "Blocks of output its engine's KV events showed stored for a booking kept to an estimated end (its decode advancing a block), each moving the booking's end to the output left at the pace seen, by model.",
		}, []string{"model"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvselect_bookings_ended_by_estimate_total",
			Help: "Bookings kept to an estimated end (their end was never reported) and freed, by model and how: estimated_end (at the estimate, moved by the first token and the output blocks its engine's KV events showed), first_token_unseen (later: it waited for its engine to report beginning it, and gave up), output_block_unseen (later: it waited for a block of output its engine should have stored before the estimated end, and gave up) or engine_counts (earlier: their engine reported fewer running and waiting requests than such bookings on the rank).",
		}, []string{"model", "how"}),
	}
}

func (m *bookingEndMetrics) observe(ev selection.BookingEndEvent) {
	switch ev.Kind {
	case selection.BookingEndSet:
		m.estimated.WithLabelValues(ev.Model, "estimate").Observe(ev.Estimated)
	case selection.BookingEndedByEstimate:
		how := "estimated_end"
		switch {
		case ev.Unseen:
			how = "first_token_unseen"
		case ev.UnseenBlock:
			how = "output_block_unseen"
		}
		m.ended.WithLabelValues(ev.Model, how).Inc()
	case selection.BookingEndedByEngine:
		m.ended.WithLabelValues(ev.Model, "engine_counts").Inc()
	case selection.BookingFirstTokenSeen:
		m.firstErr.WithLabelValues(ev.Model).Observe(ev.Estimated - ev.Actual)
	case selection.BookingDecodeSeen:
		m.decoded.WithLabelValues(ev.Model).Inc()
	case selection.BookingEndSeen:
		m.estimated.WithLabelValues(ev.Model, "seen").Observe(ev.Estimated)
		m.actual.WithLabelValues(ev.Model).Observe(ev.Actual)
		m.relErr.WithLabelValues(ev.Model).Observe((ev.Estimated - ev.Actual) / max(ev.Actual, 1e-3))
	}
}

// Describe implements prometheus.Collector.
func (m *bookingEndMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.estimated.Describe(ch)
	m.actual.Describe(ch)
	m.relErr.Describe(ch)
	m.ended.Describe(ch)
	m.firstErr.Describe(ch)
	m.decoded.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *bookingEndMetrics) Collect(ch chan<- prometheus.Metric) {
	m.estimated.Collect(ch)
	m.actual.Collect(ch)
	m.relErr.Collect(ch)
	m.ended.Collect(ch)
	m.firstErr.Collect(ch)
	m.decoded.Collect(ch)
}
