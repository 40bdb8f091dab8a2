package demo

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/promtext"
)

const (
	// inFlightEvery is how often a picker phase compares kvselect's
	// bookings with the client's requests in flight.
	inFlightEvery = 50 * time.Millisecond
	// settleLimit is how long after a picker phase's last response its
	// bookings may take to end: on NGF's path kvselect ends them at an
	// estimated end, which can trail the real one.
	settleLimit = 10 * time.Second
)

// InFlight is how well kvselect's bookings (GET /loads, summed active
// requests) tracked the requests in flight over a phase, against two
// references: the client's requests (send to last byte) and the requests
// the engines hold (running and waiting). The client's count includes what
// no picker can book — the gateway's work before the decision, the last
// bytes after the engine's — so the engines' is the load the picker models.
type InFlight struct {
	Samples int `json:"samples"`
	// Client compares the bookings with the client's requests in flight,
	// Engines with the engines' (nil when they were not read).
	Client  Tracking  `json:"client"`
	Engines *Tracking `json:"engines,omitempty"`
	// Span compares the bookings with the span from the engines' count to
	// the client's (nil without the engines'): a request between the two
	// is in the gateway, before the decision (the client counts it, the
	// picker cannot) or after it (booked, not at its engine yet). Behind a
	// gateway that queues, the two references part and the bookings sit
	// between them.
	Span *Tracking `json:"span,omitempty"`
	// BookingsLeft is what kvselect still held settleLimit after the last
	// response (or sooner, once none was left); DrainMs is how long it
	// waited for that.
	BookingsLeft uint64  `json:"bookings_left"`
	DrainMs      float64 `json:"drain_ms"`
	// ClientLifetimeMs is the client's mean request lifetime (send to last
	// byte); EstimatedLifetimeMs kvselect's mean estimated lifetime of the
	// phase's bookings (decision to estimated end: those it kept to one,
	// else what it would have estimated for those whose end it saw), and
	// BookedLifetimeMs the mean decision-to-free of those it saw end (0:
	// none seen).
	ClientLifetimeMs    float64 `json:"client_lifetime_mean_ms"`
	EstimatedLifetimeMs float64 `json:"estimated_lifetime_mean_ms"`
	BookedLifetimeMs    float64 `json:"booked_lifetime_mean_ms,omitempty"`
	// EndedBy counts the bookings kvselect kept to an estimated end and
	// freed, by how (kvselect_bookings_ended_by_estimate_total);
	// FirstTokensSeen those whose first token their engine's KV events
	// showed.
	EndedBy         map[string]float64 `json:"ended_by,omitempty"`
	FirstTokensSeen float64            `json:"first_tokens_seen,omitempty"`
}

// Tracking compares the booking count with one reference count, read just
// before and just after each GET /loads: a sample is within ±1 when the
// bookings are within 1 of the range the two reads span.
type Tracking struct {
	Within1 float64 `json:"share_within_1"`
	// MeanAbsError is the mean distance from that range, in requests;
	// MeanError the same signed (positive: kvselect counted more); Mean
	// the reference's mean.
	MeanAbsError float64 `json:"mean_abs_error"`
	MeanError    float64 `json:"mean_error"`
	Mean         float64 `json:"mean"`

	within             int
	abs, signed, total float64
}

// add is one sample: booked against a reference read as a then b.
func (t *Tracking) add(booked, a, b float64) {
	lo, hi := min(a, b), max(a, b)
	d := 0.0
	switch {
	case booked < lo:
		d = lo - booked
		t.signed -= d
	case booked > hi:
		d = booked - hi
		t.signed += d
	}
	if d <= 1 {
		t.within++
	}
	t.abs += d
	t.total += (a + b) / 2
}

// finish turns n samples' sums into shares and means.
func (t *Tracking) finish(n int) {
	if n == 0 {
		return
	}
	f := float64(n)
	t.Within1, t.MeanAbsError, t.MeanError, t.Mean = float64(t.within)/f, t.abs/f, t.signed/f, t.total/f
}

// The booking-end metrics lifetimes reads.
const (
	estimatedLifetimes = "kvselect_booking_estimated_lifetime_seconds"
	seenLifetimes      = "kvselect_booking_lifetime_seconds"
	endedByEstimate    = "kvselect_bookings_ended_by_estimate_total"
	firstTokenErrors   = "kvselect_booking_first_token_error_seconds"
)

// lifetimes fills the estimated and booked lifetimes from the phase's change
// in kvselect's metrics.
func (f *InFlight) lifetimes(delta promtext.Samples) {
	mean := func(s promtext.Samples, name string) float64 {
		if n := s.Sum(name + "_count"); n > 0 {
			return s.Sum(name+"_sum") / n * 1e3
		}
		return 0
	}
	if f.EstimatedLifetimeMs = mean(delta.Where("end", "estimate"), estimatedLifetimes); f.EstimatedLifetimeMs == 0 {
		f.EstimatedLifetimeMs = mean(delta.Where("end", "seen"), estimatedLifetimes)
	}
	f.BookedLifetimeMs = mean(delta, seenLifetimes)
	if by := delta.ByLabel(endedByEstimate, "how"); len(by) > 0 {
		f.EndedBy = by
	}
	f.FirstTokensSeen = delta.Sum(firstTokenErrors + "_count")
}

// sampleInFlight compares kvselect's bookings with *client and, when
// engines is set, with the requests the engines hold, every `every` until
// stop closes.
func sampleInFlight(ctx context.Context, kv *fleet.KVSelect, client *atomic.Int64, engines func(context.Context) (float64, error),
	every time.Duration, stop <-chan struct{}) *InFlight {
	out := &InFlight{}
	var eng, span Tracking
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			out.Client.finish(out.Samples)
			if engines != nil {
				eng.finish(out.Samples)
				span.finish(out.Samples)
				out.Engines, out.Span = &eng, &span
			}
			return out
		case <-tick.C:
			var e0, e1 float64
			var err error
			if engines != nil {
				if e0, err = engines(ctx); err != nil {
					continue
				}
			}
			c0 := client.Load()
			booked, err := kv.ActiveRequests(ctx)
			c1 := client.Load()
			if err != nil {
				continue
			}
			if engines != nil {
				if e1, err = engines(ctx); err != nil {
					continue
				}
				eng.add(float64(booked), e0, e1)
				span.add(float64(booked), min(e0, e1, float64(c0), float64(c1)), max(e0, e1, float64(c0), float64(c1)))
			}
			out.Samples++
			out.Client.add(float64(booked), float64(c0), float64(c1))
		}
	}
}

// GatewayGoals compares the NGINX path with envoysim's against the goals
// kvselect holds a gateway path to: hit rate and p90 TTFT within 5 % (no
// more than 5 % lower, no more than 5 % slower), at
// least 95 % of in-flight samples within ±1 and no booking left, and at
// most twice envoysim's CPU per request.
type GatewayGoals struct {
	HitRateDelta    float64 `json:"hit_rate_rel_delta"` // NGINX's / envoysim's - 1
	TTFTP90Delta    float64 `json:"ttft_p90_rel_delta"`
	CPURatio        float64 `json:"cpu_per_request_ratio"`    // NGINX's / envoysim's
	InFlightWithin1 float64 `json:"in_flight_share_within_1"` // against the engines' requests when read, else the client's
	BookingsLeft    uint64  `json:"bookings_left"`
	HitRateMet      bool    `json:"hit_rate_within_5pct"`
	TTFTMet         bool    `json:"ttft_p90_within_5pct"`
	InFlightMet     bool    `json:"in_flight_goal_met"`
	CPUMet          bool    `json:"cpu_goal_met"`
	// Path is the gap between the two kvselect phases in milliseconds, and
	// TTFTAllowanceMs what the p90 goal allows: 5 % of envoysim's p90.
	Path            PathCost `json:"path"`
	TTFTAllowanceMs float64  `json:"ttft_p90_allowance_ms"`
	// Floor is the same gap with the floor picker in kvselect's place
	// (-gateway-floor; nil without its phases): what the gateway's path
	// costs a picker that does nothing, none of which a picker can take
	// back.
	Floor *PathCost `json:"floor,omitempty"`
}

// PathCost is what a gateway's path added to a picker's phase, against the
// same picker reached through envoysim in the same run.
type PathCost struct {
	TTFTP50GapMs float64 `json:"ttft_p50_gap_ms"` // NGINX's - envoysim's
	TTFTP90GapMs float64 `json:"ttft_p90_gap_ms"`
	TTFTP90Delta float64 `json:"ttft_p90_rel_delta"` // NGINX's / envoysim's - 1
}

// Goal thresholds.
const (
	goalRelDelta = 0.05
	goalWithin1  = 0.95
	goalCPURatio = 2
)

// compareGateway is kvselect's NGINX phase against its envoysim phase, and
// the floor's two phases likewise when they ran; nil without kvselect's.
func compareGateway(phases []Phase) *GatewayGoals {
	byPolicy := make(map[string]*Phase, len(phases))
	for i := range phases {
		byPolicy[phases[i].Policy] = &phases[i]
	}
	env, gw := byPolicy[PolicyKVSelect], byPolicy[PolicyKVSelectNGINX]
	if env == nil || gw == nil {
		return nil
	}
	g := &GatewayGoals{HitRateDelta: relDelta(gw.HitRate, env.HitRate), Path: pathCost(env, gw), TTFTAllowanceMs: goalRelDelta * env.TTFTP90Ms}
	g.TTFTP90Delta = g.Path.TTFTP90Delta
	if env, gw := byPolicy[PolicyFloor], byPolicy[PolicyFloorNGINX]; env != nil && gw != nil {
		f := pathCost(env, gw)
		g.Floor = &f
	}
	if env.CPUPerRequestUs > 0 {
		g.CPURatio = gw.CPUPerRequestUs / env.CPUPerRequestUs
	}
	if f := gw.InFlight; f != nil {
		g.InFlightWithin1, g.BookingsLeft = f.Client.Within1, f.BookingsLeft
		if f.Engines != nil {
			g.InFlightWithin1 = f.Engines.Within1
		}
	}
	// One-sided: the goal is that the gateway costs routing quality at
	// most 5 %, so only a lower hit rate or a slower p90 misses it (a
	// better one is run-to-run spread, not a cost).
	g.HitRateMet = g.HitRateDelta >= -goalRelDelta
	g.TTFTMet = g.TTFTP90Delta <= goalRelDelta
	g.InFlightMet = g.InFlightWithin1 >= goalWithin1 && g.BookingsLeft == 0
	g.CPUMet = g.CPURatio > 0 && g.CPURatio <= goalCPURatio
	return g
}

// pathCost is what the gateway's phase gw added to the TTFT of env, the
// same picker's phase through envoysim.
func pathCost(env, gw *Phase) PathCost {
	return PathCost{TTFTP50GapMs: gw.TTFTP50Ms - env.TTFTP50Ms, TTFTP90GapMs: gw.TTFTP90Ms - env.TTFTP90Ms,
		TTFTP90Delta: relDelta(gw.TTFTP90Ms, env.TTFTP90Ms)}
}

// relDelta is a/b - 1. JSON has no NaN: a zero base (no hits, no TTFT)
// reads as no change when both are zero and as +100 % otherwise.
func relDelta(a, b float64) float64 {
	switch {
	case b != 0:
		return a/b - 1
	case a == 0:
		return 0
	}
	return 1
}
