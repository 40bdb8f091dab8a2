package demo

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
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
// requests) tracked the requests the client had in flight over a phase.
type InFlight struct {
	Samples int `json:"samples"`
	// Within1 is the share of samples whose booking count was within ±1
	// of the client's count: the client's count is read just before and
	// just after each GET /loads, and a sample is within when kvselect's
	// count is within 1 of the range the two span.
	Within1 float64 `json:"share_within_1"`
	// MeanAbsError is the mean distance from that range, in requests.
	MeanAbsError float64 `json:"mean_abs_error"`
	MeanClient   float64 `json:"mean_client_in_flight"`
	// BookingsLeft is what kvselect still held settleLimit after the last
	// response (or sooner, once none was left); DrainMs is how long it
	// waited for that.
	BookingsLeft uint64  `json:"bookings_left"`
	DrainMs      float64 `json:"drain_ms"`
}

// sampleInFlight compares kvselect's bookings with *client every `every`
// until stop closes.
func sampleInFlight(ctx context.Context, kv *fleet.KVSelect, client *atomic.Int64, every time.Duration, stop <-chan struct{}) *InFlight {
	out := &InFlight{}
	var within int
	var absErr, clientSum float64
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			if out.Samples > 0 {
				n := float64(out.Samples)
				out.Within1, out.MeanAbsError, out.MeanClient = float64(within)/n, absErr/n, clientSum/n
			}
			return out
		case <-tick.C:
			before := client.Load()
			booked, err := kv.ActiveRequests(ctx)
			after := client.Load()
			if err != nil {
				continue
			}
			lo, hi := min(before, after), max(before, after)
			d := distance(int64(booked), lo, hi)
			out.Samples++
			if d <= 1 {
				within++
			}
			absErr += float64(d)
			clientSum += float64(before+after) / 2
		}
	}
}

// distance is how far n lies outside [lo, hi].
func distance(n, lo, hi int64) int64 {
	switch {
	case n < lo:
		return lo - n
	case n > hi:
		return n - hi
	}
	return 0
}

// GatewayGoals compares the NGINX path with envoysim's against the goals
// kvselect holds a gateway path to: hit rate and p90 TTFT within 5 % (no
// more than 5 % lower, no more than 5 % slower), at
// least 95 % of in-flight samples within ±1 and no booking left, and at
// most twice envoysim's CPU per request.
type GatewayGoals struct {
	HitRateDelta    float64 `json:"hit_rate_rel_delta"` // NGINX's / envoysim's - 1
	TTFTP90Delta    float64 `json:"ttft_p90_rel_delta"`
	CPURatio        float64 `json:"cpu_per_request_ratio"` // NGINX's / envoysim's
	InFlightWithin1 float64 `json:"in_flight_share_within_1"`
	BookingsLeft    uint64  `json:"bookings_left"`
	HitRateMet      bool    `json:"hit_rate_within_5pct"`
	TTFTMet         bool    `json:"ttft_p90_within_5pct"`
	InFlightMet     bool    `json:"in_flight_goal_met"`
	CPUMet          bool    `json:"cpu_goal_met"`
}

// Goal thresholds.
const (
	goalRelDelta = 0.05
	goalWithin1  = 0.95
	goalCPURatio = 2
)

// compareGateway is the NGINX phase against envoysim's, nil without both.
func compareGateway(phases []Phase) *GatewayGoals {
	var env, gw *Phase
	for i := range phases {
		switch phases[i].Path {
		case PathEnvoysim:
			env = &phases[i]
		case PathNGINX:
			gw = &phases[i]
		}
	}
	if env == nil || gw == nil {
		return nil
	}
	// JSON has no NaN: a zero base (no hits, no TTFT) reads as no change
	// when both are zero and as +100 % otherwise.
	rel := func(a, b float64) float64 {
		switch {
		case b != 0:
			return a/b - 1
		case a == 0:
			return 0
		}
		return 1
	}
	g := &GatewayGoals{HitRateDelta: rel(gw.HitRate, env.HitRate), TTFTP90Delta: rel(gw.TTFTP90Ms, env.TTFTP90Ms)}
	if env.CPUPerRequestUs > 0 {
		g.CPURatio = gw.CPUPerRequestUs / env.CPUPerRequestUs
	}
	if gw.InFlight != nil {
		g.InFlightWithin1, g.BookingsLeft = gw.InFlight.Within1, gw.InFlight.BookingsLeft
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
